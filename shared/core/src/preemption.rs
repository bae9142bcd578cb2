//! Preemption: bounded, checkpoint-aware victim choice and the eviction
//! protocol.
//!
//! Owns: (1) finishing preemptions — a victim stops when it reports a
//! complete checkpoint or at its deadline, and resumes only from its last
//! complete checkpoint; (2) evictions an admin asked for — every job on a
//! node emptied for maintenance, every job of a stopped queue (those that
//! borrowed first), each with the same checkpoint protocol; (3) evicting
//! preemptible backfill when a reservation's nodes are needed; (4) planning
//! victims for a beneficiary:
//! a quota owner reclaiming lent quota from borrowers in its cohort
//! (reclaim), or a higher-priority job evicting lower ones of its own tenant
//! (priority preemption). Victims come only from an index of preemptible
//! running jobs ordered by unsaved work; at most `max_candidates` are looked
//! at and at most `max_sets` victim sets costed per beneficiary.
//!
//! Cost of a victim = the work it loses, plus GPUs × restart cost, plus
//! GPUs × a thrash penalty if it was preempted recently. The work it loses
//! is the least of: stopping after the base grace, GPUs × (now − last
//! complete checkpoint, or run start, + grace); completing a checkpoint on
//! request when one fits in `max_checkpoint_grace_ms`, GPUs × its duration;
//! waiting for its next periodic checkpoint when that completes within the
//! wait window, GPUs × its duration (docs/design.md, section 3).
//! The cheapest set that frees what the beneficiary needs in one domain wins;
//! a minimality pass drops any victim the set can do without. With
//! `VictimOrder::Kueue` the same search orders candidates as Kueue does
//! (lower priority first, most recently started first) as a baseline.
//!
//! Must never: preempt a non-preemptible job for a beneficiary (only an
//! admin's eviction stops one), plan for a queued job whose queue is held,
//! draining or stopped, preempt for a reclaim a job of
//! a tenant within its nominal quota (what it holds once its stopping
//! victims are gone: its own queued beneficiaries do not make it a
//! borrower), or allocate GPUs (placement binds the beneficiary once the
//! victims' GPUs are released).

use crate::capacity::{pack_in_order, CapacityOverlay, DomainIdx, FlavorIdx};
use crate::limits::{CycleConfig, PreemptionStats, ScanMemo, SearchStamp, VictimOrder};
use crate::quota::{self, QuotaOverlay};
use crate::quota_gpus::QuotaGpus;
use crate::state::{Job, NodeStatus, Phase, State, TenantIdx};
use gpusched_events::{
    Assignment, Event, EvictionCause, PreemptionCause, QueueState, RequeueReason, Victim,
};
use gpusched_model::{Gpus, JobId, NodeId, Timestamp};
use rustc_hash::{FxHashMap, FxHashSet};
use std::borrow::Cow;
use std::collections::BTreeSet;

#[derive(Clone, Debug)]
struct Cand {
    job: JobId,
    tenant: TenantIdx,
    gpus: Gpus,
    cost: u64,
    lost: u64,
    deadline: Timestamp,
    kueue_rank: (i32, std::cmp::Reverse<Timestamp>),
    nodes: Vec<Assignment>,
}

impl Cand {
    fn victim(&self) -> Victim {
        Victim {
            job: self.job,
            deadline: self.deadline,
            expected_lost_gpu_ms: self.lost,
            cost: self.cost,
        }
    }
}

/// When the running job's next periodic checkpoint completes after `now`:
/// periodic checkpoints start at start + k·interval (k ≥ 1) and complete
/// `duration` later. The latest one begun, k = ran / interval, may still
/// be running; else the next one, which begins after `now`, is the one.
fn next_checkpoint_done(job: &Job, now: Timestamp) -> Option<Timestamp> {
    let c = job.spec.checkpoint?;
    let start = job.started_at?;
    let (interval, dur) = (c.interval_s * 1000, c.duration_s * 1000);
    if interval == 0 {
        return None;
    }
    let k = now.millis_since(start) / interval;
    let done = |k: u64| start.0 + k * interval + dur;
    if k >= 1 && done(k) > now.0 {
        Some(Timestamp(done(k)))
    } else {
        Some(Timestamp(done(k + 1)))
    }
}

fn costed(cfg: &CycleConfig, job: &Job, now: Timestamp) -> Cand {
    let p = &cfg.preemption;
    let gpus = job.spec.total_gpus() as u64;
    let restart = gpus * p.restart_cost_ms;
    let thrash = match job.preempted_at {
        Some(t) if now.millis_since(t) < p.thrash_window_ms => gpus * p.thrash_penalty_ms,
        _ => 0,
    };
    let unsaved = job.unsaved_ms(now);
    // (a) Stopped after the base grace without a checkpoint: it loses what
    // it has not saved by then.
    let lost_stop = gpus * (unsaved + p.grace_ms);
    let mut cand = Cand {
        job: job.id,
        tenant: job.tenant.unwrap_or(0),
        gpus: job.spec.total_gpus(),
        cost: lost_stop + restart + thrash,
        lost: lost_stop,
        deadline: Timestamp(now.0 + p.grace_ms),
        kueue_rank: (
            job.spec.priority,
            std::cmp::Reverse(job.started_at.unwrap_or_default()),
        ),
        nodes: job.assignments.clone(),
    };
    // (b) A checkpointable victim whose checkpoint fits in
    // `max_checkpoint_grace_ms` is given the time to complete one on
    // request: it loses only the work done while checkpointing.
    let ckpt_ms = job
        .spec
        .checkpoint
        .map(|c| c.duration_s * 1000)
        .filter(|&d| d <= p.max_checkpoint_grace_ms);
    if let Some(d) = ckpt_ms {
        let lost = gpus * d;
        let deadline = Timestamp(now.0 + (d + 5_000).max(p.grace_ms));
        // Kueue does not look at checkpoints: its victims get the job's own
        // checkpoint-sized grace too, so only the order differs.
        if p.order == VictimOrder::Kueue || lost < cand.lost {
            cand.cost = lost + restart + thrash;
            cand.lost = lost;
            cand.deadline = deadline;
        }
    }
    // (c) Its next periodic checkpoint completes within W: stop it right
    // after, losing only the work done while that checkpoint ran.
    if p.order == VictimOrder::Checkpoint {
        if let (Some(done), Some(c)) = (next_checkpoint_done(job, now), job.spec.checkpoint) {
            let lost = gpus * c.duration_s * 1000;
            if done.millis_since(now) <= p.wait_window_ms && lost < cand.lost {
                cand.cost = lost + restart + thrash;
                cand.lost = lost;
                cand.deadline = Timestamp((done.0 + 1_000).max(now.0 + p.grace_ms));
            }
        }
    }
    cand
}

impl SearchStamp {
    fn of(state: &State, job: &Job, need: &Need) -> Self {
        let tenant = job.tenant.map(|t| state.tenant(t));
        SearchStamp {
            running: state.running_version(),
            capacity: state.capacity_version(need.flavor),
            cohort: tenant
                .and_then(|t| t.cohort)
                .map_or(0, |c| state.cohort(c).version),
            tenant: tenant.map_or(0, |t| t.version),
            flavor: need.flavor,
            quota: need.quota,
        }
    }
}

