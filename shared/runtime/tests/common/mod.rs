//! Helpers for the runtime's integration tests: (`stage`) a deciding
//! service's workload over the embedded log, and [`Timings`], a record of
//! how long calls took against what they were allowed. (A private
//! nats-server to kill: `gpusched_bus::testing::NatsServer`.)
#![allow(dead_code, clippy::unwrap_used, missing_docs)]

pub mod stage;

use std::time::Duration;

/// How long calls took against what each was allowed.
#[derive(Debug, Default)]
pub struct Timings {
    pub calls: u64,
    /// Calls that took longer than allowed + slack: (allowed, took).
    pub overruns: Vec<(Duration, Duration)>,
    /// The most any call took beyond what it was allowed.
    pub max_excess: Duration,
}

impl Timings {
    /// Records a call allowed `allowed` that took `took`.
    pub fn record(&mut self, allowed: Duration, took: Duration, slack: Duration) {
        self.calls += 1;
        self.max_excess = self.max_excess.max(took.saturating_sub(allowed));
        if took > allowed + slack {
            self.overruns.push((allowed, took));
        }
    }
}
