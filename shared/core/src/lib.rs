//! gpusched's pure scheduling core.
//!
//! Owns: the scheduler `State` and `State::apply`, the capacity index, and
//! the decisions of each stage as pure functions of the state:
//! `admission` (validate submissions), `quota` (admit in fair-share order),
//! `placement` (bind gangs inside one topology domain), `preemption`
//! (checkpoint-aware victim choice and eviction) and `recovery` (requeue
//! jobs from lost nodes). `cycle` runs them in order for the simulator and
//! the embedded mode; `limits` holds what bounds a cycle and what it
//! remembers for the next (every stage reads it, none imports another);
//! `quota_gpus` is the one type quota arithmetic is done in.
//! Beside them: `explain` (answers for users, from the state and the log),
//! `snapshot` (the state's versioned binary encoding), `tally` (counts
//! over a log for reports) and `goodput` (where every allocated GPU-hour
//! went: useful work, recovery, capacity wait).
//!
//! Must never: perform I/O, read a clock, use randomness, or iterate a hash
//! map where order affects a decision. Time and limits are passed in; the
//! same events in the same order always give the same state.

pub mod admission;
pub mod capacity;
pub mod cycle;
pub mod explain;
pub mod goodput;
pub mod limits;
pub mod placement;
pub mod preemption;
pub mod quota;
pub mod quota_gpus;
pub mod recovery;
pub mod snapshot;
pub mod state;
pub mod tally;

pub use capacity::{CapacityIndex, CapacityOverlay, DomainIdx, FlavorIdx};
pub use cycle::{run_cycle, run_cycle_timed, Stage, StageClock};
pub use goodput::{Account, Goodput, Summary as GoodputSummary, WaitReason};
pub use limits::{CycleConfig, CycleStats, ScanMemo};
pub use limits::{PlacementStats, PreemptionConfig, PreemptionStats, QuotaStats, VictimOrder};
pub use quota_gpus::QuotaGpus;
pub use state::{
    mean_life_ms, worker_nodes, ApplyError, BudgetLedger, DecayedUse, Job, Node, NodeStatus, Phase,
    QueueKey, State, Tenant,
};
pub use tally::{eviction_label, LogTally, ReclaimClock};