/// What a beneficiary needs freed.
struct Need {
    flavor: FlavorIdx,
    level: u8,
    workers: u32,
    g: Gpus,
    /// GPUs of quota to free (lent quota for a reclaim, own for priority).
    quota: QuotaGpus,
    /// Per candidate tenant: GPUs it may lose before it would drop to its
    /// nominal quota (reclaim), or unlimited (priority).
    cause: PreemptionCause,
}

struct Plan {
    victims: Vec<Cand>,
    reserve: Vec<Assignment>,
    /// Only quota was missing: the domain it fits in now.
    fits_in: Option<DomainIdx>,
}

/// What the plans already made will do once they land — those in flight
/// and those made earlier in this pass — so the next search counts quota
/// and room as they will be: victims that are stopping give their quota
/// back, queued beneficiaries are charged theirs, and room promised to a
/// beneficiary is no one else's.
#[derive(Default)]
struct Pass {
    /// Quota once the plans land.
    quota: QuotaOverlay,
    /// Quota as the tenants hold it once their stopping victims are gone,
    /// queued beneficiaries not charged: what a reclaim may take from a
    /// borrower is what it borrows in this view. (Charging a tenant's own
    /// queued beneficiaries here would make it a borrower of quota it has
    /// not taken, and two owners would reclaim from each other in turn.)
    held: QuotaOverlay,
    /// Queued beneficiaries charged in `quota`.
    charged: FxHashSet<JobId>,
    /// Free GPUs this pass's beneficiaries will bind in.
    room: CapacityOverlay,
    /// Nodes reserved for this pass's beneficiaries.
    reserved: FxHashSet<NodeId>,
    /// Victims this pass's plans took.
    taken: FxHashSet<JobId>,
    /// Flavors this pass planned in.
    flavors: FxHashSet<FlavorIdx>,
}

impl Pass {
    /// The preemptions in flight: their victims still stopping, their
    /// queued beneficiaries waiting for them or for admission.
    fn in_flight(state: &State) -> Pass {
        let mut pass = Pass::default();
        let mut waiting: BTreeSet<JobId> = state.reclaim_holders().collect();
        for (beneficiary, victims) in state.plans() {
            waiting.insert(beneficiary);
            for &v in victims {
                if let Some(j) = state.job(v).filter(|j| j.phase == Phase::Preempting) {
                    pass.give_back(state, j);
                }
            }
        }
        // Evicted jobs (no beneficiary) give their quota back too.
        for (_, v) in state.preempting() {
            if let Some(j) = state
                .job(v)
                .filter(|j| matches!(j.preempt, Some((_, None))))
            {
                pass.give_back(state, j);
            }
        }
        for b in waiting {
            let Some(j) = state.job(b).filter(|j| j.phase == Phase::Queued) else {
                continue;
            };
            if let (Some(t), Some(f)) = (j.tenant, state.planned_flavor(b)) {
                pass.quota.charge(state, t, f, j.quota_gpus());
                pass.charged.insert(b);
            }
        }
        pass
    }

    /// A stopping victim's GPUs go back to its tenant's quota.
    fn give_back(&mut self, state: &State, victim: &Job) {
        if let (Some(t), Some(f)) = (victim.tenant, victim.flavor) {
            self.quota.release(state, t, f, victim.quota_gpus());
            self.held.release(state, t, f, victim.quota_gpus());
        }
    }

    /// A victim taken earlier in this pass.
    fn take_victim(&mut self, state: &State, victim: JobId) {
        if self.taken.insert(victim) {
            if let Some(j) = state.job(victim) {
                self.give_back(state, j);
            }
        }
    }

    /// The quota `job`'s search reads: without its own charge, if any
    /// (copied only then).
    fn quota_without(&self, state: &State, job: &Job) -> Cow<'_, QuotaOverlay> {
        match (job.tenant, state.planned_flavor(job.id)) {
            (Some(t), Some(f)) if self.charged.contains(&job.id) => {
                let mut quota = self.quota.clone();
                quota.release(state, t, f, job.quota_gpus());
                Cow::Owned(quota)
            }
            _ => Cow::Borrowed(&self.quota),
        }
    }

    /// Counts a plan made for `job`.
    fn record(&mut self, state: &State, job: &Job, need: &Need, plan: &Plan) {
        let cap = state.capacity();
        for v in &plan.victims {
            self.take_victim(state, v.job);
        }
        if let (Phase::Queued, Some(t)) = (job.phase, job.tenant) {
            self.quota.charge(state, t, need.flavor, job.quota_gpus());
            self.charged.insert(job.id);
        }
        // It will bind in room free now: that room is its.
        if let Some(nodes) = plan
            .fits_in
            .and_then(|d| cap.choose_nodes(&self.room, d, need.workers, need.g))
        {
            cap.take(&mut self.room, &nodes);
        }
        for a in &plan.reserve {
            if self.reserved.insert(a.node) && cap.is_schedulable(a.node) {
                let gpus = cap.free_with(&self.room, a.node);
                cap.take(&mut self.room, &[Assignment { node: a.node, gpus }]);
            }
        }
        self.flavors.insert(need.flavor);
    }
}

