//! The placement service: binds admitted gangs all-or-nothing inside one
//! domain of the level they ask for, keeps reservations for blocked large
//! jobs and backfills around them.
//!
//! Owns: `JobBound`, `ReservationMade` and `JobPending` for capacity.
//! Must never: admit against quota or stop a job.

use gpusched_core::{placement, CycleConfig, ScanMemo, State};
use gpusched_events::{Event, Producer};
use gpusched_model::Timestamp;
use gpusched_runtime::{Decider, Work};

/// Lease and consumer name.
pub const SERVICE: &str = "placement";

/// The placement stage as a decider.
#[derive(Debug)]
pub struct PlacementStage {
    cfg: CycleConfig,
    memo: ScanMemo,
    /// What the last decide looked at.
    work: Work,
}

impl PlacementStage {
    /// A stage with these limits.
    pub fn new(cfg: CycleConfig) -> Self {
        PlacementStage {
            cfg,
            memo: ScanMemo::default(),
            work: Work::default(),
        }
    }
}

impl Decider for PlacementStage {
    fn work(&self) -> Work {
        self.work
    }

    fn producer(&self) -> Producer {
        Producer::Placement
    }

    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        let (events, st) = placement::decide(state, &mut self.memo, &self.cfg, now);
        self.work = Work {
            heads: st.heads_examined,
            domains_probed: st.domains_probed,
            ..Work::default()
        };
        events
    }
}
