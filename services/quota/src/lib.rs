//! The quota service: admits queue heads against nominal quota and
//! borrowing limits, in fair-share order, at most K heads a cycle.
//!
//! Owns: `JobAdmitted` and `JobPending` for quota reasons. Must never:
//! bind GPUs or stop a job.

use gpusched_core::{quota, CycleConfig, ScanMemo, State};
use gpusched_events::{Event, Producer};
use gpusched_model::Timestamp;
use gpusched_runtime::{Decider, Work};

/// Lease and consumer name.
pub const SERVICE: &str = "quota";

/// The quota stage as a decider.
#[derive(Debug)]
pub struct QuotaStage {
    cfg: CycleConfig,
    memo: ScanMemo,
    /// What the last decide looked at.
    work: Work,
}

impl QuotaStage {
    /// A stage with these limits.
    pub fn new(cfg: CycleConfig) -> Self {
        QuotaStage {
            cfg,
            memo: ScanMemo::default(),
            work: Work::default(),
        }
    }
}

impl Decider for QuotaStage {
    fn work(&self) -> Work {
        self.work
    }

    fn producer(&self) -> Producer {
        Producer::Quota
    }

    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        let (events, st) = quota::decide(state, &mut self.memo, &self.cfg, now);
        self.work = Work {
            heads: st.heads_examined,
            ..Work::default()
        };
        events
    }
}
