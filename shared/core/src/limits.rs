//! What bounds a scheduling cycle and what a cycle remembers for the next:
//! the limits (`CycleConfig`, with the preemption stage's
//! `PreemptionConfig` and `VictimOrder`), what it scanned (`CycleStats`,
//! with each stage's own) and the scan memo (`ScanMemo`, with the
//! preemption search's `SearchStamp`).
//!
//! Owns: these plain data types, so that the cycle and every stage it runs
//! (quota, placement, preemption) read them from here and none imports
//! another's module for them. Must never: decide anything, or hold state
//! that changes a decision (the memo only spares rescans).

use crate::capacity::FlavorIdx;
use crate::quota_gpus::QuotaGpus;
use crate::state::{QueueKey, TenantIdx};
use gpusched_model::{JobId, Timestamp};
use rustc_hash::FxHashMap;

/// Limits of one cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CycleConfig {
    /// R: blocked jobs that hold a reservation at once (0: no reservations
    /// and no backfill).
    pub reservations: usize,
    /// Domains probed when planning one reservation.
    pub reservation_domains: usize,
    /// Victim choice limits and costs.
    pub preemption: PreemptionConfig,
    /// K: queue heads the quota stage examines, and admitted jobs the
    /// placement stage examines, per cycle.
    pub max_heads: usize,
    /// How deep a best-effort queue (or one flavor's placement queue) is
    /// searched in one cycle.
    pub max_heads_per_tenant: usize,
    /// Submissions validated per cycle.
    pub max_validations: usize,
    /// A best-effort queue stops letting jobs pass a head blocked for quota
    /// once that head has waited this long since submission, so small jobs
    /// cannot starve it (0: never), ms.
    pub starvation_ms: u64,
}

impl Default for CycleConfig {
    fn default() -> Self {
        CycleConfig {
            reservations: 4,
            reservation_domains: 16,
            preemption: PreemptionConfig::default(),
            max_heads: 256,
            max_heads_per_tenant: 64,
            max_validations: 4096,
            starvation_ms: 3_600_000,
        }
    }
}

/// What a cycle scanned and decided: its own counts, and each stage's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CycleStats {
    /// Submissions validated.
    pub validated: u64,
    /// Jobs requeued from lost nodes.
    pub requeued: u64,
    /// Decision events emitted.
    pub decisions: u64,
    /// What the preemption stage did.
    pub preemption: PreemptionStats,
    /// What the quota stage looked at.
    pub quota: QuotaStats,
    /// What the placement stage looked at.
    pub placement: PlacementStats,
}

impl CycleStats {
    /// Heads examined in both stages.
    pub fn heads_examined(&self) -> u64 {
        self.quota.heads_examined + self.placement.heads_examined
    }
}

/// What a preemption pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreemptionStats {
    /// Beneficiaries examined.
    pub beneficiaries: u64,
    /// Candidate victims looked at.
    pub candidates: u64,
    /// Victim sets costed (the most for one beneficiary).
    pub max_sets_costed: u64,
    /// Preemptions planned.
    pub planned: u64,
    /// Victims stopped.
    pub preempted: u64,
}

/// What a quota pass looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaStats {
    /// Queue heads examined.
    pub heads_examined: u64,
    /// Jobs admitted.
    pub admitted: u64,
    /// Tenants skipped because nothing changed since they were blocked.
    pub tenants_skipped: u64,
}

/// What a placement pass looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlacementStats {
    /// Admitted jobs examined.
    pub heads_examined: u64,
    /// Domains probed for room.
    pub domains_probed: u64,
    /// Jobs bound.
    pub bound: u64,
    /// Reservations made or re-planned.
    pub reservations: u64,
    /// Jobs backfilled onto reserved nodes.
    pub backfilled: u64,
}