/// Runs the preemption stage at `now`.
pub fn decide(
    state: &State,
    memo: &mut ScanMemo,
    cfg: &CycleConfig,
    now: Timestamp,
) -> (Vec<Event>, PreemptionStats) {
    let mut stats = PreemptionStats::default();
    let mut events = Vec::new();
    // 1. Victims that checkpointed or whose deadline passed stop now.
    let mut done: Vec<JobId> = state.preempt_ready().collect();
    done.extend(
        state
            .preempting()
            .take_while(|(deadline, _)| *deadline <= now)
            .map(|(_, j)| j),
    );
    done.sort_unstable();
    done.dedup();
    for id in done {
        let Some(job) = state.job(id) else { continue };
        if job.phase != Phase::Preempting {
            continue;
        }
        events.push(Event::JobPreempted {
            job: id,
            lost_gpu_ms: job.spec.total_gpus() as u64 * job.unsaved_ms(now),
            resume_from: job.resume_from(),
            at: now,
        });
        stats.preempted += 1;
    }
    let mut pass = Pass::in_flight(state);
    // 2. Evictions: nodes emptied for maintenance, stopped queues.
    for e in evictions(state, cfg, now) {
        if let Event::EvictionPlanned { victims, .. } = &e {
            for v in victims {
                pass.take_victim(state, v.job);
            }
        }
        events.push(e);
    }
    // 3. Preemptible backfill leaves reservations whose nodes are needed.
    let mut planned_for: FxHashSet<JobId> = FxHashSet::default();
    for (&owner, r) in state.reservations() {
        if r.for_preemption || r.backfill.is_empty() || state.plan(owner).is_some() {
            continue;
        }
        if state.job(owner).map(|j| j.phase) != Some(Phase::Admitted)
            || state.job(owner).is_some_and(|j| queue_stopped(state, j))
        {
            continue;
        }
        if let Some(victims) = backfill_to_evict(state, cfg, owner, now, &pass.taken) {
            stats.planned += 1;
            planned_for.insert(owner);
            for v in &victims {
                pass.take_victim(state, v.job);
            }
            events.push(Event::PreemptionPlanned {
                beneficiary: owner,
                cause: PreemptionCause::Reservation,
                victims,
                reserve: Vec::new(),
                at: now,
            });
        }
    }
    // 4. Beneficiaries: reclaim and priority preemption, as many as the
    // cycle's bounds allow. Each plan is counted in `pass` before the next
    // search, so a later one neither counts the same quota or room twice
    // nor takes a victim twice.
    let bounds = &cfg.preemption;
    for id in state.wants_preemption() {
        if stats.beneficiaries as usize >= bounds.max_beneficiaries
            || stats.candidates as usize >= bounds.max_cycle_candidates
        {
            break;
        }
        if state.plan(id).is_some() || planned_for.contains(&id) {
            continue;
        }
        let Some(job) = state.job(id) else { continue };
        // A closed queue's queued jobs wait; a stopped one's admitted jobs
        // are being sent back (step 2).
        if (job.phase == Phase::Queued && !queue_admits(state, job)) || queue_stopped(state, job) {
            continue;
        }
        if job.phase == Phase::Queued && !quota::within_reach(state, cfg, now, job) {
            continue;
        }
        let Some(search) = Search::of(state, cfg, job, now, &pass) else {
            continue;
        };
        let stamp = SearchStamp::of(state, job, &search.need);
        if memo.preempt_failed.get(&id) == Some(&stamp) {
            continue;
        }
        stats.beneficiaries += 1;
        let mut tally = Tally::default();
        let planned = plan(&search, &mut tally);
        let need = search.need;
        stats.candidates += tally.looked;
        stats.max_sets_costed = stats.max_sets_costed.max(tally.sets);
        match planned {
            Some(p) => {
                stats.planned += 1;
                planned_for.insert(id);
                pass.record(state, job, &need, &p);
                events.push(Event::PreemptionPlanned {
                    beneficiary: id,
                    cause: need.cause.clone(),
                    victims: p.victims.iter().map(Cand::victim).collect(),
                    reserve: p.reserve,
                    at: now,
                });
            }
            // Not remembered: a failure only for want of old-enough victims
            // (time alone may cure it), nor a job that needs no victims
            // (others binding first take its room without a version bump),
            // nor one that plans earlier in this pass may have caused.
            None if !tally.young
                && !tally.fits_without_victims
                && !pass.flavors.contains(&need.flavor) =>
            {
                memo.preempt_failed.insert(id, stamp);
            }
            None => {}
        }
    }
    (events, stats)
}

/// Whether the job's queue is stopped.
fn queue_stopped(state: &State, job: &Job) -> bool {
    job.tenant
        .is_some_and(|t| state.tenant(t).queue == QueueState::Stopped)
}

/// Whether the job's queue admits jobs now.
fn queue_admits(state: &State, job: &Job) -> bool {
    job.tenant.is_none_or(|t| state.tenant(t).queue.admits())
}

/// The evictions due now, at most `max_cycle_candidates` victims: every
/// running job on a node emptied for maintenance, and of a stopped queue
/// its admitted jobs (their quota goes back at once) and its running ones,
/// those that borrowed first (the others once none of those still runs).
/// Every running job goes, preemptible or not: its admin asked for it.
/// Each victim gets the checkpoint protocol, costed as a preemption's.
fn evictions(state: &State, cfg: &CycleConfig, now: Timestamp) -> Vec<Event> {
    let mut budget = cfg.preemption.max_cycle_candidates;
    let mut taken: FxHashSet<JobId> = FxHashSet::default();
    let mut events = Vec::new();
    let mut victims_of = |jobs: Vec<&Job>, budget: &mut usize| -> Vec<Victim> {
        let mut out = Vec::new();
        for j in jobs {
            if *budget == 0 {
                break;
            }
            if j.phase == Phase::Running && taken.insert(j.id) {
                out.push(costed(cfg, j, now).victim());
                *budget -= 1;
            }
        }
        out
    };
    for node in state.evicted_nodes() {
        if budget == 0 {
            return events;
        }
        let jobs = state.nodes()[node.index()]
            .jobs
            .iter()
            .filter_map(|j| state.job(*j))
            .collect();
        let victims = victims_of(jobs, &mut budget);
        if !victims.is_empty() {
            events.push(Event::EvictionPlanned {
                cause: EvictionCause::NodeEvicted { node },
                victims,
                at: now,
            });
        }
    }
    for t in state.tenants() {
        if budget == 0 {
            break;
        }
        if t.queue != QueueState::Stopped || t.holding.is_empty() {
            continue;
        }
        let jobs: Vec<&Job> = t.holding.iter().filter_map(|j| state.job(*j)).collect();
        for j in jobs.iter().filter(|j| j.phase == Phase::Admitted) {
            if budget == 0 {
                break;
            }
            budget -= 1;
            events.push(Event::JobRequeued {
                job: j.id,
                reason: RequeueReason::QueueStopped {
                    tenant: t.spec.name.clone(),
                },
                lost_gpu_ms: 0,
                at: now,
            });
        }
        let borrowing = jobs.iter().any(|j| j.borrowed > 0 && j.phase.holds_gpus());
        let running = jobs
            .into_iter()
            .filter(|j| !borrowing || j.borrowed > 0)
            .collect();
        let victims = victims_of(running, &mut budget);
        if !victims.is_empty() {
            events.push(Event::EvictionPlanned {
                cause: EvictionCause::QueueStopped {
                    tenant: t.spec.name.clone(),
                },
                victims,
                at: now,
            });
        }
    }
    events
}

/// One victim set a search costed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CostedSet {
    /// The domain it frees room in (`None`: room existed, only quota was
    /// missing).
    pub domain: Option<String>,
    /// Its victims: after the pass that drops any it can do without when it
    /// suffices, else what the search had taken when it gave up.
    pub victims: Vec<Victim>,
    /// What the search minimises: the victims' summed cost (checkpoint
    /// order) or their number (Kueue order).
    pub key: u64,
    /// Whether it frees what the beneficiary needs.
    pub suffices: bool,
}

/// One beneficiary's victim search, run again for a review: what it looked
/// at and every set it costed. The same search `decide` runs; reading it
/// changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchReport {
    /// Why the beneficiary may preempt.
    pub cause: PreemptionCause,
    /// GPUs of quota that must be freed (0: only room is missing).
    pub quota_deficit: Gpus,
    /// Candidates costed, in the order the search takes them.
    pub candidates: Vec<Victim>,
    /// Jobs looked at (eligible or not).
    pub looked: u64,
    /// Every set costed, in the order costed.
    pub sets: Vec<CostedSet>,
    /// The set chosen: the cheapest that suffices (an index into `sets`).
    pub chosen: Option<usize>,
    /// The beneficiary fits without anyone leaving.
    pub fits_without_victims: bool,
}

