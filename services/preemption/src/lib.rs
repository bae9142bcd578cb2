//! The preemption service: requeues the jobs of lost nodes, plans victims
//! for reclaims and priority (bounded search, checkpoint-aware cost), and
//! stops victims once they checkpointed or their grace ran out.
//!
//! Owns: `JobRequeued`, `PreemptionPlanned` and `JobPreempted`. Must
//! never: admit or bind the beneficiary itself.

use gpusched_core::{preemption, recovery, CycleConfig, ScanMemo, State};
use gpusched_events::{Event, Producer};
use gpusched_model::Timestamp;
use gpusched_runtime::{Decider, Work};

/// Lease and consumer name.
pub const SERVICE: &str = "preemption";

/// The recovery and preemption stages as a decider.
#[derive(Debug)]
pub struct PreemptionStage {
    cfg: CycleConfig,
    memo: ScanMemo,
    /// What the last decide looked at.
    work: Work,
}

impl PreemptionStage {
    /// A stage with these limits.
    pub fn new(cfg: CycleConfig) -> Self {
        PreemptionStage {
            cfg,
            memo: ScanMemo::default(),
            work: Work::default(),
        }
    }
}

impl Decider for PreemptionStage {
    fn work(&self) -> Work {
        self.work
    }

    fn producer(&self) -> Producer {
        Producer::Preemption
    }

    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        // Requeues first; victims are planned on the next cycle, over the
        // state those requeues made.
        let requeues = recovery::decide(state, now);
        if !requeues.is_empty() {
            self.work = Work::default();
            return requeues;
        }
        let (events, st) = preemption::decide(state, &mut self.memo, &self.cfg, now);
        self.work = Work {
            victim_sets: st.max_sets_costed,
            victim_candidates: st.candidates,
            ..Work::default()
        };
        events
    }
}
