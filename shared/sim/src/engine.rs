//! The discrete-event simulator: the scheduling core in virtual time.
//!
//! Owns: the virtual clock, the agenda of arrivals, completions and node
//! losses, playing the node agents' part (starting bound jobs, reporting
//! completions: success, or failure for a job the workload says fails),
//! and the measurements the report is built from (among them each
//! tenant's GPUs held and backlog over time, for the fair-share section,
//! and each budgeted tenant's quota holds and budget events, for the
//! budgets section).
//!
//! Must never: decide anything the core decides, or read the wall clock for
//! anything but measuring how long cycles take. Same cluster, workload and
//! seed give the same events and the same final state hash.

use crate::cluster::Cluster;
use crate::workload::{Workload, WorkloadKind};
use gpusched_core::state::TenantIdx;
use gpusched_core::{
    run_cycle_timed, ApplyError, CycleConfig, FlavorIdx, Goodput, Phase, QuotaGpus, ReclaimClock,
    ScanMemo, Stage, StageClock, State,
};
use gpusched_events::{
    Event, Outcome, PendingReason, PreemptionCause, RejectReason, RequeueReason,
};
use gpusched_model::{Budget, JobId, Timestamp};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Instant;

/// How to run a simulation.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Cycle limits.
    pub cycle: CycleConfig,
    /// Stop once virtual time passes this.
    pub until: Option<Timestamp>,
    /// Keep every event, to replay it or write it out.
    pub record_events: bool,
    /// How long a resumed run (a job that ran before: preempted, or
    /// requeued after a lost node) takes from its binding to its start:
    /// loading its checkpoint and warming up, ms. 0: it starts at once.
    pub restore_ms: u64,
}

/// What happens next on the agenda.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    /// Workload item by index.
    Workload(usize),
    /// A job's run ends (valid only for the given start count).
    Finish(JobId, u32),
    /// A checkpoint of a run completes, capturing this much progress (ms).
    Checkpoint(JobId, u32, u64),
    /// A resumed run has restored and starts (valid only for the binding
    /// with this admission order).
    Start(JobId, u64),
    /// Nothing but a cycle is due (a preemption deadline).
    Wake,
}

/// Times the preemption stage of each cycle.
#[derive(Default)]
struct VictimClock {
    started: Option<Instant>,
    last_us: u32,
}

impl StageClock for VictimClock {
    fn begin(&mut self, stage: Stage) {
        if stage == Stage::Preemption {
            self.started = Some(Instant::now());
        }
    }
    fn end(&mut self, stage: Stage) {
        if stage == Stage::Preemption {
            if let Some(t) = self.started.take() {
                self.last_us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
            }
        }
    }
}

/// One cycle's measurements.
#[derive(Clone, Copy, Debug, Default)]
pub struct CycleSample {
    /// Wall time of the cycle, microseconds.
    pub elapsed_us: u32,
    /// Heads examined (quota + placement).
    pub heads_examined: u32,
    /// Domains probed.
    pub domains_probed: u32,
    /// Decisions made.
    pub decisions: u32,
    /// Wall time of the preemption stage, microseconds.
    pub victim_us: u32,
    /// Beneficiaries the preemption stage examined.
    pub beneficiaries: u32,
    /// Most victim sets costed for one beneficiary.
    pub victim_sets: u32,
}

/// Progress, reported now and then.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Workload items consumed.
    pub items_done: usize,
    /// Workload items in all.
    pub items_total: usize,
    /// Virtual time.
    pub now: Timestamp,
}

/// Everything measured in a run, for the report.
#[derive(Clone, Debug, Default)]
pub struct Measurements {
    /// Per cycle.
    pub cycles: Vec<CycleSample>,
    /// Events applied in all (configuration included).
    pub events: u64,
    /// Decision events made by the core.
    pub decisions: u64,
    /// ∫ used GPUs dt (GPU·ms).
    pub used_gpu_ms: f64,
    /// ∫ capacity dt (GPU·ms).
    pub capacity_gpu_ms: f64,
    /// ∫ used GPUs dt while some job waited (GPU·ms).
    pub backlog_used_gpu_ms: f64,
    /// ∫ capacity dt while some job waited (GPU·ms).
    pub backlog_capacity_gpu_ms: f64,
    /// Node losses named by the workload that did not match a live node.
    pub unknown_node_losses: u64,
    /// Victims stopped.
    pub preemptions: u64,
    /// GPU·ms of work lost to preemption and node loss.
    pub lost_gpu_ms: u64,
    /// Jobs that were eligible to reclaim, with the time from eligibility
    /// to their start, ms (`gpusched_core::ReclaimClock`).
    pub reclaim_latencies: Vec<(JobId, u64)>,
    /// The clock that measures them.
    pub reclaim_clock: ReclaimClock,
    /// Jobs bound as backfill on reserved nodes.
    pub backfilled: u64,
    /// Reservations made (including re-plans).
    pub reservations: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// After a reclaim's beneficiary was admitted, the quota it left uneven
    /// because jobs are indivisible: (job, text).
    pub reclaim_imbalances: Vec<(JobId, String)>,
    /// Wall time of the whole run, seconds.
    pub wall_s: f64,
    /// Virtual time at the end.
    pub end: Timestamp,
    /// Where every allocated GPU-hour went (`gpusched_core::goodput`).
    pub goodput: Goodput,
    /// What the admins' queue and node operations did.
    pub operations: Operations,
    /// What dependencies and array limits did.
    pub gates: Gates,
    /// Each tenant's GPUs held and backlog, as they changed.
    pub shares: ShareLog,
    /// Budgeted tenants' quota holds and budget events.
    pub budgets: BudgetLog,
}

