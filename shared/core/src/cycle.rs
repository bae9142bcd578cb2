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
use crate::state::{ApplyError, State, TenantIdx};
use crate::{admission, placement, quota, recovery};
use gpusched_events::Event;
use gpusched_model::Timestamp;
use rustc_hash::FxHashMap;

/// Limits of one cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CycleConfig {
    /// K: queue heads the quota stage examines, and admitted jobs the
    /// placement stage examines, per cycle.
    pub max_heads: usize,
    /// How deep a best-effort queue (or one flavor's placement queue) is
    /// searched in one cycle.
    pub max_heads_per_tenant: usize,
    /// Submissions validated per cycle.
    pub max_validations: usize,
}

impl Default for CycleConfig {
    fn default() -> Self {
        CycleConfig {
            max_heads: 256,
            max_heads_per_tenant: 64,
            max_validations: 4096,
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
    /// Flavor → capacity version when nothing more could be placed.
    pub flavor_blocked: FxHashMap<FlavorIdx, u64>,
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

/// Runs every stage once at time `now`, applying each stage's decisions
/// before the next decides. An error means a stage decided something
/// `apply` refuses: a bug, reported rather than applied.
pub fn run_cycle(
    state: &mut State,
    memo: &mut ScanMemo,
    cfg: &CycleConfig,
    now: Timestamp,
) -> Result<CycleOutput, ApplyError> {
    let mut out = CycleOutput::default();
    let requeues = recovery::decide(state, now);
    out.stats.requeued = requeues.len() as u64;
    apply_all(state, &requeues, &mut out.events)?;

    let validations = admission::decide(state, cfg.max_validations, now);
    out.stats.validated = validations.len() as u64;
    apply_all(state, &validations, &mut out.events)?;

    let (admissions, qs) = quota::decide(state, memo, cfg, now);
    out.stats.quota_heads = qs.heads_examined;
    out.stats.admitted = qs.admitted;
    out.stats.tenants_skipped = qs.tenants_skipped;
    apply_all(state, &admissions, &mut out.events)?;

    let (bindings, ps) = placement::decide(state, memo, cfg, now);
    out.stats.placement_heads = ps.heads_examined;
    out.stats.domains_probed = ps.domains_probed;
    out.stats.bound = ps.bound;
    apply_all(state, &bindings, &mut out.events)?;
    out.stats.decisions = out.events.len() as u64;
    Ok(out)
}
