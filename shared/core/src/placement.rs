//! Placement: the only GPU allocator, with reservations and backfill.
//!
//! Owns: binding admitted gangs all-or-nothing inside one domain of the
//! level they ask for, preferring the fullest domain that fits and, inside
//! it, the fullest nodes, so large holes stay whole. Jobs are taken per
//! flavor by priority then admission order; a job that does not fit waits
//! with `NoDomainFits` while smaller ones behind it may go. The first R
//! blocked jobs get a reservation: specific nodes in one domain, held from
//! the earliest time the running jobs' declared max runtimes guarantee
//! (or with no start, where a running job declares none). Other jobs may
//! backfill reserved nodes only if they end before the reservation starts
//! or are preemptible (preemption evicts them when the nodes are needed).
//!
//! Must never: charge quota, or probe more than `max_heads` jobs a cycle. A
//! flavor whose last pass placed nothing more is skipped until its capacity
//! version changes (GPUs freed, nodes added, new jobs admitted).

use crate::capacity::{pack_in_order, CapacityOverlay, DomainIdx, FlavorIdx};
use crate::limits::{CycleConfig, PlacementStats, ScanMemo};
use crate::state::{Job, Phase, QueueKey, Reservation, State};
use gpusched_events::{Assignment, Event, PendingReason};
use gpusched_model::{Gpus, JobId, NodeId, Timestamp};
use rustc_hash::{FxHashMap, FxHashSet};

/// What this pass took outside the capacity index: GPUs on reserved
/// nodes, and nodes it reserved.
#[derive(Default)]
struct Held {
    gpus: FxHashMap<NodeId, Gpus>,
    reserved: FxHashSet<NodeId>,
}

impl Held {
    fn free(&self, state: &State, n: NodeId) -> Gpus {
        state
            .capacity()
            .node_raw_free(n)
            .saturating_sub(self.gpus.get(&n).copied().unwrap_or(0))
    }
    fn take(&mut self, a: &[Assignment]) {
        for x in a {
            *self.gpus.entry(x.node).or_default() += x.gpus;
        }
    }
}

fn node_ready(state: &State, n: NodeId) -> bool {
    state
        .nodes()
        .get(n.index())
        .is_some_and(|node| node.status == crate::state::NodeStatus::Ready)
}

/// Binds up to `cfg.max_heads` admitted jobs, round-robin across flavors:
/// first the reserved jobs whose nodes are free now, then each flavor's
/// admitted jobs in order, until a flavor has `max_heads_per_tenant`
/// blocked jobs or nothing more can fit in it.
pub fn decide(
    state: &State,
    memo: &mut ScanMemo,
    cfg: &CycleConfig,
    now: Timestamp,
) -> (Vec<Event>, PlacementStats) {
    let mut pass = Pass::new(state, cfg, now);
    pass.bind_reserved();
    // (flavor, cursor, jobs examined in this flavor that did not fit)
    let mut active: Vec<(FlavorIdx, Option<QueueKey>, usize)> = (0..state.flavors().len())
        .map(|f| f as FlavorIdx)
        .filter(|&f| state.unplaced_after(f, None).is_some())
        .filter(|&f| !still_blocked(state, memo, f))
        .map(|f| (f, None, 0))
        .collect();
    while !active.is_empty() && (pass.stats.heads_examined as usize) < cfg.max_heads {
        let mut i = 0;
        while i < active.len() && (pass.stats.heads_examined as usize) < cfg.max_heads {
            let (f, cursor, mut blocked) = active[i];
            let Some(key) = state.unplaced_after(f, cursor) else {
                pass.park(memo, f);
                active.swap_remove(i);
                continue;
            };
            pass.stats.heads_examined += 1;
            let job = state.job(key.job).filter(|_| !pass.done.contains(&key.job));
            if let Some(job) = job {
                if !pass.place(job, f) {
                    blocked += 1;
                    pass.reserve(memo, job, f);
                    pass.record_pending(job, f);
                }
            }
            active[i] = (f, Some(key), blocked);
            if blocked >= cfg.max_heads_per_tenant || pass.exhausted(f) {
                pass.park(memo, f);
                active.swap_remove(i);
                continue;
            }
            i += 1;
        }
    }
    (pass.events, pass.stats)
}

