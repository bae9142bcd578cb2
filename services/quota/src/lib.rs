//! The quota service: admits queue heads against nominal quota and
//! borrowing limits, in fair-share order, at most K heads a cycle.
//!
//! Owns: `JobAdmitted` and `JobPending` for quota reasons. Must never:
//! bind GPUs or stop a job.

use gpusched_core::{quota, CycleConfig, ScanMemo, State};
use gpusched_events::{Event, Producer};
use gpusched_model::Timestamp;
use gpusched_runtime::Decider;

/// Lease and consumer name.
pub const SERVICE: &str = "quota";

/// The quota stage as a decider.
#[derive(Debug)]
pub struct QuotaStage {
    cfg: CycleConfig,
    memo: ScanMemo,
}

impl QuotaStage {
    /// A stage with these limits.
    pub fn new(cfg: CycleConfig) -> Self {
        QuotaStage {
            cfg,
            memo: ScanMemo::default(),
        }
    }
}

impl Decider for QuotaStage {
    fn producer(&self) -> Producer {
        Producer::Quota
    }

    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        quota::decide(state, &mut self.memo, &self.cfg, now).0
    }
}