/// What earlier cycles found blocked, valid while the stamps hold. A pure
/// cache: dropping it changes how much a cycle rescans, never what may be
/// decided about a job it looks at.
#[derive(Clone, Debug, Default)]
pub struct ScanMemo {
    /// Tenant → (tenant version, cohort version) when its queue was blocked.
    pub tenant_blocked: FxHashMap<TenantIdx, (u64, u64)>,
    /// Tenant → where its last best-effort pass stopped at the depth bound
    /// (`max_heads_per_tenant`) with jobs still behind it: the next pass
    /// goes on from there instead of rescanning the heads it already found
    /// blocked, so every job of a deep queue is looked at in turn.
    pub tenant_resume: FxHashMap<TenantIdx, TenantResume>,
    /// Flavor → (capacity version, reservations held, and the placement
    /// version when a stale reservation's re-plan was skipped there) when
    /// nothing more could be placed: a reservation released anywhere frees
    /// a slot of the shared reservation budget.
    pub flavor_blocked: FxHashMap<FlavorIdx, (u64, usize, Option<u64>)>,
    /// Beneficiary → what its search depended on when no victim set could
    /// be found.
    pub preempt_failed: FxHashMap<JobId, SearchStamp>,
    /// Owner of a stale reservation → (flavor, capacity version, placement
    /// version) when a re-plan found nothing better, made before the pass
    /// had taken anything in the flavor. Until one of them moves the plan
    /// reads the same nodes, free GPUs and guaranteed ends, and the clock
    /// alone only moves a start later, so a re-plan cannot do better.
    pub reservation_checked: FxHashMap<JobId, (FlavorIdx, u64, u64)>,
}

/// Where a best-effort tenant's pass was cut by the depth bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantResume {
    /// (tenant version, cohort version) when it was cut: a job queued,
    /// requeued or cancelled, quota released, or a reconfiguration of the
    /// tenant or its cohort starts again from the head (an admission does
    /// not: it only leaves less room for the jobs passed over).
    pub stamp: (u64, u64),
    /// The last job looked at; the next pass starts after it.
    pub after: QueueKey,
    /// The oldest submit time among the blocked jobs passed over since the
    /// head: once it has waited past the starvation window, that job holds
    /// the queue, so the next pass starts from the head again.
    pub oldest_passed: Timestamp,
}

/// How victims are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum VictimOrder {
    /// Least cost (work lost since the last complete checkpoint) first.
    #[default]
    Checkpoint,
    /// Kueue's documented order: lower priority first, then most recently
    /// admitted first; remove greedily until it fits, then add back.
    Kueue,
}

/// Limits and costs of preemption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptionConfig {
    /// Grace a victim gets before it is stopped, ms.
    pub grace_ms: u64,
    /// A checkpointable victim whose checkpoint takes at most this long gets
    /// the time to complete one (its checkpoint duration + 5 s), ms.
    pub max_checkpoint_grace_ms: u64,
    /// Cost of restarting, per GPU, ms.
    pub restart_cost_ms: u64,
    /// A victim preempted within this window costs `thrash_penalty_ms` more per GPU.
    pub thrash_window_ms: u64,
    /// Extra cost per GPU of preempting a recently preempted job, ms.
    pub thrash_penalty_ms: u64,
    /// A job runs at least this long before it may be preempted, ms.
    pub min_runtime_ms: u64,
    /// W: a victim whose next checkpoint completes within this window may
    /// be stopped right after it instead of now, when that costs less.
    pub wait_window_ms: u64,
    /// M: victim sets costed per beneficiary.
    pub max_sets: usize,
    /// Candidate victims looked at per beneficiary.
    pub max_candidates: usize,
    /// Beneficiaries examined per cycle.
    pub max_beneficiaries: usize,
    /// Candidate victims looked at per cycle, over all beneficiaries: the
    /// stage takes no further beneficiary once this many were looked at.
    pub max_cycle_candidates: usize,
    /// Victim ordering.
    pub order: VictimOrder,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        PreemptionConfig {
            grace_ms: 30_000,
            max_checkpoint_grace_ms: 300_000,
            restart_cost_ms: 60_000,
            thrash_window_ms: 3_600_000,
            thrash_penalty_ms: 600_000,
            min_runtime_ms: 60_000,
            wait_window_ms: 30_000,
            max_sets: 16,
            max_candidates: 512,
            max_beneficiaries: 1024,
            max_cycle_candidates: 16_384,
            order: VictimOrder::Checkpoint,
        }
    }
}

/// What a failed victim search depended on: while none of it changes,
/// the search would fail again. Running jobs (new candidates), the
/// flavor's capacity and the cohort's and tenant's releases (more room or
/// quota), and what the beneficiary needs (its quota deficit and flavor
/// change when it is admitted or others' usage moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchStamp {
    pub(crate) running: u64,
    pub(crate) capacity: u64,
    pub(crate) cohort: u64,
    pub(crate) tenant: u64,
    pub(crate) flavor: FlavorIdx,
    pub(crate) quota: QuotaGpus,
}