/// A flavor found blocked stays so while its capacity and the number of
/// reservations held (a budget all flavors share) stay the same, and,
/// where a stale reservation's re-plan was skipped (`replan_skipped`),
/// while nothing its plan reads changes either.
fn blocked_stamp(state: &State, f: FlavorIdx, replan_skipped: bool) -> (u64, usize, Option<u64>) {
    (
        state.capacity_version(f),
        state.reservations().len(),
        replan_skipped.then(|| state.placement_version(f)),
    )
}

/// Whether flavor `f` is parked in the memo and nothing it waits for moved.
fn still_blocked(state: &State, memo: &ScanMemo, f: FlavorIdx) -> bool {
    memo.flavor_blocked
        .get(&f)
        .is_some_and(|&parked| parked == blocked_stamp(state, f, parked.2.is_some()))
}

/// What a stale reservation's re-plan in flavor `f` reads from the state.
fn replan_stamp(state: &State, f: FlavorIdx) -> (FlavorIdx, u64, u64) {
    (f, state.capacity_version(f), state.placement_version(f))
}

/// One placement pass: what it has taken and decided so far.
struct Pass<'a> {
    state: &'a State,
    cfg: &'a CycleConfig,
    now: Timestamp,
    ov: CapacityOverlay,
    held: Held,
    stats: PlacementStats,
    events: Vec<Event>,
    /// Jobs bound, backfilled or given a reservation in this pass.
    done: FxHashSet<JobId>,
    /// Reservations held for blocked jobs (not for preemption), counting
    /// this pass's.
    blocked_reservations: usize,
    /// Flavors where this pass planned (or tried to plan) a reservation:
    /// they are looked at again next cycle rather than parked, since the
    /// plan depends on this pass's own placements.
    reserving: FxHashSet<FlavorIdx>,
    /// Flavors where this pass took GPUs or reserved nodes: a re-plan
    /// there reads this pass's overlay too, so it is neither skipped nor
    /// remembered.
    touched: FxHashSet<FlavorIdx>,
    /// Flavors where a stale reservation's re-plan was skipped because
    /// nothing it reads had changed.
    replan_skipped: FxHashSet<FlavorIdx>,
}

impl<'a> Pass<'a> {
    fn new(state: &'a State, cfg: &'a CycleConfig, now: Timestamp) -> Self {
        Pass {
            state,
            cfg,
            now,
            ov: CapacityOverlay::default(),
            held: Held::default(),
            stats: PlacementStats::default(),
            events: Vec::new(),
            done: FxHashSet::default(),
            blocked_reservations: state
                .reservations()
                .values()
                .filter(|r| !r.for_preemption)
                .count(),
            reserving: FxHashSet::default(),
            touched: FxHashSet::default(),
            replan_skipped: FxHashSet::default(),
        }
    }

    /// Notes the flavors of nodes this pass takes GPUs on or reserves.
    fn touch(&mut self, assignments: &[Assignment]) {
        let nodes = self.state.nodes();
        self.touched.extend(
            assignments
                .iter()
                .filter_map(|a| nodes.get(a.node.index()).map(|n| n.flavor)),
        );
    }

    fn bound(&mut self, job: JobId, assignments: Vec<Assignment>, backfill_for: Option<JobId>) {
        self.touch(&assignments);
        self.done.insert(job);
        self.stats.bound += 1;
        self.events.push(Event::JobBound {
            job,
            assignments,
            backfill_for,
            at: self.now,
        });
    }

    /// Reserved jobs whose nodes are all free now bind there.
    fn bind_reserved(&mut self) {
        let state = self.state;
        for (&owner, r) in state.reservations() {
            let Some(job) = state.job(owner).filter(|j| j.phase == Phase::Admitted) else {
                continue;
            };
            let ready = r.assignments.iter().all(|a| {
                node_ready(state, a.node)
                    && Some(state.nodes()[a.node.index()].flavor) == job.flavor
                    && self.held.free(state, a.node) >= a.gpus
            });
            if ready {
                self.held.take(&r.assignments);
                self.bound(owner, r.assignments.clone(), None);
            }
        }
    }