/// What a job counts as in its tenant's figures now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Demand {
    /// Ended, or not known.
    None,
    /// Waiting for GPUs: submitted, queued or admitted.
    Waiting,
    /// Holding this many GPUs: bound, running or preempting.
    Holding(u64),
}

/// One tenant's figures from some instant on, until its next change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareChange {
    /// From when.
    pub at: Timestamp,
    /// The tenant.
    pub tenant: TenantIdx,
    /// GPUs its jobs hold.
    pub gpus: u64,
    /// Whether a job of it waits for GPUs (submitted, queued or admitted).
    pub backlogged: bool,
}

/// Each tenant's GPUs held and whether it had jobs waiting, recorded as
/// they change (in time order), from the phases the events leave its jobs
/// in: what the report's fair-share section integrates over its windows.
#[derive(Clone, Debug, Default)]
pub struct ShareLog {
    /// Jobs not ended → their tenant and what they count as.
    jobs: FxHashMap<JobId, (TenantIdx, Demand)>,
    /// Per tenant: GPUs held, jobs waiting.
    now: Vec<(u64, u64)>,
    /// Every change, in time order.
    pub changes: Vec<ShareChange>,
}

impl ShareLog {
    /// Notes what `e` (already applied to `state`) left its job as. Within
    /// one cycle the state is already the cycle's end, which is the same
    /// instant.
    fn observe(&mut self, e: &Event, state: &State, now: Timestamp) {
        let Some(id) = e.job() else { return };
        let Some(j) = state.job(id) else { return };
        let Some(t) = j.tenant else { return };
        let demand = match j.phase {
            Phase::Submitted | Phase::Queued | Phase::Admitted => Demand::Waiting,
            p if p.holds_gpus() => Demand::Holding(u64::from(j.spec.total_gpus())),
            _ => Demand::None,
        };
        let old = match demand {
            Demand::None => self.jobs.remove(&id),
            d => self.jobs.insert(id, (t, d)),
        };
        let old = old.map_or(Demand::None, |(_, d)| d);
        if old == demand {
            return;
        }
        let before = self.figures(t);
        self.count(t, old, false);
        self.count(t, demand, true);
        let (gpus, backlogged) = self.figures(t);
        if (gpus, backlogged) != before {
            self.changes.push(ShareChange {
                at: now,
                tenant: t,
                gpus,
                backlogged,
            });
        }
    }

    /// A tenant's GPUs held and whether it has jobs waiting.
    fn figures(&self, t: TenantIdx) -> (u64, bool) {
        let (gpus, waiting) = self.now.get(t as usize).copied().unwrap_or((0, 0));
        (gpus, waiting > 0)
    }

    /// Adds a job's demand to its tenant's figures, or takes it away.
    fn count(&mut self, t: TenantIdx, d: Demand, add: bool) {
        if self.now.len() <= t as usize {
            self.now.resize(t as usize + 1, (0, 0));
        }
        let (gpus, waiting) = &mut self.now[t as usize];
        let (target, n) = match d {
            Demand::None => return,
            Demand::Waiting => (waiting, 1),
            Demand::Holding(g) => (gpus, g),
        };
        if add {
            *target += n;
        } else {
            *target -= n;
        }
    }
}

/// One hold of quota by a job, in a flavor where its tenant has a budget:
/// from its admission to its release (preempted, requeued or ended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaHold {
    /// The job.
    pub job: JobId,
    /// GPUs charged.
    pub gpus: u64,
    /// When it was admitted.
    pub admitted_at: Timestamp,
    /// When it released the quota (`None`: it held it at the end).
    pub released_at: Option<Timestamp>,
}

/// One tenant's budget in one flavor, as the run's events showed it.
#[derive(Clone, Debug)]
pub struct BudgetRecord {
    /// The budget, as last configured.
    pub budget: Budget,
    /// When it was first configured.
    pub since: Timestamp,
    /// Every hold of quota in the flavor by the tenant's jobs, in order of
    /// admission.
    pub holds: Vec<QuotaHold>,
    /// `BudgetSpent` events: (period start, when).
    pub spent: Vec<(Timestamp, Timestamp)>,
    /// `BudgetRenewed` events: (period start, when).
    pub renewed: Vec<(Timestamp, Timestamp)>,
    /// Jobs given the pending reason `budget_spent` in the flavor.
    pub pending: BTreeSet<JobId>,
    /// Jobs that waited for quota (submitted or queued, holding none) at
    /// some moment while the budget was spent, and could use the flavor.
    pub waited_while_spent: BTreeSet<JobId>,
    /// Jobs admitted in the flavor while the budget was spent.
    pub admitted_while_spent: BTreeSet<JobId>,
    /// Jobs holding quota in the flavor that were preempted while the
    /// budget was spent.
    pub preempted_while_spent: BTreeSet<JobId>,
    /// Whether the log says it is spent now.
    spent_now: bool,
}

