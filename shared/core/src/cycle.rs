//! One scheduling cycle: recovery, admission, quota, placement, in order.
//!
//! Owns: the order of the stages. Its limits, stats and scan memo are in
//! `limits`. `run_cycle` applies each stage's decisions before the next
//! stage decides, as the services do through the log; the simulator and the
//! embedded mode call it directly.
//!
//! Must never: read a clock or scan a whole queue. Elapsed time is measured
//! by the caller.

use crate::limits::{CycleConfig, CycleStats, ScanMemo};
use crate::state::{ApplyError, State};
use crate::{admission, placement, preemption, quota, recovery};
use gpusched_events::Event;
use gpusched_model::Timestamp;

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

/// `decide`, between the clock's `begin` and `end` of `stage`.
fn timed<T>(clock: &mut dyn StageClock, stage: Stage, decide: impl FnOnce() -> T) -> T {
    clock.begin(stage);
    let decided = decide();
    clock.end(stage);
    decided
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
    let requeues = timed(clock, Stage::Recovery, || recovery::decide(state, now));
    out.stats.requeued = requeues.len() as u64;
    apply_all(state, &requeues, &mut out.events)?;

    let (stops, stats) = timed(clock, Stage::Preemption, || {
        preemption::decide(state, memo, cfg, now)
    });
    out.stats.preemption = stats;
    apply_all(state, &stops, &mut out.events)?;

    let validations = timed(clock, Stage::Admission, || {
        admission::decide(state, cfg.max_validations, now)
    });
    out.stats.validated = validations.len() as u64;
    apply_all(state, &validations, &mut out.events)?;

    let (admissions, stats) = timed(clock, Stage::Quota, || quota::decide(state, memo, cfg, now));
    out.stats.quota = stats;
    apply_all(state, &admissions, &mut out.events)?;

    let (bindings, stats) = timed(clock, Stage::Placement, || {
        placement::decide(state, memo, cfg, now)
    });
    out.stats.placement = stats;
    apply_all(state, &bindings, &mut out.events)?;
    out.stats.decisions = out.events.len() as u64;
    Ok(out)
}