    /// Binds `job` in the fullest domain of flavor `f` that fits, or as
    /// backfill on reserved nodes it cannot delay; false if neither.
    fn place(&mut self, job: &Job, f: FlavorIdx) -> bool {
        let (w, g) = (job.spec.workers, job.spec.gpus_per_worker);
        let cap = self.state.capacity();
        let found = cap
            .find_domain(&self.ov, f, job.level, w, g, &mut self.stats.domains_probed)
            .and_then(|d| cap.choose_nodes(&self.ov, d, w, g));
        if let Some(assignments) = found {
            cap.take(&mut self.ov, &assignments);
            self.bound(job.id, assignments, None);
            return true;
        }
        let backfill = (self.cfg.reservations > 0)
            .then(|| backfill(self.state, &self.held, &self.done, job, self.now))
            .flatten();
        let Some((owner, assignments)) = backfill else {
            return false;
        };
        self.held.take(&assignments);
        self.stats.backfilled += 1;
        self.bound(job.id, assignments, Some(owner));
        true
    }

    /// Plans a reservation for blocked `job` while the budget allows one,
    /// or re-plans its own stale one; a new plan replaces the old only if
    /// it starts earlier and takes no node another plan of this pass holds.
    fn reserve(&mut self, memo: &mut ScanMemo, job: &Job, f: FlavorIdx) {
        if self.cfg.reservations == 0 {
            return;
        }
        let own = self.state.reservations().get(&job.id);
        let replan = match own {
            None => self.blocked_reservations < self.cfg.reservations,
            // Re-planned each time it is looked at while stale: its start
            // depends on the clock and on victims' deadlines, which no
            // version stamps.
            Some(r) => !r.for_preemption && r.stale,
        };
        if !replan {
            return;
        }
        // A stale reservation whose last re-plan found nothing better, with
        // nothing it reads changed since: the same plan again.
        let stamp =
            (own.is_some() && !self.touched.contains(&f)).then(|| replan_stamp(self.state, f));
        if stamp.is_some() && memo.reservation_checked.get(&job.id) == stamp.as_ref() {
            self.replan_skipped.insert(f);
            return;
        }
        self.reserving.insert(f);
        let plan = plan_reservation(
            self.state,
            &self.ov,
            &self.held,
            self.cfg,
            job,
            f,
            self.now,
            &mut self.stats.domains_probed,
        );
        let better_plan = plan.filter(|(assignments, start)| {
            own.is_none_or(|r| earlier(*start, r.start))
                && !assignments
                    .iter()
                    .any(|a| self.held.reserved.contains(&a.node))
        });
        let Some((assignments, start)) = better_plan else {
            if let Some(stamp) = stamp {
                memo.reservation_checked.insert(job.id, stamp);
            }
            return;
        };
        memo.reservation_checked.remove(&job.id);
        if own.is_none() {
            self.blocked_reservations += 1;
        }
        self.done.insert(job.id);
        self.hold_reserved(&assignments);
        self.stats.reservations += 1;
        self.events.push(Event::ReservationMade {
            job: job.id,
            assignments,
            start,
            at: self.now,
        });
    }

    /// Later jobs of this pass keep off these reserved nodes.
    fn hold_reserved(&mut self, assignments: &[Assignment]) {
        self.touch(assignments);
        let cap = self.state.capacity();
        for a in assignments {
            self.held.reserved.insert(a.node);
            let free = cap.free_with(&self.ov, a.node);
            if free > 0 {
                cap.take(
                    &mut self.ov,
                    &[Assignment {
                        node: a.node,
                        gpus: free,
                    }],
                );
            }
        }
    }

    /// Records why `job` waits, when the reason's kind changed.
    fn record_pending(&mut self, job: &Job, f: FlavorIdx) {
        let state = self.state;
        let reason = PendingReason::NoDomainFits {
            flavor: state.flavor_name(f).to_string(),
            level: state.level_name(job.level).to_string(),
            workers: job.spec.workers,
            gpus_per_worker: job.spec.gpus_per_worker,
            largest_free: state.capacity().largest_free(&self.ov, f, job.level),
        };
        if job.last_reason.as_ref().map(|r| r.kind()) != Some(reason.kind()) {
            self.events.push(Event::JobPending {
                job: job.id,
                reason,
                at: self.now,
            });
        }
    }

