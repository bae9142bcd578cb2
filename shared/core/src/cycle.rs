//! One scheduling cycle: recovery, admission, quota, placement, in order.
//!
//! Owns: the cycle's limits (`CycleConfig`), what it scanned (`CycleStats`)
//! and the scan memo that lets a cycle skip tenants and flavors nothing has
//! changed for. `run_cycle` applies each stage's decisions before the next
//! stage decides, as the services do through the log; the simulator and the
//! embedded mode call it directly.
//!
//! Must never: read a clock or scan a whole queue. Elapsed time is measured
//! by the caller.

use crate::capacity::FlavorIdx;
use crate::preemption::PreemptionConfig;
use crate::state::{ApplyError, State, TenantIdx};
use crate::{admission, placement, preemption, quota, recovery};
use gpusched_events::Event;
use gpusched_model::JobId;
use gpusched_model::Timestamp;
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

/// What a cycle scanned and decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CycleStats {
    /// Submissions validated.
    pub validated: u64,
    /// Queue heads examined by the quota stage.
    pub quota_heads: u64,
    /// Admitted jobs examined by the placement stage.
    pub placement_heads: u64,
    /// Topology domains probed.
    pub domains_probed: u64,
    /// Tenants skipped as unchanged since blocked.
    pub tenants_skipped: u64,
    /// Jobs admitted.
    pub admitted: u64,
    /// Jobs bound.
    pub bound: u64,
    /// Jobs requeued from lost nodes.
    pub requeued: u64,
    /// Decision events emitted.
    pub decisions: u64,
    /// Preemption: beneficiaries examined.
    pub beneficiaries: u64,
    /// Preemption: most victim sets costed for one beneficiary.
    pub victim_sets_costed: u64,
    /// Preemption: candidate victims looked at.
    pub victim_candidates: u64,
    /// Preemptions planned.
    pub preemptions_planned: u64,
    /// Victims stopped.
    pub preempted: u64,
    /// Reservations made or re-planned.
    pub reservations_made: u64,
    /// Jobs backfilled onto reserved nodes.
    pub backfilled: u64,
}

impl CycleStats {
    /// Heads examined in both stages.
    pub fn heads_examined(&self) -> u64 {
        self.quota_heads + self.placement_heads
    }
}

/// What earlier cycles found blocked, valid while the stamps hold. A pure
/// cache: dropping it changes how much a cycle rescans, never what may be
/// decided about a job it looks at.
#[derive(Clone, Debug, Default)]
pub struct ScanMemo {
    /// Tenant → (tenant version, cohort version) when its queue was blocked.
    pub tenant_blocked: FxHashMap<TenantIdx, (u64, u64)>,
    /// Flavor → (capacity version, reservations held) when nothing more
    /// could be placed: a reservation released anywhere frees a slot of
    /// the shared reservation budget.
    pub flavor_blocked: FxHashMap<FlavorIdx, (u64, usize)>,
    /// Beneficiary → what its search depended on when no victim set could
    /// be found.
    pub preempt_failed: FxHashMap<JobId, preemption::SearchStamp>,
}

/// The events a cycle decided, in the order applied, and its stats.
#[derive(Clone, Debug, Default)]
pub struct CycleOutput {
    /// Decisions, already applied to the state.
    pub events: Vec<Event>,
    /// What was scanned.
    pub stats: CycleStats,
}

fn apply_all(state: &mut State, events: &[Event], out: &mut Vec<Event>) -> Result<(), ApplyError> {
    for e in events {
        state.apply(e)?;
    }
    out.extend_from_slice(events);
    Ok(())
}

/// A stage of the cycle, for callers that time them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Requeue jobs of lost nodes.
    Recovery,
    /// Stop victims; plan victims (the bounded victim search).
    Preemption,
    /// Validate submissions.
    Admission,
    /// Admit against quota.
    Quota,
    /// Bind, reserve, backfill.
    Placement,
}

/// Hooks called around each stage. The core never reads a clock; a caller
/// that wants stage timings passes one that does. `()` does nothing.
pub trait StageClock {
    /// A stage begins.
    fn begin(&mut self, _stage: Stage) {}
    /// A stage ends.
    fn end(&mut self, _stage: Stage) {}
}

impl StageClock for () {}

/// Runs every stage once at time `now`, applying each stage's decisions
/// before the next decides. An error means a stage decided something
/// `apply` refuses: a bug, reported rather than applied.
pub fn run_cycle(
    state: &mut State,
    memo: &mut ScanMemo,
    cfg: &CycleConfig,
    now: Timestamp,
) -> Result<CycleOutput, ApplyError> {
    run_cycle_timed(state, memo, cfg, now, &mut ())
}

/// `run_cycle`, calling `clock` around each stage.
pub fn run_cycle_timed(
    state: &mut State,
    memo: &mut ScanMemo,
    cfg: &CycleConfig,
    now: Timestamp,
    clock: &mut dyn StageClock,
) -> Result<CycleOutput, ApplyError> {
    let mut out = CycleOutput::default();
    clock.begin(Stage::Recovery);
    let requeues = recovery::decide(state, now);
    clock.end(Stage::Recovery);
    out.stats.requeued = requeues.len() as u64;
    apply_all(state, &requeues, &mut out.events)?;

    clock.begin(Stage::Preemption);
    let (stops, ps) = preemption::decide(state, memo, cfg, now);
    clock.end(Stage::Preemption);
    out.stats.beneficiaries = ps.beneficiaries;
    out.stats.victim_sets_costed = ps.max_sets_costed;
    out.stats.victim_candidates = ps.candidates;
    out.stats.preemptions_planned = ps.planned;
    out.stats.preempted = ps.preempted;
    apply_all(state, &stops, &mut out.events)?;

    clock.begin(Stage::Admission);
    let validations = admission::decide(state, cfg.max_validations, now);
    clock.end(Stage::Admission);
    out.stats.validated = validations.len() as u64;
    apply_all(state, &validations, &mut out.events)?;

    clock.begin(Stage::Quota);
    let (admissions, qs) = quota::decide(state, memo, cfg, now);
    clock.end(Stage::Quota);
    out.stats.quota_heads = qs.heads_examined;
    out.stats.admitted = qs.admitted;
    out.stats.tenants_skipped = qs.tenants_skipped;
    apply_all(state, &admissions, &mut out.events)?;

    clock.begin(Stage::Placement);
    let (bindings, ps) = placement::decide(state, memo, cfg, now);
    clock.end(Stage::Placement);
    out.stats.placement_heads = ps.heads_examined;
    out.stats.domains_probed = ps.domains_probed;
    out.stats.bound = ps.bound;
    out.stats.reservations_made = ps.reservations;
    out.stats.backfilled = ps.backfilled;
    apply_all(state, &bindings, &mut out.events)?;
    out.stats.decisions = out.events.len() as u64;
    Ok(out)
}