/// The victim search `decide` would run for `beneficiary` on `state` at
/// `now`, with its working; `None` when preemption cannot help the job
/// (it is not waiting, or neither reclaim nor priority applies).
pub fn search_report(
    state: &State,
    cfg: &CycleConfig,
    beneficiary: JobId,
    now: Timestamp,
) -> Option<SearchReport> {
    let job = state.job(beneficiary)?;
    let pass = Pass::in_flight(state);
    let search = Search::of(state, cfg, job, now, &pass)?;
    let mut tally = Tally {
        record: Some(Record::default()),
        ..Tally::default()
    };
    let planned = plan(&search, &mut tally);
    let record = tally.record.unwrap_or_default();
    let chosen = planned.and_then(|p| {
        let mut want: Vec<JobId> = p.victims.iter().map(|c| c.job).collect();
        want.sort_unstable();
        record.sets.iter().position(|s| {
            let mut got: Vec<JobId> = s.victims.iter().map(|v| v.job).collect();
            got.sort_unstable();
            s.suffices && got == want
        })
    });
    Some(SearchReport {
        cause: search.need.cause.clone(),
        quota_deficit: search.need.quota.get(),
        candidates: record.candidates,
        looked: tally.looked,
        sets: record.sets,
        chosen,
        fits_without_victims: tally.fits_without_victims,
    })
}

/// What a waiting job needs freed, if preemption may help it, with quota
/// as `ov` says it will be.
fn need_of(state: &State, ov: &QuotaOverlay, job: &Job) -> Option<Need> {
    let t = job.tenant?;
    let tenant = state.tenant(t);
    let (workers, g, level) = (job.spec.workers, job.spec.gpus_per_worker, job.level);
    match job.phase {
        Phase::Queued => {
            let need = job.quota_gpus();
            for &f in &job.flavors {
                let Some(q) = tenant.quota(f) else { continue };
                match quota::check(state, ov, t, f, need) {
                    Ok(_) => return None,
                    Err(quota::Blocked::Cohort { lendable_left, .. }) => {
                        // Reclaim: the owner's job fits its own nominal quota.
                        let used = ov.used(state, t, f);
                        if used + need <= q.nominal {
                            let draw = tenant.pool_draw(f, used + need) - tenant.pool_draw(f, used);
                            // An over-lent pool must first be brought back to
                            // what it holds.
                            let over = tenant
                                .cohort
                                .map_or(QuotaGpus::ZERO, |c| ov.over_lent(state, c, f));
                            let deficit = draw - lendable_left + over;
                            return Some(Need {
                                flavor: f,
                                level,
                                workers,
                                g,
                                quota: deficit,
                                cause: PreemptionCause::Reclaim {
                                    tenant: tenant.spec.name.clone(),
                                    flavor: state.flavor_name(f).to_string(),
                                    quota_deficit: deficit.get(),
                                },
                            });
                        }
                    }
                    // A spent budget: no one else's work is lost for it.
                    Err(quota::Blocked::Budget { .. }) => {}
                    Err(quota::Blocked::Quota { at, .. }) => {
                        let used = at.used;
                        if tenant.spec.priority_preemption {
                            // Past a limit lowered under it, the overage is
                            // freed too: the job could not start otherwise.
                            let limit = tenant.limit(f);
                            return Some(Need {
                                flavor: f,
                                level,
                                workers,
                                g,
                                quota: used + need - limit,
                                cause: PreemptionCause::Priority {
                                    tenant: tenant.spec.name.clone(),
                                    flavor: state.flavor_name(f).to_string(),
                                },
                            });
                        }
                    }
                }
            }
            None
        }
        Phase::Admitted => {
            let f = job.flavor?;
            // Within its nominal quota but without room, because borrowers
            // hold it: reclaim room (no quota is missing).
            let within = tenant
                .quota(f)
                .is_some_and(|q| ov.used(state, t, f) <= q.nominal);
            let borrowers = tenant
                .cohort
                .is_some_and(|c| !borrowers(state, ov, c, f, t).is_empty());
            if within && borrowers {
                return Some(Need {
                    flavor: f,
                    level,
                    workers,
                    g,
                    quota: QuotaGpus::ZERO,
                    cause: PreemptionCause::Reclaim {
                        tenant: tenant.spec.name.clone(),
                        flavor: state.flavor_name(f).to_string(),
                        quota_deficit: 0,
                    },
                });
            }
            if !tenant.spec.priority_preemption {
                return None;
            }
            Some(Need {
                flavor: f,
                level,
                workers,
                g,
                quota: QuotaGpus::ZERO,
                cause: PreemptionCause::Priority {
                    tenant: tenant.spec.name.clone(),
                    flavor: state.flavor_name(f).to_string(),
                },
            })
        }
        _ => None,
    }
}

/// One beneficiary's victim search: what it reads.
struct Search<'a> {
    state: &'a State,
    cfg: &'a CycleConfig,
    job: &'a Job,
    need: Need,
    now: Timestamp,
    /// What plans already made will do.
    pass: &'a Pass,
}

impl<'a> Search<'a> {
    /// The search for `job` at `now`, with quota as `pass` leaves it;
    /// `None` when preemption cannot help the job (see [`need_of`]).
    fn of(
        state: &'a State,
        cfg: &'a CycleConfig,
        job: &'a Job,
        now: Timestamp,
        pass: &'a Pass,
    ) -> Option<Self> {
        let need = need_of(state, &pass.quota_without(state, job), job)?;
        Some(Search {
            state,
            cfg,
            job,
            need,
            now,
            pass,
        })
    }
}

/// Tenants of cohort `c` other than `except` that borrow in flavor `f`,
/// with quota as `ov` says they hold it.
fn borrowers(
    state: &State,
    ov: &QuotaOverlay,
    c: crate::state::CohortIdx,
    f: FlavorIdx,
    except: TenantIdx,
) -> Vec<TenantIdx> {
    state
        .cohort(c)
        .members
        .iter()
        .copied()
        .filter(|&u| u != except && !over_nominal(state, ov, u, f).is_zero())
        .collect()
}

/// GPUs tenant `u` uses in flavor `f` above its nominal quota.
fn over_nominal(state: &State, ov: &QuotaOverlay, u: TenantIdx, f: FlavorIdx) -> QuotaGpus {
    ov.used(state, u, f) - state.tenant(u).nominal(f)
}

/// One beneficiary's victim search: what it counted.
#[derive(Default)]
struct Tally {
    /// Candidates looked at.
    looked: u64,
    /// Victim sets costed.
    sets: u64,
    /// A candidate was passed over only for being younger than `min_runtime`.
    young: bool,
    /// The beneficiary fits as things stand: nobody need leave.
    fits_without_victims: bool,
    /// What a review asked to see (`search_report`); `None` in a cycle.
    record: Option<Record>,
}

/// The search's working, kept only for a review.
#[derive(Default)]
struct Record {
    candidates: Vec<Victim>,
    sets: Vec<CostedSet>,
}