    /// Nothing more fits once no schedulable node of the flavor has a free
    /// GPU, no reserved node may take backfill and no blocked job is owed
    /// a reservation (explain still answers for the jobs behind).
    fn exhausted(&self, f: FlavorIdx) -> bool {
        self.state.capacity().largest_free(&self.ov, f, 0) == 0
            && self.state.reservations().is_empty()
            && (self.cfg.reservations == 0 || self.blocked_reservations >= self.cfg.reservations)
    }

    /// Parks flavor `f` in the memo until its stamp changes, unless this
    /// pass planned a reservation in it.
    fn park(&self, memo: &mut ScanMemo, f: FlavorIdx) {
        if !self.reserving.contains(&f) {
            let skipped = self.replan_skipped.contains(&f);
            memo.flavor_blocked
                .insert(f, blocked_stamp(self.state, f, skipped));
        }
    }
}

/// Whether start `a` is strictly earlier than `b` (a known start beats none).
fn earlier(a: Option<Timestamp>, b: Option<Timestamp>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x < y,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Whether `job` may backfill reservation `r`: it ends before `r` starts,
/// or it is preemptible.
pub fn may_backfill(job: &Job, r: &Reservation, now: Timestamp) -> bool {
    let ends_before = match (r.start, job.spec.max_runtime_s) {
        (Some(start), Some(max)) => now.plus_secs(max) <= start,
        _ => false,
    };
    job.spec.preemptible || ends_before
}

/// Packs a gang onto some of `nodes` (free GPUs given) inside one domain of
/// the job's level, fullest nodes first.
fn pack(state: &State, job: &Job, nodes: &[(NodeId, Gpus)]) -> Option<Vec<Assignment>> {
    let (w, g) = (job.spec.workers, job.spec.gpus_per_worker);
    let mut groups: FxHashMap<Option<DomainIdx>, Vec<(Gpus, NodeId)>> = FxHashMap::default();
    for &(n, free) in nodes {
        if free >= g {
            groups
                .entry(state.capacity().node_domain(n, job.level))
                .or_default()
                .push((free, n));
        }
    }
    let mut keys: Vec<Option<DomainIdx>> = groups.keys().copied().collect();
    keys.sort_unstable();
    for k in keys {
        let mut v = groups.remove(&k).unwrap_or_default();
        v.sort_unstable();
        if let Some(out) = pack_in_order(v.into_iter().map(|(free, n)| (n, free)), w, g) {
            return Some(out);
        }
    }
    None
}

/// A reservation's nodes a blocked job may backfill now, if any.
/// Reservations bound or re-planned earlier in the pass (`changed`) are
/// left alone.
fn backfill(
    state: &State,
    held: &Held,
    changed: &FxHashSet<JobId>,
    job: &Job,
    now: Timestamp,
) -> Option<(JobId, Vec<Assignment>)> {
    let f = job.flavor?;
    for (&owner, r) in state.reservations() {
        if owner == job.id
            || r.for_preemption
            || changed.contains(&owner)
            || !may_backfill(job, r, now)
        {
            continue;
        }
        let nodes: Vec<(NodeId, Gpus)> = r
            .assignments
            .iter()
            .filter(|a| node_ready(state, a.node) && state.nodes()[a.node.index()].flavor == f)
            .map(|a| (a.node, held.free(state, a.node)))
            .collect();
        if let Some(assignments) = pack(state, job, &nodes) {
            return Some((owner, assignments));
        }
    }
    None
}

/// One domain's reservation plan for `w` workers of `g` GPUs: the nodes,
/// the start (`None` when some job in the way declares no max runtime) and
/// the GPUs free there now; `None` when the gang cannot be packed there
/// even once every job is gone.
///
/// Per usable node: free now and (end, GPUs) of the jobs holding it. The
/// start is the earliest end by which enough worker slots are free; the
/// slots are counted as each end adds its GPUs, not summed again.
fn plan_in_domain(
    state: &State,
    ov: &CapacityOverlay,
    held: &Held,
    dom: &crate::capacity::Domain,
    w: u32,
    g: Gpus,
    now: Timestamp,
) -> Option<(Vec<Assignment>, Option<Timestamp>, u64)> {
    let cap = state.capacity();
    // (node, free now, free at the start, GPUs of jobs with no known end)
    let mut nodes: Vec<(NodeId, Gpus, Gpus, Gpus)> = Vec::with_capacity(dom.nodes.len());
    // (end, node, GPUs, index in `nodes`)
    let mut ends: Vec<(Timestamp, NodeId, Gpus, usize)> = Vec::new();
    for &n in &dom.nodes {
        let node = &state.nodes()[n.index()];
        if node.status != crate::state::NodeStatus::Ready
            || node.reserved_for.is_some()
            || held.reserved.contains(&n)
        {
            continue;
        }
        let fr = cap.free_with(ov, n).min(held.free(state, n));
        let i = nodes.len();
        let mut unknown: Gpus = 0;
        for j in node.jobs.iter().filter_map(|j| state.job(*j)) {
            let gpus: Gpus = j
                .assignments
                .iter()
                .filter(|a| a.node == n)
                .map(|a| a.gpus)
                .sum();
            match guaranteed_end(j, now) {
                Some(t) => ends.push((t.max(now), n, gpus, i)),
                None => unknown += gpus,
            }
        }
        nodes.push((n, fr, fr, unknown));
    }
    ends.sort_unstable();
    let mut slots: u64 = nodes.iter().map(|&(_, x, _, _)| (x / g) as u64).sum();
    let mut start = (slots >= w as u64).then_some(now);
    if start.is_none() {
        for &(t, _, gpus, i) in &ends {
            let at_t = &mut nodes[i].2;
            slots -= (*at_t / g) as u64;
            *at_t += gpus;
            slots += (*at_t / g) as u64;
            if slots >= w as u64 {
                start = Some(t);
                break;
            }
        }
    }
    // Nodes: at the start, most free first; with no start, most free
    // eventually (all jobs gone) and soonest first.
    let mut order: Vec<(Gpus, Gpus, NodeId)> = nodes
        .iter()
        .map(|&(n, _, x, unknown)| match start {
            Some(_) => (x, x, n),
            None => (x + unknown, x, n),
        })
        .collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = pack_in_order(order.into_iter().map(|(x, _, n)| (n, x)), w, g)?;
    out.sort_unstable_by_key(|a| a.node);
    let free_now: u64 = nodes.iter().map(|&(_, x, _, _)| x as u64).sum();
    Some((out, start, free_now))
}

/// Orders reservation plans: a known start first, then the earliest, then
/// the domain with the most free GPUs now, then the domain index.
type ReservationKey = (bool, u64, i64, DomainIdx);

/// When each GPU-holding job on a node is guaranteed to be gone.
fn guaranteed_end(job: &Job, now: Timestamp) -> Option<Timestamp> {
    match job.phase {
        Phase::Preempting => job.preempt.map(|(deadline, _)| deadline),
        Phase::Running => Some(job.started_at?.plus_secs(job.spec.max_runtime_s?)),
        Phase::Bound => Some(now.plus_secs(job.spec.max_runtime_s?)),
        _ => None,
    }
}

/// Plans a reservation for a blocked job: over up to
/// `cfg.reservation_domains` domains of its level (most free first), the
/// earliest time the domain is guaranteed to hold the gang, from running
/// jobs' declared max runtimes. Returns the nodes and the start (`None`
/// when some job in the way declares no max runtime).
#[allow(clippy::too_many_arguments)]
fn plan_reservation(
    state: &State,
    ov: &CapacityOverlay,
    held: &Held,
    cfg: &CycleConfig,
    job: &Job,
    f: FlavorIdx,
    now: Timestamp,
    probes: &mut u64,
) -> Option<(Vec<Assignment>, Option<Timestamp>)> {
    let cap = state.capacity();
    let (w, g) = (job.spec.workers, job.spec.gpus_per_worker);
    // (no start known, start, -free now, domain) → best is the minimum.
    let mut best: Option<(ReservationKey, Vec<Assignment>, Option<Timestamp>)> = None;
    for d in cap
        .domains_by_free_desc(f, job.level)
        .take(cfg.reservation_domains)
    {
        *probes += 1;
        let Some((out, start, free_now)) =
            plan_in_domain(state, ov, held, cap.domain(d), w, g, now)
        else {
            continue;
        };
        let key = (
            start.is_none(),
            start.map_or(0, |t| t.0),
            -(free_now as i64),
            d,
        );
        if best.as_ref().is_none_or(|b| key < b.0) {
            best = Some((key, out, start));
        }
    }
    best.map(|(_, a, s)| (a, s))
}