/// Budgeted tenants' quota holds and budget events, recorded as they
/// happen: what the report's budgets section integrates over each
/// period. Holds are opened by `JobAdmitted` and closed by the events
/// that release quota, so they do not depend on the state's own count.
#[derive(Clone, Debug, Default)]
pub struct BudgetLog {
    /// Per tenant and flavor with a budget.
    pub budgets: BTreeMap<(TenantIdx, FlavorIdx), BudgetRecord>,
    /// Jobs holding quota in a budgeted flavor → that budget and the hold.
    open: FxHashMap<JobId, ((TenantIdx, FlavorIdx), usize)>,
    /// Jobs of budgeted tenants waiting for quota, per tenant.
    waiting: BTreeMap<TenantIdx, BTreeSet<JobId>>,
}

impl BudgetLog {
    /// Notes what `e` (already applied to `state`) did to a budget or to a
    /// budgeted tenant's job.
    fn observe(&mut self, e: &Event, state: &State, now: Timestamp) {
        if let Event::TenantConfigured { spec } = e {
            self.configured(&spec.name, state, now);
        }
        if self.budgets.is_empty() {
            return;
        }
        let key = |tenant: &str, flavor: &str| state.tenant_idx(tenant).zip(state.flavor(flavor));
        match e {
            Event::BudgetSpent {
                tenant,
                flavor,
                period_start,
                at,
            } => {
                let Some(k) = key(tenant, flavor) else { return };
                let waiting: Vec<JobId> = self
                    .waiting
                    .get(&k.0)
                    .map(|w| {
                        w.iter()
                            .copied()
                            .filter(|&j| accepts(state, j, k.1))
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(r) = self.budgets.get_mut(&k) {
                    r.spent.push((*period_start, *at));
                    r.spent_now = true;
                    r.waited_while_spent.extend(waiting);
                }
            }
            Event::BudgetRenewed {
                tenant,
                flavor,
                period_start,
                at,
            } => {
                if let Some(r) = key(tenant, flavor).and_then(|k| self.budgets.get_mut(&k)) {
                    r.renewed.push((*period_start, *at));
                    r.spent_now = false;
                }
            }
            Event::JobPending {
                job,
                reason: PendingReason::BudgetSpent { flavor, .. },
                ..
            } => {
                let t = state
                    .job(*job)
                    .and_then(|j| state.tenant_idx(&j.spec.tenant));
                let k = t.zip(state.flavor(flavor));
                if let Some(r) = k.and_then(|k| self.budgets.get_mut(&k)) {
                    r.pending.insert(*job);
                }
            }
            _ => {}
        }
        self.job_event(e, state, now);
    }

    /// A tenant's budgets as configured now: a new one counts from `now`.
    fn configured(&mut self, name: &str, state: &State, now: Timestamp) {
        let Some(t) = state.tenant_idx(name) else {
            return;
        };
        let tenant = state.tenant(t);
        for &f in &tenant.flavor_order {
            let Some(l) = tenant.budget(f) else { continue };
            let new = !self.budgets.contains_key(&(t, f));
            let r = self.budgets.entry((t, f)).or_insert_with(|| BudgetRecord {
                budget: l.budget,
                since: now,
                holds: Vec::new(),
                spent: Vec::new(),
                renewed: Vec::new(),
                pending: BTreeSet::new(),
                waited_while_spent: BTreeSet::new(),
                admitted_while_spent: BTreeSet::new(),
                preempted_while_spent: BTreeSet::new(),
                spent_now: false,
            });
            r.budget = l.budget;
            r.spent_now = l.is_spent();
            if new {
                // Jobs already holding quota count from now, as the
                // state's ledger counts them; jobs already waiting are
                // known as such.
                for id in 1..=state.job_count() as u64 {
                    let Some(j) = state.job(JobId(id)) else {
                        continue;
                    };
                    if j.spec.tenant != name {
                        continue;
                    }
                    if matches!(j.phase, Phase::Submitted | Phase::Queued) {
                        self.waiting.entry(t).or_default().insert(j.id);
                    }
                    if j.flavor == Some(f) && j.phase.holds_quota() {
                        r.holds.push(QuotaHold {
                            job: j.id,
                            gpus: u64::from(j.spec.total_gpus()),
                            admitted_at: now,
                            released_at: None,
                        });
                        self.open.insert(j.id, ((t, f), r.holds.len() - 1));
                    }
                }
            }
        }
    }

    /// Opens or closes a hold, and keeps the waiting jobs, for a job of a
    /// budgeted tenant.
    fn job_event(&mut self, e: &Event, state: &State, now: Timestamp) {
        let Some(id) = e.job() else { return };
        // Named by its spec: a job has its tenant index only once accepted.
        let Some(t) = state.job(id).and_then(|j| state.tenant_idx(&j.spec.tenant)) else {
            return;
        };
        if !self.budgets.keys().any(|k| k.0 == t) {
            return;
        }
        let waits = match e {
            Event::JobSubmitted { .. } => true,
            Event::JobAdmitted { flavor, .. } => {
                let k = state.flavor(flavor).map(|f| (t, f));
                if let Some((k, r)) = k.and_then(|k| self.budgets.get_mut(&k).map(|r| (k, r))) {
                    let gpus = state.job(id).map_or(0, |j| u64::from(j.spec.total_gpus()));
                    r.holds.push(QuotaHold {
                        job: id,
                        gpus,
                        admitted_at: now,
                        released_at: None,
                    });
                    if r.spent_now {
                        r.admitted_while_spent.insert(id);
                    }
                    self.open.insert(id, (k, r.holds.len() - 1));
                }
                false
            }
            Event::JobPreempted { .. } | Event::JobRequeued { .. } => {
                self.release(id, matches!(e, Event::JobPreempted { .. }), now);
                true
            }
            e if e.ends_job() => {
                self.release(id, false, now);
                false
            }
            _ => return,
        };
        let waiting = self.waiting.entry(t).or_default();
        if !waits {
            waiting.remove(&id);
            return;
        }
        waiting.insert(id);
        for (&(_, f), r) in self.budgets.range_mut((t, 0)..=(t, FlavorIdx::MAX)) {
            if r.spent_now && accepts(state, id, f) {
                r.waited_while_spent.insert(id);
            }
        }
    }

    /// Closes a job's hold, if it has one; `preempted` counts it when its
    /// budget is spent.
    fn release(&mut self, id: JobId, preempted: bool, now: Timestamp) {
        let Some((k, i)) = self.open.remove(&id) else {
            return;
        };
        if let Some(r) = self.budgets.get_mut(&k) {
            if let Some(h) = r.holds.get_mut(i) {
                h.released_at = Some(now);
            }
            if preempted && r.spent_now {
                r.preempted_while_spent.insert(id);
            }
        }
    }
}

/// Whether job `id` may run in flavor `f` (no flavors named: any of its
/// tenant's).
fn accepts(state: &State, id: JobId, f: FlavorIdx) -> bool {
    state.job(id).is_some_and(|j| {
        j.spec.flavors.is_empty() || j.spec.flavors.iter().any(|n| n == state.flavor_name(f))
    })
}

/// What dependencies (`after_ok`, `after`) and array limits (`%N`) did,
/// counted from the events.
#[derive(Clone, Debug, Default)]
pub struct Gates {
    /// Jobs submitted naming dependencies.
    pub dependent: u64,
    /// Jobs cancelled because an `after_ok` dependency ended without
    /// succeeding (`JobDependencyFailed`).
    pub dependency_failed: u64,
    /// Job arrays, by array id.
    pub arrays: BTreeMap<u64, ArrayCounts>,
    /// Array tasks not ended → (array, holds quota, running).
    tasks: FxHashMap<JobId, (u64, bool, bool)>,
}

/// One job array's tasks, counted from the events.
#[derive(Clone, Debug, Default)]
pub struct ArrayCounts {
    /// Its tenant.
    pub tenant: String,
    /// Tasks submitted.
    pub tasks: u64,
    /// Its limit (`%N`), as its first task gave it.
    pub max_running: Option<u32>,
    /// Tasks holding quota now (admitted, bound, running or preempting).
    pub holding: u64,
    /// Tasks running now (running or preempting).
    pub running: u64,
    /// Most tasks holding quota at once.
    pub peak_holding: u64,
    /// Most tasks running at once.
    pub peak_running: u64,
}

impl Gates {
    fn observe(&mut self, e: &Event) {
        match e {
            Event::JobSubmitted { job, spec, .. } => {
                if !spec.after_ok.is_empty() || !spec.after.is_empty() {
                    self.dependent += 1;
                }
                if let Some(a) = spec.array {
                    let c = self.arrays.entry(a.array).or_default();
                    if c.tasks == 0 {
                        c.tenant.clone_from(&spec.tenant);
                        c.max_running = a.max_running;
                    }
                    c.tasks += 1;
                    self.tasks.insert(*job, (a.array, false, false));
                }
            }
            Event::JobAdmitted { job, .. } => self.set(*job, Some(true), None),
            Event::JobStarted { job, .. } => self.set(*job, None, Some(true)),
            Event::JobRequeued { job, .. } | Event::JobPreempted { job, .. } => {
                self.set(*job, Some(false), Some(false));
            }
            e if e.ends_job() => {
                if matches!(e, Event::JobDependencyFailed { .. }) {
                    self.dependency_failed += 1;
                }
                if let Some(job) = e.job() {
                    self.set(job, Some(false), Some(false));
                    self.tasks.remove(&job);
                }
            }
            _ => {}
        }
    }

    /// Marks an array task as holding quota and running, or not; `None`
    /// leaves that as it is.
    fn set(&mut self, job: JobId, holding: Option<bool>, running: Option<bool>) {
        let Some((array, h, r)) = self.tasks.get_mut(&job) else {
            return;
        };
        let Some(c) = self.arrays.get_mut(array) else {
            return;
        };
        for (now, to, count, peak) in [
            (h, holding, &mut c.holding, &mut c.peak_holding),
            (r, running, &mut c.running, &mut c.peak_running),
        ] {
            match to {
                Some(true) if !*now => *count += 1,
                Some(false) if *now => *count -= 1,
                _ => continue,
            }
            *now = !*now;
            *peak = (*peak).max(*count);
        }
    }

    /// Whether the workload used dependencies or arrays.
    pub fn any(&self) -> bool {
        self.dependent > 0 || !self.arrays.is_empty()
    }
}

/// What the admins' queue and node operations did, counted from the events.
#[derive(Clone, Debug, Default)]
pub struct Operations {
    /// Queue states set (hold, release, drain, stop).
    pub queue_changes: u64,
    /// Nodes evicted for maintenance.
    pub node_evictions: u64,
    /// Operations left out: no such tenant or live node, or already so.
    pub ignored: u64,
    /// Jobs chosen to be evicted, by cause (`queue_stopped`, `node_evicted`).
    pub evicted: BTreeMap<&'static str, u64>,
    /// GPU·ms the evictions were expected to lose, as costed.
    pub expected_lost_gpu_ms: u64,
    /// GPU·ms the evicted jobs lost when they stopped.
    pub lost_gpu_ms: u64,
    /// Evicted jobs that stopped on a checkpoint completed after they
    /// were chosen (the rest stopped at their deadline).
    pub stopped_on_checkpoint: u64,
    /// Admitted jobs of a stopped queue that gave their quota back.
    pub unadmitted: u64,
    /// Submissions refused because their queue was draining or stopped.
    pub refused: u64,
    /// Evicted jobs still stopping → whether one completed a checkpoint since.
    evicting: FxHashMap<JobId, bool>,
}

impl Operations {
    fn observe(&mut self, e: &Event) {
        match e {
            Event::QueueStateSet { .. } => self.queue_changes += 1,
            Event::NodeEvicted { .. } => self.node_evictions += 1,
            Event::EvictionPlanned { cause, victims, .. } => {
                *self
                    .evicted
                    .entry(gpusched_core::eviction_label(cause))
                    .or_default() += victims.len() as u64;
                for v in victims {
                    self.expected_lost_gpu_ms += v.expected_lost_gpu_ms;
                    self.evicting.insert(v.job, false);
                }
            }
            Event::JobPreempted {
                job, lost_gpu_ms, ..
            } => {
                if let Some(checkpointed) = self.evicting.remove(job) {
                    self.lost_gpu_ms += lost_gpu_ms;
                    self.stopped_on_checkpoint += u64::from(checkpointed);
                }
            }
            Event::JobCheckpointed { job, .. } => {
                if let Some(c) = self.evicting.get_mut(job) {
                    *c = true;
                }
            }
            Event::JobRequeued {
                reason: RequeueReason::QueueStopped { .. },
                ..
            } => self.unadmitted += 1,
            Event::JobRejected {
                reason: RejectReason::QueueClosed { .. },
                ..
            } => self.refused += 1,
            // An evicted job that ended otherwise is no longer being evicted.
            Event::JobRequeued { job, .. } => {
                self.evicting.remove(job);
            }
            e if e.ends_job() => {
                if let Some(job) = e.job() {
                    self.evicting.remove(&job);
                }
            }
            _ => {}
        }
    }

    /// Whether any operation happened.
    pub fn any(&self) -> bool {
        self.queue_changes + self.node_evictions + self.ignored > 0
    }
}

/// A running simulation.
pub struct Simulator {
    state: State,
    memo: ScanMemo,
    opts: SimOptions,
    workload: Workload,
    agenda: BinaryHeap<Reverse<(Timestamp, u64, Action)>>,
    tiebreak: u64,
    durations: FxHashMap<JobId, u64>,
    /// Jobs the workload says fail when their run ends.
    failing: FxHashSet<JobId>,
    next_job: u64,
    used_gpus: u64,
    capacity_gpus: u64,
    now: Timestamp,
    items_done: usize,
    log: Vec<Event>,
    /// What was measured so far.
    pub measurements: Measurements,
}

/// A simulation that could not go on: the core decided something `apply`
/// refused (a bug), or the cluster's configuration was refused.
#[derive(Debug, thiserror::Error)]
#[error("at {at} ms: {source}")]
pub struct SimError {
    /// Virtual time.
    pub at: u64,
    /// What `apply` refused.
    pub source: ApplyError,
}

impl Simulator {
    /// A simulator over a cluster and workload.
    pub fn new(cluster: &Cluster, workload: Workload, opts: SimOptions) -> Result<Self, SimError> {
        let mut sim = Simulator {
            state: State::new(),
            memo: ScanMemo::default(),
            opts,
            agenda: BinaryHeap::new(),
            tiebreak: 0,
            durations: FxHashMap::default(),
            failing: FxHashSet::default(),
            next_job: 1,
            used_gpus: 0,
            capacity_gpus: 0,
            now: Timestamp(0),
            items_done: 0,
            log: Vec::new(),
            measurements: Measurements::default(),
            workload,
        };
        for e in &cluster.events {
            sim.apply(e.clone())?;
        }
        for (i, item) in sim.workload.items.iter().enumerate() {
            sim.agenda
                .push(Reverse((item.at, i as u64, Action::Workload(i))));
        }
        sim.tiebreak = sim.workload.items.len() as u64;
        Ok(sim)
    }

    /// The state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Every event applied, when recording.
    pub fn log(&self) -> &[Event] {
        &self.log
    }

    /// The workload.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    fn apply(&mut self, e: Event) -> Result<(), SimError> {
        // GPU accounting for utilisation, from the state before the event.
        match &e {
            Event::JobBound { assignments, .. } => {
                self.used_gpus += assignments.iter().map(|a| a.gpus as u64).sum::<u64>();
            }
            Event::JobFinished { job, .. }
            | Event::JobCancelled { job, .. }
            | Event::JobRequeued { job, .. } => {
                if let Some(j) = self.state.job(*job) {
                    if j.phase.holds_gpus() {
                        self.used_gpus -= j.spec.total_gpus() as u64;
                    }
                }
            }
            Event::NodeAdded { spec, .. } => self.capacity_gpus += spec.gpus as u64,
            Event::NodeLost { node, .. } => {
                self.capacity_gpus -= self.state.capacity().node_gpus(*node) as u64;
            }
            _ => {}
        }
        self.state.apply(&e).map_err(|source| SimError {
            at: self.now.0,
            source,
        })?;
        self.observe(&e);
        self.measurements.events += 1;
        if self.opts.record_events {
            self.log.push(e);
        }
        Ok(())
    }

    /// Notes a reclaim that frees more than its deficit; before it is applied.
    fn before(&mut self, e: &Event) {
        if let Event::PreemptionPlanned {
            beneficiary,
            cause:
                PreemptionCause::Reclaim {
                    flavor,
                    quota_deficit,
                    ..
                },
            victims,
            ..
        } = e
        {
            if let Some(text) = imbalance(&self.state, victims, *quota_deficit, flavor) {
                self.measurements
                    .reclaim_imbalances
                    .push((*beneficiary, text));
            }
        }
    }

    /// Counts what the report needs from every applied event.
    fn observe(&mut self, e: &Event) {
        let m = &mut self.measurements;
        m.goodput.observe(e, true);
        if let Some(latency) = m.reclaim_clock.observe(e) {
            m.reclaim_latencies.push(latency);
        }
        match e {
            Event::JobPreempted { lost_gpu_ms, .. } => {
                m.preemptions += 1;
                m.lost_gpu_ms += lost_gpu_ms;
            }
            Event::JobRequeued { lost_gpu_ms, .. } => m.lost_gpu_ms += lost_gpu_ms,
            Event::JobBound {
                backfill_for: Some(_),
                ..
            } => m.backfilled += 1,
            Event::ReservationMade { .. } => m.reservations += 1,
            Event::JobCheckpointed { .. } => m.checkpoints += 1,
            _ => {}
        }
        m.operations.observe(e);
        m.gates.observe(e);
        m.shares.observe(e, &self.state, self.now);
        m.budgets.observe(e, &self.state, self.now);
    }

    /// The agent's part after a run starts: its completion and its
    /// periodic checkpoints (each complete `duration_s` after it starts;
    /// one the run does not outlive is never reported).
    /// The agent's part once a job is bound: a first run starts at once, a
    /// resumed one (it ran before) after `restore_ms`.
    fn start_bound(&mut self, job: JobId) -> Result<(), SimError> {
        let Some(j) = self.state.job(job) else {
            return Ok(());
        };
        if self.opts.restore_ms > 0 && j.starts > 0 {
            let at = Timestamp(self.now.0 + self.opts.restore_ms);
            self.push(at, Action::Start(job, j.admit_order));
            return Ok(());
        }
        self.start(job)
    }

    fn start(&mut self, job: JobId) -> Result<(), SimError> {
        self.apply(Event::JobStarted { job, at: self.now })?;
        self.schedule_run(job);
        Ok(())
    }

    fn schedule_run(&mut self, job: JobId) {
        let Some(j) = self.state.job(job) else { return };
        let (starts, resume) = (j.starts, j.resume_progress_ms);
        let total = self.durations.get(&job).copied().unwrap_or(0);
        let end = self.now.0 + total.saturating_sub(resume);
        let policy = j.spec.checkpoint;
        self.push(Timestamp(end), Action::Finish(job, starts));
        if let Some(c) = policy {
            let done = self.now.0 + c.interval_s * 1000 + c.duration_s * 1000;
            if done < end {
                self.push(
                    Timestamp(done),
                    Action::Checkpoint(job, starts, resume + c.interval_s * 1000),
                );
            }
        }
    }

    /// The agent's part when victims are chosen: a checkpoint request each
    /// checkpointable victim honours if it can complete one by its deadline,
    /// and a cycle at every deadline.
    fn on_preemption_planned(&mut self, victims: &[gpusched_events::Victim]) {
        for v in victims {
            self.push(v.deadline, Action::Wake);
            let Some(j) = self.state.job(v.job) else {
                continue;
            };
            let (Some(c), Some(started)) = (j.spec.checkpoint, j.started_at) else {
                continue;
            };
            let done = self.now.0 + c.duration_s * 1000;
            if done <= v.deadline.0 {
                let progress = j.resume_progress_ms + self.now.millis_since(started);
                let starts = j.starts;
                self.push(Timestamp(done), Action::Checkpoint(v.job, starts, progress));
            }
        }
    }

    fn advance_to(&mut self, t: Timestamp) {
        let dt = t.millis_since(self.now) as f64;
        if dt > 0.0 {
            let m = &mut self.measurements;
            let used = self.used_gpus as f64 * dt;
            let cap = self.capacity_gpus as f64 * dt;
            m.used_gpu_ms += used;
            m.capacity_gpu_ms += cap;
            let c = self.state.phase_counts();
            if c.get(Phase::Submitted) + c.get(Phase::Queued) + c.get(Phase::Admitted) > 0 {
                m.backlog_used_gpu_ms += used;
                m.backlog_capacity_gpu_ms += cap;
            }
        }
        self.now = t;
    }

    fn push(&mut self, at: Timestamp, a: Action) {
        self.tiebreak += 1;
        self.agenda.push(Reverse((at, self.tiebreak, a)));
    }

    /// What happens from outside: a submission, a node lost, an admin's
    /// operation. An operation naming no live node or tenant, or asking
    /// for the state it is already in, is counted and left out.
    fn workload_item(&mut self, kind: WorkloadKind) -> Result<(), SimError> {
        use gpusched_core::NodeStatus;
        let now = self.now;
        let status =
            |s: &State, node: &str| s.node_id(node).map(|n| (n, s.nodes()[n.index()].status));
        match kind {
            WorkloadKind::Submit { spec, duration_s } => self.submit(spec, duration_s, false),
            WorkloadKind::SubmitFailing { spec, duration_s } => self.submit(spec, duration_s, true),
            WorkloadKind::NodeLost { node } => match status(&self.state, &node) {
                Some((n, st)) if st != NodeStatus::Lost => {
                    self.apply(Event::NodeLost { node: n, at: now })
                }
                _ => {
                    self.measurements.unknown_node_losses += 1;
                    Ok(())
                }
            },
            WorkloadKind::NodeEvict { node } => match status(&self.state, &node) {
                Some((n, NodeStatus::Ready | NodeStatus::Cordoned | NodeStatus::Drained)) => {
                    self.apply(Event::NodeEvicted { node: n, at: now })
                }
                _ => {
                    self.measurements.operations.ignored += 1;
                    Ok(())
                }
            },
            WorkloadKind::Queue { tenant, state } => {
                let now_state = self
                    .state
                    .tenant_idx(&tenant)
                    .map(|t| self.state.tenant(t).queue);
                if now_state.is_none_or(|q| q == state) {
                    self.measurements.operations.ignored += 1;
                    return Ok(());
                }
                self.apply(Event::QueueStateSet {
                    tenant,
                    state,
                    at: now,
                })
            }
        }
    }

    /// A user's submission: the next job id (from 1, in submit order),
    /// and how long it runs and whether it then fails, known only to the
    /// simulated agent.
    fn submit(
        &mut self,
        spec: gpusched_model::JobSpec,
        duration_s: u64,
        fails: bool,
    ) -> Result<(), SimError> {
        let job = JobId(self.next_job);
        self.next_job += 1;
        self.durations.insert(job, duration_s.saturating_mul(1000));
        if fails {
            self.failing.insert(job);
        }
        self.apply(Event::JobSubmitted {
            job,
            spec,
            at: self.now,
        })
    }

    fn handle(&mut self, a: Action) -> Result<(), SimError> {
        match a {
            Action::Workload(i) => {
                self.items_done += 1;
                let kind = self.workload.items[i].kind.clone();
                self.workload_item(kind)?;
            }
            Action::Wake => {}
            Action::Start(job, admit_order) => {
                let bound = self
                    .state
                    .job(job)
                    .is_some_and(|j| j.phase == Phase::Bound && j.admit_order == admit_order);
                if bound {
                    self.start(job)?;
                }
            }
            Action::Checkpoint(job, starts, progress) => {
                let live = self.state.job(job).filter(|j| {
                    matches!(j.phase, Phase::Running | Phase::Preempting) && j.starts == starts
                });
                let Some(j) = live else { return Ok(()) };
                // A checkpoint older than one already reported adds nothing.
                if j.last_checkpoint
                    .as_ref()
                    .is_some_and(|c| c.progress_ms >= progress)
                {
                    return Ok(());
                }
                let (phase, policy, started, resume) = (
                    j.phase,
                    j.spec.checkpoint,
                    j.started_at,
                    j.resume_progress_ms,
                );
                self.apply(Event::JobCheckpointed {
                    job,
                    progress_ms: progress,
                    uri: format!("ckpt://job-{}/{}", job.0, progress),
                    at: self.now,
                })?;
                // The next periodic checkpoint of this run.
                if let (Phase::Running, Some(c), Some(started)) = (phase, policy, started) {
                    let interval = (c.interval_s * 1000).max(1);
                    let ran = progress - resume;
                    let next_ran = (ran / interval + 1) * interval;
                    let done = started.0 + next_ran + c.duration_s * 1000;
                    let total = self.durations.get(&job).copied().unwrap_or(0);
                    let end = started.0 + total.saturating_sub(resume);
                    if done < end {
                        self.push(
                            Timestamp(done),
                            Action::Checkpoint(job, starts, resume + next_ran),
                        );
                    }
                }
            }
            Action::Finish(job, starts) => {
                let running = self.state.job(job).is_some_and(|j| {
                    matches!(j.phase, Phase::Running | Phase::Preempting) && j.starts == starts
                });
                if running {
                    let outcome = if self.failing.contains(&job) {
                        Outcome::Failed
                    } else {
                        Outcome::Succeeded
                    };
                    self.apply(Event::JobFinished {
                        job,
                        outcome,
                        at: self.now,
                        exits: Vec::new(),
                        reason: None,
                    })?;
                }
            }
        }
        Ok(())
    }

    fn cycle(&mut self) -> Result<(), SimError> {
        // Cycles repeat at the same virtual instant while they decide
        // something: a bounded cycle leaves the rest for the next one.
        for _ in 0..100_000 {
            let started = Instant::now();
            let mut clock = VictimClock::default();
            let out = run_cycle_timed(
                &mut self.state,
                &mut self.memo,
                &self.opts.cycle,
                self.now,
                &mut clock,
            )
            .map_err(|source| SimError {
                at: self.now.0,
                source,
            })?;
            let elapsed = started.elapsed();
            let s = out.stats;
            self.measurements.cycles.push(CycleSample {
                elapsed_us: elapsed.as_micros().min(u32::MAX as u128) as u32,
                heads_examined: s.heads_examined() as u32,
                domains_probed: s.placement.domains_probed as u32,
                decisions: s.decisions as u32,
                victim_us: clock.last_us,
                beneficiaries: s.preemption.beneficiaries as u32,
                victim_sets: s.preemption.max_sets_costed as u32,
            });
            self.measurements.decisions += s.decisions;
            self.measurements.events += out.events.len() as u64;
            let mut starts = Vec::new();
            for e in out.events {
                self.before(&e);
                self.observe(&e);
                match &e {
                    Event::JobBound {
                        job, assignments, ..
                    } => {
                        self.used_gpus += assignments.iter().map(|a| a.gpus as u64).sum::<u64>();
                        starts.push(*job);
                    }
                    // An admitted job sent back from a stopped queue held no GPUs.
                    Event::JobRequeued {
                        reason: RequeueReason::QueueStopped { .. },
                        ..
                    } => {}
                    Event::JobRequeued { job, .. } | Event::JobPreempted { job, .. } => {
                        let total = self.state.job(*job).map_or(0, |j| j.spec.total_gpus());
                        self.used_gpus -= total as u64;
                    }
                    Event::PreemptionPlanned { victims, .. }
                    | Event::EvictionPlanned { victims, .. } => {
                        self.on_preemption_planned(victims);
                    }
                    // A cycle when the period renews, though nothing else
                    // may happen then.
                    Event::BudgetSpent { tenant, flavor, .. } => {
                        let renews = self.state.tenant_idx(tenant).zip(self.state.flavor(flavor));
                        let renews = renews.and_then(|(t, f)| {
                            let l = self.state.tenant(t).budget(f)?;
                            Some(l.budget.period.next_start(self.now))
                        });
                        if let Some(at) = renews {
                            self.push(at, Action::Wake);
                        }
                    }
                    _ => {}
                }
                if self.opts.record_events {
                    self.log.push(e);
                }
            }
            // The agents start what was bound.
            for job in starts {
                self.start_bound(job)?;
            }
            if s.decisions == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Whether nothing more can happen: the workload is all submitted and
    /// every job has ended (what is left on the agenda, such as a wake for
    /// a budget's next period, would only move the clock).
    fn nothing_left(&self) -> bool {
        let counts = self.state.phase_counts();
        self.items_done == self.workload.items.len()
            && Phase::ALL
                .iter()
                .all(|&p| p.is_terminal() || counts.get(p) == 0)
    }

    /// Runs to the end (or `until`), calling `progress` every few thousand steps.
    pub fn run(&mut self, progress: &mut dyn FnMut(Progress)) -> Result<(), SimError> {
        let started = Instant::now();
        let mut steps = 0u64;
        while let Some(Reverse((t, _, _))) = self.agenda.peek().copied() {
            if self.nothing_left() {
                break;
            }
            if self.opts.until.is_some_and(|u| t > u) {
                if let Some(u) = self.opts.until {
                    self.advance_to(u);
                }
                break;
            }
            self.advance_to(t);
            while let Some(Reverse((t2, _, a))) = self.agenda.peek().copied() {
                if t2 != t {
                    break;
                }
                self.agenda.pop();
                self.handle(a)?;
            }
            self.cycle()?;
            steps += 1;
            if steps.is_multiple_of(4096) {
                progress(Progress {
                    items_done: self.items_done,
                    items_total: self.workload.items.len(),
                    now: self.now,
                });
            }
        }
        progress(Progress {
            items_done: self.items_done,
            items_total: self.workload.items.len(),
            now: self.now,
        });
        self.measurements.end = self.now;
        self.measurements.wall_s = started.elapsed().as_secs_f64();
        Ok(())
    }
}

/// A reclaim that frees more than its quota deficit, because jobs are
/// indivisible (or room in one domain needed more): how much more, and any
/// borrower it leaves below its own nominal. `None` when it frees exactly
/// the deficit. Called before the plan is applied.
fn imbalance(
    state: &State,
    victims: &[gpusched_events::Victim],
    deficit: u32,
    flavor: &str,
) -> Option<String> {
    let f = state.flavor(flavor)?;
    let mut given: Vec<(u32, u32)> = Vec::new(); // (tenant, GPUs)
    for v in victims {
        let j = state.job(v.job)?;
        let t = j.tenant?;
        match given.iter_mut().find(|(x, _)| *x == t) {
            Some(e) => e.1 += j.spec.total_gpus(),
            None => given.push((t, j.spec.total_gpus())),
        }
    }
    let total: u32 = given.iter().map(|(_, g)| g).sum();
    if total <= deficit {
        return None;
    }
    // A reclaim of room only (deficit 0) is uneven only if a borrower ends
    // below its nominal.
    let mut text = if deficit > 0 {
        format!("frees {total} GPUs for a {deficit}-GPU quota deficit")
    } else {
        format!("frees {total} GPUs of room")
    };
    let mut below = false;
    for (t, g) in given {
        let tm = state.tenant(t);
        let nominal = tm.nominal(f);
        let after = tm.used(f) - QuotaGpus::from(g);
        if after < nominal {
            below = true;
            text.push_str(&format!(
                "; {} drops to {after}, {} below its nominal {nominal}",
                tm.spec.name,
                nominal - after
            ));
        }
    }
    (deficit > 0 || below).then_some(text)
}

/// Rebuilds a state from a log; the replay check of the simulator.
pub fn replay(events: &[Event]) -> Result<State, ApplyError> {
    let mut s = State::new();
    for e in events {
        s.apply(e)?;
    }
    Ok(s)
}