impl Tally {
    /// Records a costed set for a review; `set` is only called then, so a
    /// scheduling cycle builds nothing for it.
    fn record_set(&mut self, set: impl FnOnce() -> CostedSet) {
        if let Some(r) = self.record.as_mut() {
            r.sets.push(set());
        }
    }
}

/// The candidates a beneficiary may take from, bounded.
fn candidates(
    s: &Search,
    tally: &mut Tally,
    room: bool,
) -> (Vec<Cand>, FxHashMap<TenantIdx, QuotaGpus>) {
    let Search {
        state,
        cfg,
        job,
        ref need,
        now,
        pass,
        ..
    } = *s;
    let taken = &pass.taken;
    let young = &mut tally.young;
    let looked = &mut tally.looked;
    let p = &cfg.preemption;
    let mut out = Vec::new();
    // Per tenant: GPUs it may give up (reclaim: its usage above nominal).
    let mut slack: FxHashMap<TenantIdx, QuotaGpus> = FxHashMap::default();
    let Some(t) = job.tenant else {
        return (out, slack);
    };
    let f = need.flavor;
    let tenants: Vec<TenantIdx> = match &need.cause {
        PreemptionCause::Reclaim { .. } => {
            let Some(c) = state.tenant(t).cohort else {
                return (out, slack);
            };
            borrowers(state, &pass.held, c, f, t)
        }
        _ => vec![t],
    };
    if tenants.is_empty() {
        return (out, slack);
    }
    let per_tenant = (p.max_candidates / tenants.len()).max(1);
    let eligible = |v: &Job, young: &mut bool| -> bool {
        if taken.contains(&v.id) || !v.spec.preemptible || v.phase != Phase::Running {
            return false;
        }
        if v.started_at
            .is_none_or(|s| now.millis_since(s) < p.min_runtime_ms)
        {
            *young = true;
            return false;
        }
        !(matches!(need.cause, PreemptionCause::Priority { .. })
            && v.spec.priority >= job.spec.priority)
    };
    for &u in &tenants {
        let over = over_nominal(state, &pass.held, u, f);
        slack.insert(
            u,
            match need.cause {
                PreemptionCause::Reclaim { .. } => over,
                _ => QuotaGpus::UNLIMITED,
            },
        );
        let mut n = 0;
        for id in state.victim_candidates(u, f) {
            if n >= per_tenant {
                break;
            }
            *looked += 1;
            let Some(v) = state.job(id) else { continue };
            if !eligible(v, young) {
                continue;
            }
            n += 1;
            out.push(costed(cfg, v, now));
        }
    }
    // Room in one domain is needed: the cheapest candidates may be spread
    // thin, so the domains of the cheapest few are searched whole (at most
    // `max_sets` domains, every eligible job on their nodes).
    if room {
        let cap = state.capacity();
        let mut by_cost: Vec<&Cand> = out.iter().collect();
        by_cost.sort_by_key(|c| (c.cost / c.gpus.max(1) as u64, c.job));
        let mut domains: Vec<DomainIdx> = Vec::new();
        for c in by_cost {
            if domains.len() >= p.max_sets {
                break;
            }
            for a in &c.nodes {
                if let Some(d) = cap.node_domain(a.node, need.level) {
                    if !domains.contains(&d) && domains.len() < p.max_sets {
                        domains.push(d);
                    }
                }
            }
        }
        let mut seen: FxHashSet<JobId> = out.iter().map(|c| c.job).collect();
        for d in domains {
            for &n in &cap.domain(d).nodes {
                for id in state.nodes()[n.index()].jobs.iter().copied() {
                    let Some(v) = state.job(id) else { continue };
                    if seen.contains(&id) || v.flavor != Some(f) {
                        continue;
                    }
                    if !v.tenant.is_some_and(|vt| tenants.contains(&vt)) {
                        continue;
                    }
                    *looked += 1;
                    if eligible(v, young) {
                        seen.insert(id);
                        out.push(costed(cfg, v, now));
                    }
                }
            }
        }
    }
    match p.order {
        VictimOrder::Checkpoint => out.sort_by(|a, b| {
            // Cheapest per GPU first.
            (a.cost as u128 * b.gpus as u128)
                .cmp(&(b.cost as u128 * a.gpus as u128))
                .then(a.job.cmp(&b.job))
        }),
        VictimOrder::Kueue => {
            out.sort_by(|a, b| a.kueue_rank.cmp(&b.kueue_rank).then(a.job.cmp(&b.job)))
        }
    }
    (out, slack)
}

/// A domain as a review names it: its topology path, or its node's name
/// at the node level.
fn domain_label(state: &State, d: DomainIdx) -> String {
    let dom = state.capacity().domain(d);
    match dom.nodes.as_slice() {
        [n] if dom.name.starts_with('#') => state
            .nodes()
            .get(n.index())
            .map_or_else(|| dom.name.clone(), |x| x.spec.name.clone()),
        _ => dom.name.clone(),
    }
}

/// Nodes held by the beneficiary's own (blocked-job) reservation: not
/// schedulable for others, but its to take. Without them a job blocked for
/// room could never preempt once it holds a reservation.
fn own_reserved(state: &State, beneficiary: JobId) -> Vec<NodeId> {
    state
        .reservations()
        .get(&beneficiary)
        .map(|r| {
            r.assignments
                .iter()
                .map(|a| a.node)
                .filter(|&n| {
                    !state.capacity().is_schedulable(n)
                        && state.nodes().get(n.index()).is_some_and(|node| {
                            node.status == NodeStatus::Ready
                                && node.reserved_for == Some(beneficiary)
                        })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Free GPUs of a node the beneficiary may use (schedulable and not
/// reserved earlier in this pass, or its own reserved node), `None` if it
/// may not.
fn usable_free(state: &State, pass: &Pass, n: NodeId, own: &[NodeId]) -> Option<Gpus> {
    let cap = state.capacity();
    if pass.reserved.contains(&n) {
        None
    } else if cap.is_schedulable(n) {
        Some(cap.free_with(&pass.room, n))
    } else if own.contains(&n) {
        Some(cap.node_raw_free(n))
    } else {
        None
    }
}

/// Quota freed by a set of victims, counting only what each victim's
/// tenant may give up.
fn quota_freed(
    cands: &[Cand],
    chosen: &[usize],
    slack: &FxHashMap<TenantIdx, QuotaGpus>,
) -> QuotaGpus {
    let mut by_tenant: FxHashMap<TenantIdx, QuotaGpus> = FxHashMap::default();
    for &i in chosen {
        *by_tenant.entry(cands[i].tenant).or_default() += QuotaGpus::from(cands[i].gpus);
    }
    by_tenant
        .iter()
        .map(|(t, g)| (*g).min(slack.get(t).copied().unwrap_or_default()))
        .sum()
}

/// A victim may be added only while its tenant still has slack (reclaim:
/// still borrows; priority: always).
fn may_add(
    cands: &[Cand],
    i: usize,
    chosen: &[usize],
    slack: &FxHashMap<TenantIdx, QuotaGpus>,
) -> bool {
    let t = cands[i].tenant;
    let given: QuotaGpus = chosen
        .iter()
        .filter(|&&x| cands[x].tenant == t)
        .map(|&x| QuotaGpus::from(cands[x].gpus))
        .sum();
    given < slack.get(&t).copied().unwrap_or_default()
}

/// Adds victims until `quota` GPUs of quota are freed. Checkpoint order
/// takes, at each step, the candidate with the least cost per GPU it
/// usefully frees (no credit beyond what is still missing), so a large job
/// is not taken for a small deficit; Kueue order takes candidates in its
/// order.
fn add_for_quota(
    cands: &[Cand],
    chosen: &mut Vec<usize>,
    slack: &FxHashMap<TenantIdx, QuotaGpus>,
    quota: QuotaGpus,
    order: VictimOrder,
) {
    loop {
        let freed = quota_freed(cands, chosen, slack);
        if freed >= quota {
            return;
        }
        let missing = (quota - freed).get() as u128;
        let pick = (0..cands.len())
            .filter(|i| !chosen.contains(i) && may_add(cands, *i, chosen, slack))
            .min_by(|&a, &b| match order {
                VictimOrder::Kueue => a.cmp(&b),
                VictimOrder::Checkpoint => {
                    let useful = |i: usize| (cands[i].gpus as u128).min(missing).max(1);
                    (cands[a].cost as u128 * useful(b))
                        .cmp(&(cands[b].cost as u128 * useful(a)))
                        .then(a.cmp(&b))
                }
            });
        match pick {
            Some(i) => chosen.push(i),
            None => return,
        }
    }
}

/// The victims a search took from, and what bounds what it may take.
struct Pool<'a> {
    search: &'a Search<'a>,
    cands: Vec<Cand>,
    slack: FxHashMap<TenantIdx, QuotaGpus>,
    /// The beneficiary's own reserved nodes.
    own: Vec<NodeId>,
}

impl Pool<'_> {
    /// Whether `chosen` frees the quota missing and, in domain `d`, room.
    fn satisfied(&self, chosen: &[usize], d: Option<DomainIdx>) -> bool {
        let s = self.search;
        quota_freed(&self.cands, chosen, &self.slack) >= s.need.quota
            && d.is_none_or(|d| self.fits_after(d, chosen))
    }

    /// GPUs `chosen` free on each node of domain `d`.
    fn freed_in(&self, d: DomainIdx, chosen: &[usize]) -> FxHashMap<NodeId, Gpus> {
        let (cap, level) = (self.search.state.capacity(), self.search.need.level);
        let mut m: FxHashMap<NodeId, Gpus> = FxHashMap::default();
        for a in chosen.iter().flat_map(|&i| &self.cands[i].nodes) {
            if cap.node_domain(a.node, level) == Some(d) {
                *m.entry(a.node).or_default() += a.gpus;
            }
        }
        m
    }

    /// Whether the beneficiary fits in domain `d` once `chosen` are gone.
    fn fits_after(&self, d: DomainIdx, chosen: &[usize]) -> bool {
        let (need, pass) = (&self.search.need, self.search.pass);
        let cap = self.search.state.capacity();
        let freed = self.freed_in(d, chosen);
        // Nodes reserved earlier in this pass hold nothing for it: their free
        // GPUs are taken in the overlay and what victims free there is not its.
        let mut overrides: Vec<(NodeId, Gpus, Gpus)> = freed
            .iter()
            .filter(|(n, _)| cap.is_schedulable(**n) && !pass.reserved.contains(*n))
            .map(|(&n, &f)| {
                let now = cap.free_with(&pass.room, n);
                (n, now, now + f)
            })
            .collect();
        // Own reserved nodes are not in the domain's counts: add them whole.
        for &n in &self.own {
            if cap.node_domain(n, need.level) == Some(d) {
                let after = cap.node_raw_free(n) + freed.get(&n).copied().unwrap_or(0);
                overrides.push((n, 0, after));
            }
        }
        cap.domain_slots_with(&pass.room, d, need.g, &overrides) >= need.workers as u64
    }

    /// The nodes the beneficiary will take in `d` once `chosen` are gone:
    /// fullest first, as placement would.
    fn reserve_after(&self, d: DomainIdx, chosen: &[usize]) -> Option<Vec<Assignment>> {
        let Search {
            state, pass, need, ..
        } = self.search;
        let freed = self.freed_in(d, chosen);
        let cap = state.capacity();
        let mut nodes: Vec<(Gpus, NodeId)> = cap
            .domain(d)
            .nodes
            .iter()
            .filter_map(|&n| {
                Some((
                    usable_free(state, pass, n, &self.own)? + freed.get(&n).copied().unwrap_or(0),
                    n,
                ))
            })
            .filter(|&(free, _)| free >= need.g)
            .collect();
        // Prefer nodes the victims free, then the fullest.
        nodes.sort_unstable_by_key(|&(free, n)| (!freed.contains_key(&n), free, n));
        pack_in_order(
            nodes.into_iter().map(|(free, n)| (n, free)),
            need.workers,
            need.g,
        )
    }

    /// Drops victims, most recently added first, while the rest suffices.
    fn minimal(&self, mut chosen: Vec<usize>, d: Option<DomainIdx>) -> Vec<usize> {
        let mut i = chosen.len();
        while i > 0 {
            i -= 1;
            let mut without = chosen.clone();
            without.remove(i);
            if self.satisfied(&without, d) {
                chosen = without;
            }
        }
        chosen
    }

    /// What the search minimises: summed cost, or (Kueue) the count.
    fn key_of(&self, chosen: &[usize]) -> u64 {
        match self.search.cfg.preemption.order {
            VictimOrder::Checkpoint => chosen.iter().map(|&i| self.cands[i].cost).sum(),
            VictimOrder::Kueue => chosen.len() as u64,
        }
    }

    /// Adds victims for the quota missing.
    fn add_for_quota(&self, chosen: &mut Vec<usize>) {
        let s = self.search;
        add_for_quota(
            &self.cands,
            chosen,
            &self.slack,
            s.need.quota,
            s.cfg.preemption.order,
        );
    }

    /// Costs one set: made minimal when it suffices, recorded for a review.
    fn cost(
        &self,
        tally: &mut Tally,
        mut chosen: Vec<usize>,
        d: Option<DomainIdx>,
    ) -> Option<(u64, Vec<usize>, Option<DomainIdx>)> {
        tally.sets += 1;
        let suffices = self.satisfied(&chosen, d);
        if suffices {
            chosen = self.minimal(chosen, d);
        }
        let key = self.key_of(&chosen);
        tally.record_set(|| CostedSet {
            domain: d.map(|d| domain_label(self.search.state, d)),
            victims: chosen.iter().map(|&i| self.cands[i].victim()).collect(),
            key,
            suffices,
        });
        suffices.then_some((key, chosen, d))
    }

    /// Domains holding candidates that could hold the gang once they
    /// leave, most potential room first; among equals, the one with the
    /// cheapest candidate (cost per GPU) first.
    fn domains(&self) -> Vec<DomainIdx> {
        let Search {
            state,
            pass,
            ref need,
            ..
        } = *self.search;
        let cap = state.capacity();
        let mut potential: FxHashMap<DomainIdx, u64> = FxHashMap::default();
        let mut cheapest: FxHashMap<DomainIdx, u64> = FxHashMap::default();
        for c in &self.cands {
            for a in &c.nodes {
                if let Some(d) = cap.node_domain(a.node, need.level) {
                    if usable_free(state, pass, a.node, &self.own).is_some() {
                        *potential.entry(d).or_default() += a.gpus as u64;
                        let per_gpu = c.cost / c.gpus.max(1) as u64;
                        let e = cheapest.entry(d).or_insert(per_gpu);
                        *e = (*e).min(per_gpu);
                    }
                }
            }
        }
        // Free GPUs on its own reserved nodes are not in the domain's count.
        for &n in &self.own {
            if let Some(p) = cap
                .node_domain(n, need.level)
                .and_then(|d| potential.get_mut(&d))
            {
                *p += cap.node_raw_free(n) as u64;
            }
        }
        let mut doms: Vec<(u64, u64, DomainIdx)> = potential
            .into_iter()
            .map(|(d, p)| {
                let c = cheapest.get(&d).copied().unwrap_or(u64::MAX);
                (p + cap.dom_free(&pass.room, d) as u64, c, d)
            })
            .filter(|&(p, _, _)| p >= need.workers as u64 * need.g as u64)
            .collect();
        doms.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        doms.into_iter().map(|(_, _, d)| d).collect()
    }

    /// The set for domain `d`: in-domain victims in order until the gang
    /// fits, then any still needed to free quota.
    fn set_in(&self, d: DomainIdx) -> Vec<usize> {
        let Search {
            state, ref need, ..
        } = *self.search;
        let cap = state.capacity();
        let mut chosen: Vec<usize> = Vec::new();
        for i in 0..self.cands.len() {
            if self.fits_after(d, &chosen) {
                break;
            }
            let inside = self.cands[i]
                .nodes
                .iter()
                .any(|a| cap.node_domain(a.node, need.level) == Some(d));
            if inside && may_add(&self.cands, i, &chosen, &self.slack) {
                chosen.push(i);
            }
        }
        self.add_for_quota(&mut chosen);
        chosen
    }
}

fn plan(s: &Search, tally: &mut Tally) -> Option<Plan> {
    let Search {
        state,
        cfg,
        job,
        ref need,
        pass,
        ..
    } = *s;
    let cap = state.capacity();
    let mut probes = 0;
    let fits_in = cap.find_domain(
        &pass.room,
        need.flavor,
        need.level,
        need.workers,
        need.g,
        &mut probes,
    );
    let fits_now = fits_in.is_some();
    if fits_now && need.quota.is_zero() {
        // Room and quota both exist: placement will bind it.
        tally.fits_without_victims = true;
        return None;
    }
    let (cands, slack) = candidates(s, tally, !fits_now);
    if let Some(r) = tally.record.as_mut() {
        r.candidates = cands.iter().map(Cand::victim).collect();
    }
    if cands.is_empty() {
        return None;
    }
    let pool = Pool {
        search: s,
        cands,
        slack,
        own: own_reserved(state, job.id),
    };
    let best = if fits_now {
        // Room exists; only quota is missing.
        let mut chosen = Vec::new();
        pool.add_for_quota(&mut chosen);
        pool.cost(tally, chosen, None)
    } else {
        let mut best: Option<(u64, Vec<usize>, Option<DomainIdx>)> = None;
        for d in pool.domains().into_iter().take(cfg.preemption.max_sets) {
            let set = pool.cost(tally, pool.set_in(d), Some(d));
            if let Some(set) = set.filter(|set| best.as_ref().is_none_or(|b| set.0 < b.0)) {
                best = Some(set);
            }
        }
        best
    };
    let (_, chosen, d) = best?;
    if chosen.is_empty() {
        // It fits without anyone leaving: placement will bind it.
        tally.fits_without_victims = true;
        return None;
    }
    let reserve = match d {
        Some(d) => pool.reserve_after(d, &chosen)?,
        None => Vec::new(),
    };
    Some(Plan {
        victims: chosen.iter().map(|&i| pool.cands[i].clone()).collect(),
        reserve,
        fits_in,
    })
}

/// Preemptible backfill to evict so a reservation's job can bind now, if
/// evicting it is all that is missing. Backfill already stopping for
/// another reason in this pass (`taken`) frees its GPUs without being
/// named again.
fn backfill_to_evict(
    state: &State,
    cfg: &CycleConfig,
    owner: JobId,
    now: Timestamp,
    taken: &FxHashSet<JobId>,
) -> Option<Vec<Victim>> {
    let r = state.reservations().get(&owner)?;
    let cap = state.capacity();
    let mut victims = Vec::new();
    let mut chosen: FxHashSet<JobId> = FxHashSet::default();
    for a in &r.assignments {
        let mut free = cap.node_raw_free(a.node);
        if free >= a.gpus {
            continue;
        }
        let on_node: Vec<&Job> = r
            .backfill
            .iter()
            .filter_map(|b| state.job(*b))
            .filter(|j| j.spec.preemptible && j.phase == Phase::Running)
            .filter(|j| j.assignments.iter().any(|x| x.node == a.node))
            .collect();
        for j in on_node {
            if free >= a.gpus {
                break;
            }
            free += j
                .assignments
                .iter()
                .filter(|x| x.node == a.node)
                .map(|x| x.gpus)
                .sum::<Gpus>();
            if !taken.contains(&j.id) && chosen.insert(j.id) {
                let c = costed(cfg, j, now);
                victims.push(Victim {
                    job: j.id,
                    // Backfill knew it borrowed reserved nodes: no grace.
                    deadline: now,
                    expected_lost_gpu_ms: c.lost,
                    cost: c.cost,
                });
            }
        }
        if free < a.gpus {
            // Something other than preemptible backfill still holds the node.
            return None;
        }
    }
    (!victims.is_empty()).then_some(victims)
}

/// Worked examples of a victim's cost, each checkable by hand with the
/// default `PreemptionConfig`: grace 30 s, restart cost 60 s, thrash window
/// 1 h and penalty 600 s, checkpoint grace up to 300 s, wait window W 30 s.
/// Costs are GPU-milliseconds.
#[cfg(test)]
mod cost_examples {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::state::Checkpoint;
    use gpusched_model::{CheckpointPolicy, FlavorQuota, JobSpec, NodeSpec, TenantSpec};

    const START: Timestamp = Timestamp(1_000_000);

    /// Given one 1×8 job of `checkpoint` started at `START` on an 8-GPU
    /// node: the job as the state holds it.
    fn running(checkpoint: Option<CheckpointPolicy>) -> Job {
        let mut s = State::new();
        let job = JobId(1);
        let spec = JobSpec {
            topology: "node".into(),
            checkpoint,
            ..JobSpec::new("ml", 1, 8)
        };
        let events = [
            Event::TenantConfigured {
                spec: TenantSpec::new("ml", vec![FlavorQuota::new("h100", 8)]),
            },
            Event::NodeAdded {
                node: NodeId(0),
                spec: NodeSpec::new("n0", "h100", 8, &["r0", "b0"]),
                at: Timestamp(0),
            },
            Event::JobSubmitted {
                job,
                spec,
                at: Timestamp(0),
            },
            Event::JobAccepted { job },
            Event::JobAdmitted {
                job,
                flavor: "h100".into(),
                borrowed: 0,
                at: Timestamp(0),
            },
            Event::JobBound {
                job,
                assignments: vec![Assignment {
                    node: NodeId(0),
                    gpus: 8,
                }],
                backfill_for: None,
                at: Timestamp(0),
            },
            Event::JobStarted { job, at: START },
        ];
        for e in &events {
            s.apply(e).unwrap();
        }
        s.job(job).unwrap().clone()
    }

    fn policy(interval_s: u64, duration_s: u64) -> Option<CheckpointPolicy> {
        Some(CheckpointPolicy {
            interval_s,
            duration_s,
        })
    }

    fn cost(job: &Job, now: u64, order: VictimOrder) -> (u64, u64, u64) {
        let mut cfg = CycleConfig::default();
        cfg.preemption.order = order;
        let c = costed(&cfg, job, Timestamp(now));
        (c.lost, c.cost, c.deadline.0)
    }

    /// (lost, cost, deadline) of stopping `job` 600 s after it started.
    fn at_600_s(job: &Job) -> (u64, u64, u64) {
        cost(job, 1_600_000, VictimOrder::Checkpoint)
    }

    #[test]
    fn without_checkpoints_a_victim_loses_all_it_ran_plus_the_grace() {
        // When: stopped 600 s after it started.
        let job = running(None);
        // Then: lost 8 × (600 s + 30 s grace); cost adds 8 × 60 s restart;
        // stopped at the end of the grace.
        assert_eq!(at_600_s(&job), (5_040_000, 5_520_000, 1_630_000));
    }

    #[test]
    fn a_complete_checkpoint_bounds_the_loss_to_the_work_after_it() {
        // Given: a complete checkpoint capturing its first 400 s.
        let mut job = running(None);
        job.last_checkpoint = Some(Checkpoint {
            progress_ms: 400_000,
            uri: "s3://c".into(),
            at: Timestamp(1_410_000),
            flavor: 0,
        });
        // Then at 600 s: lost 8 × (200 s + 30 s), cost + 8 × 60 s.
        assert_eq!(at_600_s(&job), (1_840_000, 2_320_000, 1_630_000));
    }

    #[test]
    fn a_short_checkpoint_is_asked_for_and_only_its_own_time_is_lost() {
        // Given: checkpoints of 60 s every hour, none taken yet.
        let job = running(policy(3600, 60));
        // Then at 600 s: lost 8 × 60 s, cost + 8 × 60 s restart, and the
        // deadline leaves the checkpoint 60 s + 5 s (more than the grace).
        assert_eq!(at_600_s(&job), (480_000, 960_000, 1_665_000));
        // A checkpoint shorter than the grace: the grace is the deadline.
        let quick = running(policy(3600, 20));
        assert_eq!(at_600_s(&quick), (160_000, 640_000, 1_630_000));
    }

    #[test]
    fn a_checkpoint_longer_than_its_grace_is_not_asked_for() {
        // Given: checkpoints of 400 s (over the 300 s checkpoint grace).
        let job = running(policy(3600, 400));
        // Then: costed as a stop without one.
        assert_eq!(at_600_s(&job), (5_040_000, 5_520_000, 1_630_000));
    }

    #[test]
    fn a_periodic_checkpoint_completing_within_w_is_waited_for() {
        // Given: 400 s checkpoints every 600 s; the first started at 600 s
        // and completes at 1000 s. When: 10 s before it completes.
        let job = running(policy(600, 400));
        let now = START.0 + 990_000;
        // Then: stopped after it (completion + 1 s, at least the grace):
        // lost only its 8 × 400 s, cost + 8 × 60 s.
        assert_eq!(
            cost(&job, now, VictimOrder::Checkpoint),
            (3_200_000, 3_680_000, now + 30_000)
        );
        // Kueue's order ignores checkpoints: 8 × (990 s + 30 s) lost.
        assert_eq!(
            cost(&job, now, VictimOrder::Kueue),
            (8_160_000, 8_640_000, now + 30_000)
        );
        // Exactly W (30 s) before: waited for, and stopped 1 s after it
        // completes, past the grace.
        let at_w = START.0 + 970_000;
        assert_eq!(
            cost(&job, at_w, VictimOrder::Checkpoint),
            (3_200_000, 3_680_000, START.0 + 1_001_000)
        );
        // 31 s before it completes (past W): not waited for.
        let early = START.0 + 969_000;
        assert_eq!(cost(&job, early, VictimOrder::Checkpoint).0, 8 * 999_000);
    }

    #[test]
    fn a_victim_preempted_within_the_thrash_window_pays_the_penalty() {
        let mut job = running(None);
        let now = 5_000_000;
        // Given: preempted 3,599 s ago (inside the 1 h window).
        job.preempted_at = Some(Timestamp(now - 3_599_000));
        let lost = 8 * (4_000_000 + 30_000);
        // Then: cost = lost + 8 × 60 s restart + 8 × 600 s penalty.
        assert_eq!(
            cost(&job, now, VictimOrder::Checkpoint),
            (lost, lost + 480_000 + 4_800_000, now + 30_000)
        );
        // Exactly one window ago: no penalty.
        job.preempted_at = Some(Timestamp(now - 3_600_000));
        assert_eq!(cost(&job, now, VictimOrder::Checkpoint).1, lost + 480_000);
    }

    #[test]
    fn the_next_periodic_checkpoint_completes_after_now() {
        // 400 s checkpoints every 600 s from START: they complete at
        // START + 1000 s, + 1600 s, …
        let job = running(policy(600, 400));
        let at = |ms: u64| next_checkpoint_done(&job, Timestamp(START.0 + ms));
        assert_eq!(at(500_000), Some(Timestamp(START.0 + 1_000_000)));
        // At the moment one completes, the next one is the one ahead.
        assert_eq!(at(1_000_000), Some(Timestamp(START.0 + 1_600_000)));
        assert_eq!(at(1_000_001), Some(Timestamp(START.0 + 1_600_000)));
        // No policy, or an interval of 0: none.
        assert_eq!(next_checkpoint_done(&running(None), START), None);
        let mut never = job.clone();
        never.spec.checkpoint = policy(0, 10);
        assert_eq!(
            next_checkpoint_done(&never, Timestamp(START.0 + 5_000)),
            None
        );
        // Not started: none.
        let mut queued = job;
        queued.started_at = None;
        assert_eq!(
            next_checkpoint_done(&queued, Timestamp(START.0 + 5_000)),
            None
        );
    }
}
