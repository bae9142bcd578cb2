//! Quota: admits queued jobs against the quota ledger in fair-share order.
//!
//! Owns: the quota check (usage ≤ nominal + borrowing limit, cohort lending
//! ≤ what members lend), flavor choice in the job's preference order, and
//! the order in which tenants' heads are examined: tenants that stay within
//! nominal first, then borrowers by lowest weighted dominant share (of
//! what they borrow now, or, where their cohort keeps use with a
//! half-life, of their decayed use); within a tenant, priority then submit
//! order. At most `max_heads` heads a cycle. A
//! best-effort queue lets jobs pass a blocked head only until that head has
//! waited `starvation_ms`: then it holds the queue, so a stream of small jobs
//! cannot starve a large one.
//!
//! Must never: allocate GPUs (placement does), or scan a whole queue: a
//! strict-FIFO tenant stops at its blocked head, a best-effort one looks at
//! most `max_heads_per_tenant` deep a cycle (the next cycle goes on after
//! the last job it looked at, until the whole queue has been looked at),
//! and a tenant whose last look found nothing admissible is skipped until
//! its queue or cohort changes.

use crate::capacity::{CapacityOverlay, FlavorIdx};
use crate::limits::{CycleConfig, QuotaStats, ScanMemo, TenantResume};
use crate::quota_gpus::QuotaGpus;
use crate::state::{CohortIdx, Job, QueueKey, State, TenantIdx};
use gpusched_events::{Event, PendingReason};
use gpusched_model::{Gpus, QueueingMode, Timestamp};
use rustc_hash::FxHashMap;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// Quota charged earlier in the same cycle.
#[derive(Clone, Debug, Default)]
pub struct QuotaOverlay {
    usage: FxHashMap<(TenantIdx, FlavorIdx), QuotaGpus>,
    pool: FxHashMap<(CohortIdx, FlavorIdx), QuotaGpus>,
}

impl QuotaOverlay {
    /// A tenant's usage counting this cycle's admissions.
    pub fn used(&self, state: &State, t: TenantIdx, f: FlavorIdx) -> QuotaGpus {
        self.usage
            .get(&(t, f))
            .copied()
            .unwrap_or_else(|| state.tenant(t).used(f))
    }
    /// GPUs drawn from cohort `c`'s pool in `f`, counting this cycle's
    /// admissions.
    pub fn pool_used(&self, state: &State, c: CohortIdx, f: FlavorIdx) -> QuotaGpus {
        self.pool
            .get(&(c, f))
            .copied()
            .unwrap_or_else(|| state.cohort(c).used(f))
    }
    /// GPUs drawn from cohort `c`'s pool in `f` past what it holds, as
    /// `Cohort::over_lent`, counting this cycle's admissions and releases.
    pub fn over_lent(&self, state: &State, c: CohortIdx, f: FlavorIdx) -> QuotaGpus {
        self.pool_used(state, c, f) - state.cohort(c).capacity(f)
    }
    /// Records an admission.
    pub fn charge(&mut self, state: &State, t: TenantIdx, f: FlavorIdx, need: QuotaGpus) {
        let used = self.used(state, t, f);
        let tenant = state.tenant(t);
        if let Some(c) = tenant.cohort {
            let delta = tenant.pool_draw(f, used + need) - tenant.pool_draw(f, used);
            let p = self.pool_used(state, c, f) + delta;
            self.pool.insert((c, f), p);
        }
        self.usage.insert((t, f), used + need);
    }
    /// Records `gpus` of tenant `t` in flavor `f` given back (a victim that
    /// is stopping): the inverse of `charge`.
    pub fn release(&mut self, state: &State, t: TenantIdx, f: FlavorIdx, gpus: QuotaGpus) {
        let used = self.used(state, t, f);
        let left = used - gpus;
        let tenant = state.tenant(t);
        if let Some(c) = tenant.cohort {
            let delta = tenant.pool_draw(f, used) - tenant.pool_draw(f, left);
            let p = self.pool_used(state, c, f) - delta;
            self.pool.insert((c, f), p);
        }
        self.usage.insert((t, f), left);
    }
}

/// A flavor with room in the quota for a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    /// The flavor.
    pub flavor: FlavorIdx,
    /// GPUs of the job above the tenant's nominal quota.
    pub borrowed: Gpus,
}

/// Where a tenant stands in a flavor when a job of `need` GPUs does not
/// fit its quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// Flavor.
    pub flavor: FlavorIdx,
    /// Tenant usage.
    pub used: QuotaGpus,
    /// Tenant nominal quota.
    pub nominal: QuotaGpus,
    /// GPUs the job needs.
    pub need: QuotaGpus,
}

impl Standing {
    /// The flavor's name, then used, nominal and need, as `PendingReason`
    /// records them.
    fn words(&self, state: &State) -> (String, [Gpus; 3]) {
        let name = state.flavor_name(self.flavor).to_string();
        (
            name,
            [self.used, self.nominal, self.need].map(QuotaGpus::get),
        )
    }
}

/// Why a tenant cannot take more GPUs of a flavor: numbers only, cheap to
/// make; `reason` renders the `PendingReason` when one is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Usage plus the job would pass nominal + borrowing limit.
    Quota {
        /// The tenant in the flavor.
        at: Standing,
        /// GPUs it may still borrow.
        borrowable: QuotaGpus,
    },
    /// The cohort has too little left to lend.
    Cohort {
        /// The tenant in the flavor.
        at: Standing,
        /// Cohort.
        cohort: CohortIdx,
        /// GPUs the cohort can still lend.
        lendable_left: QuotaGpus,
    },
    /// The tenant's GPU-hour budget in the flavor is spent, and its policy
    /// is to wait for the next period.
    Budget {
        /// Flavor.
        flavor: FlavorIdx,
        /// The tenant.
        tenant: TenantIdx,
    },
}

impl Blocked {
    /// The reason as recorded in `JobPending`.
    pub fn reason(&self, state: &State) -> PendingReason {
        match *self {
            Blocked::Quota { at, borrowable } => {
                let (flavor, [used, nominal, need]) = at.words(state);
                PendingReason::QuotaExceeded {
                    flavor,
                    used,
                    nominal,
                    borrowable: borrowable.get(),
                    need,
                }
            }
            Blocked::Cohort {
                at,
                cohort,
                lendable_left,
            } => {
                let (flavor, [used, nominal, need]) = at.words(state);
                PendingReason::CohortExhausted {
                    flavor,
                    cohort: state.cohort(cohort).name.clone(),
                    used,
                    nominal,
                    lendable_left: lendable_left.get(),
                    need,
                }
            }
            Blocked::Budget { flavor, tenant } => {
                let ledger = state.tenant(tenant).budget(flavor);
                let budget = ledger.map(|l| l.budget);
                let spent_in = ledger.and_then(|l| l.spent_in).unwrap_or_default();
                PendingReason::BudgetSpent {
                    flavor: state.flavor_name(flavor).to_string(),
                    gpu_hours: budget.map_or(0, |b| b.gpu_hours),
                    period: budget.map_or("", |b| b.period.name()).to_string(),
                    renews_at: budget.map_or(spent_in, |b| b.period.next_start(spent_in)),
                }
            }
        }
    }

    /// The kind of the reason it renders to.
    pub fn kind(&self) -> &'static str {
        match self {
            Blocked::Quota { .. } => "quota_exceeded",
            Blocked::Cohort { .. } => "cohort_exhausted",
            Blocked::Budget { .. } => "budget_spent",
        }
    }
}

/// Whether tenant `t` may take `need` more GPUs of flavor `f`.
pub fn check(
    state: &State,
    ov: &QuotaOverlay,
    t: TenantIdx,
    f: FlavorIdx,
    need: QuotaGpus,
) -> Result<Fit, Blocked> {
    let tenant = state.tenant(t);
    let used = ov.used(state, t, f);
    let at = Standing {
        flavor: f,
        used,
        nominal: tenant.nominal(f),
        need,
    };
    let Some(q) = tenant.quota(f) else {
        return Err(Blocked::Quota {
            at,
            borrowable: QuotaGpus::ZERO,
        });
    };
    if tenant.budget_holds(f) {
        return Err(Blocked::Budget {
            flavor: f,
            tenant: t,
        });
    }
    let limit = tenant.limit(f);
    let new_used = used + need;
    if new_used > limit {
        let borrowable = limit - used.max(q.nominal);
        return Err(Blocked::Quota { at, borrowable });
    }
    if let Some(c) = tenant.cohort {
        let delta = tenant.pool_draw(f, new_used) - tenant.pool_draw(f, used);
        let pool_used = ov.pool_used(state, c, f);
        let cap = state.cohort(c).capacity(f);
        if !state.cohort(c).can_lend(f, pool_used, delta) {
            return Err(Blocked::Cohort {
                at,
                cohort: c,
                lendable_left: cap - pool_used,
            });
        }
    }
    Ok(Fit {
        flavor: f,
        borrowed: (new_used - used.max(q.nominal)).get(),
    })
}

/// Cohort `c` lends tenant `t` nothing of flavor `f`: what it has is held
/// for a reclaim's beneficiary.
fn held_for_reclaim(
    state: &State,
    ov: &QuotaOverlay,
    t: TenantIdx,
    f: FlavorIdx,
    c: CohortIdx,
    need: QuotaGpus,
) -> Blocked {
    let at = Standing {
        flavor: f,
        used: ov.used(state, t, f),
        nominal: state.tenant(t).nominal(f),
        need,
    };
    Blocked::Cohort {
        at,
        cohort: c,
        lendable_left: QuotaGpus::ZERO,
    }
}

/// Chooses a flavor for a queued job: the first in its preference order that
/// fits within nominal quota, else the first that fits by borrowing; among
/// equals, one where the gang fits in free capacity now is preferred, and one
/// whose nodes could never hold the gang is taken only if nothing else fits.
/// When none fits, the reason is the most preferred flavor's.
pub fn choose_flavor(state: &State, ov: &QuotaOverlay, job: &Job) -> Result<Fit, Blocked> {
    let need = job.quota_gpus();
    let none = Blocked::Quota {
        at: Standing {
            flavor: job.flavors.first().copied().unwrap_or(0),
            used: QuotaGpus::ZERO,
            nominal: QuotaGpus::ZERO,
            need,
        },
        borrowable: QuotaGpus::ZERO,
    };
    let Some(t) = job.tenant else {
        return Err(none);
    };
    let mut first_err = None;
    let mut fits = Vec::new();
    let cohort = state.tenant(t).cohort;
    let planned = state.planned_flavor(job.id);
    // Its victims are still stopping: the quota they free is its own; quota
    // freed meanwhile by others' victims is theirs.
    if let (Some(c), Some(f), Some(_)) = (cohort, planned, state.plan(job.id)) {
        return Err(held_for_reclaim(state, ov, t, f, c, need));
    }
    for (pos, &f) in job.flavors.iter().enumerate() {
        // Room was freed for it in one flavor: that is where it goes.
        if planned.is_some_and(|p| p != f) {
            continue;
        }
        let checked = check(state, ov, t, f, need).and_then(|fit| {
            // Quota a reclaim freed goes to its beneficiary, not to borrowers.
            match cohort {
                Some(c) if fit.borrowed > 0 && state.reclaim_held(c, f, t) => {
                    Err(held_for_reclaim(state, ov, t, f, c, need))
                }
                _ => Ok(fit),
            }
        });
        match checked {
            Ok(fit) => fits.push((pos, fit)),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if fits.len() <= 1 {
        return fits
            .pop()
            .map(|(_, fit)| fit)
            .ok_or(first_err.unwrap_or(none));
    }
    let empty = CapacityOverlay::default();
    let mut probes = 0;
    fits.iter()
        .min_by_key(|(pos, fit)| {
            let fits_now = state
                .capacity()
                .find_domain(
                    &empty,
                    fit.flavor,
                    job.level,
                    job.spec.workers,
                    job.spec.gpus_per_worker,
                    &mut probes,
                )
                .is_some();
            // A flavor whose nodes could never hold the gang, even idle, goes
            // last: charged there, the job would wait forever.
            let never = !fits_now
                && state.capacity().has_nodes(fit.flavor)
                && state.capacity().max_domain_slots(
                    fit.flavor,
                    job.level,
                    job.spec.workers,
                    job.spec.gpus_per_worker,
                ) < job.spec.workers as u64;
            (never, fit.borrowed > 0, !fits_now, *pos)
        })
        .map(|(_, fit)| *fit)
        .ok_or(first_err.unwrap_or(none))
}

/// The share a borrower is served by (lowest first), divided by its
/// weight: the largest fraction, over flavors, of the cohort's lendable
/// quota that it borrows now; or, where the cohort keeps use with a
/// half-life, that its decayed use fills (mean GPUs held, weighted by age,
/// plus what this cycle admitted for it: one cycle does not hand all
/// borrowable quota to whoever was lowest when it began).
pub fn weighted_share(state: &State, ov: &QuotaOverlay, t: TenantIdx, now: Timestamp) -> f64 {
    let tenant = state.tenant(t);
    let Some(c) = tenant.cohort else { return 0.0 };
    let cohort = state.cohort(c);
    let half_life = cohort.half_life_ms();
    let decayed = (half_life > 0).then(|| state.decayed_use(t, now));
    let mut share: f64 = 0.0;
    for &f in &tenant.flavor_order {
        let cap = cohort.capacity(f);
        let held = match &decayed {
            Some(d) => {
                let this_cycle = ov.used(state, t, f) - tenant.used(f);
                d.mean_gpus(f as usize, half_life) + this_cycle.as_f64()
            }
            None => (ov.used(state, t, f) - tenant.nominal(f)).as_f64(),
        };
        // A flavor the cohort lends none of is no share of anything.
        if !cap.is_zero() {
            share = share.max(held / cap.as_f64());
        }
    }
    share / tenant.spec.weight
}

/// A cohort's members in the order the quota stage serves them as
/// borrowers (lowest weighted share first, then tenant index), each with
/// that share, at `now` and before this cycle's admissions.
pub fn borrower_order(state: &State, c: CohortIdx, now: Timestamp) -> Vec<(TenantIdx, f64)> {
    let ov = QuotaOverlay::default();
    let mut order: Vec<(TenantIdx, f64)> = state
        .cohort(c)
        .members
        .iter()
        .map(|&t| (t, weighted_share(state, &ov, t, now)))
        .collect();
    order.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    order
}

/// The order of tenants' heads in a cycle: within-nominal first, then by
/// lowest weighted share, then by tenant index for determinism.
#[derive(Clone, Copy, Debug)]
struct HeadKey {
    borrows: bool,
    share: f64,
    tenant: TenantIdx,
    head: QueueKey,
}

impl PartialEq for HeadKey {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for HeadKey {}
impl PartialOrd for HeadKey {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for HeadKey {
    fn cmp(&self, o: &Self) -> Ordering {
        self.borrows
            .cmp(&o.borrows)
            .then(self.share.total_cmp(&o.share))
            .then(self.tenant.cmp(&o.tenant))
    }
}

fn head_key(
    state: &State,
    ov: &QuotaOverlay,
    t: TenantIdx,
    head: QueueKey,
    now: Timestamp,
) -> HeadKey {
    let tenant = state.tenant(t);
    let borrows = match state.job(head.job) {
        Some(job) => !job
            .flavors
            .iter()
            .any(|&f| ov.used(state, t, f) + job.quota_gpus() <= tenant.nominal(f)),
        None => true,
    };
    HeadKey {
        borrows,
        share: if borrows {
            weighted_share(state, ov, t, now)
        } else {
            0.0
        },
        tenant: t,
        head,
    }
}

fn tenant_stamp(state: &State, t: TenantIdx) -> (u64, u64) {
    let tenant = state.tenant(t);
    (
        tenant.version,
        tenant.cohort.map_or(0, |c| state.cohort(c).version),
    )
}

/// Where a tenant's pass starts this cycle.
enum Start {
    /// Nothing queued.
    Empty,
    /// Blocked, and nothing changed since.
    Skip,
    /// At this job, carrying what earlier passes over the same stamp saw.
    At(QueueKey, TenantPass),
}

/// One tenant's pass in a cycle.
#[derive(Clone, Copy, Debug, Default)]
struct TenantPass {
    /// Blocked heads examined this cycle (admissions never end a pass).
    depth: usize,
    /// The oldest submit time among the blocked jobs passed over since the
    /// head, this cycle or in the passes this one resumes.
    oldest_passed: Option<Timestamp>,
}

impl TenantPass {
    /// Counts a blocked head submitted at `submitted`; the oldest passed
    /// over so far.
    fn blocked(&mut self, submitted: Timestamp) -> Timestamp {
        self.depth += 1;
        let oldest = self.oldest_passed.map_or(submitted, |o| o.min(submitted));
        self.oldest_passed = Some(oldest);
        oldest
    }
}

fn starved(cfg: &CycleConfig, now: Timestamp, submitted: Timestamp) -> bool {
    cfg.starvation_ms > 0 && now.millis_since(submitted) >= cfg.starvation_ms
}

fn next_after(state: &State, t: TenantIdx, key: QueueKey) -> Option<QueueKey> {
    state
        .tenant(t)
        .pending
        .range((std::ops::Bound::Excluded(key), std::ops::Bound::Unbounded))
        .next()
        .copied()
}

/// The head, or, after a pass cut by the depth bound with nothing changed
/// since, the job after the last one that pass looked at.
fn start(
    state: &State,
    memo: &mut ScanMemo,
    cfg: &CycleConfig,
    now: Timestamp,
    t: TenantIdx,
) -> Start {
    let tenant = state.tenant(t);
    let Some(&head) = tenant.pending.first().filter(|_| tenant.queue.admits()) else {
        return Start::Empty;
    };
    let stamp = tenant_stamp(state, t);
    if memo.tenant_blocked.get(&t) == Some(&stamp) {
        return Start::Skip;
    }
    match memo.tenant_resume.get(&t) {
        Some(r) if r.stamp == stamp && !starved(cfg, now, r.oldest_passed) => {
            let pass = TenantPass {
                depth: 0,
                oldest_passed: Some(r.oldest_passed),
            };
            match next_after(state, t, r.after) {
                Some(next) => Start::At(next, pass),
                None => {
                    // Every job was looked at under this stamp: blocked.
                    memo.tenant_resume.remove(&t);
                    memo.tenant_blocked.insert(t, stamp);
                    Start::Skip
                }
            }
        }
        _ => Start::At(head, TenantPass::default()),
    }
}

/// Admits up to `cfg.max_heads` queue heads in fair-share order.
pub fn decide(
    state: &State,
    memo: &mut ScanMemo,
    cfg: &CycleConfig,
    now: Timestamp,
) -> (Vec<Event>, QuotaStats) {
    let mut ov = QuotaOverlay::default();
    let mut stats = QuotaStats::default();
    // A budget's standing changes first, alone: this cycle's admissions
    // are decided under it by the next.
    let mut events = budget_events(state, now);
    if !events.is_empty() {
        return (events, stats);
    }
    let mut heap = BinaryHeap::new();
    let mut passes: FxHashMap<TenantIdx, TenantPass> = FxHashMap::default();
    for ti in 0..state.tenants().len() as TenantIdx {
        match start(state, memo, cfg, now, ti) {
            Start::Empty => {}
            Start::Skip => stats.tenants_skipped += 1,
            Start::At(first, pass) => {
                passes.insert(ti, pass);
                heap.push(Reverse(head_key(state, &ov, ti, first, now)));
            }
        }
    }
    while (stats.heads_examined as usize) < cfg.max_heads {
        let Some(Reverse(key)) = heap.pop() else {
            break;
        };
        let t = key.tenant;
        let Some(job) = state.job(key.head.job) else {
            continue;
        };
        stats.heads_examined += 1;
        let next = next_after(state, t, key.head);
        match choose_flavor(state, &ov, job) {
            Ok(fit) => {
                events.push(Event::JobAdmitted {
                    job: job.id,
                    flavor: state.flavor_name(fit.flavor).to_string(),
                    borrowed: fit.borrowed,
                    at: now,
                });
                ov.charge(state, t, fit.flavor, job.quota_gpus());
                stats.admitted += 1;
                if let Some(n) = next {
                    heap.push(Reverse(head_key(state, &ov, t, n, now)));
                }
            }
            Err(blocked) => {
                if job.last_reason.as_ref().map(|r| r.kind()) != Some(blocked.kind()) {
                    events.push(Event::JobPending {
                        job: job.id,
                        reason: blocked.reason(state),
                        at: now,
                    });
                }
                let pass = passes.entry(t).or_default();
                let oldest = pass.blocked(job.submitted_at);
                match next {
                    Some(n) if may_pass(state, &ov, cfg, now, t, job) => {
                        if pass.depth < cfg.max_heads_per_tenant {
                            heap.push(Reverse(head_key(state, &ov, t, n, now)));
                        } else {
                            let resume = TenantResume {
                                stamp: tenant_stamp(state, t),
                                after: key.head,
                                oldest_passed: oldest,
                            };
                            memo.tenant_resume.insert(t, resume);
                        }
                    }
                    _ => {
                        memo.tenant_resume.remove(&t);
                        memo.tenant_blocked.insert(t, tenant_stamp(state, t));
                    }
                }
            }
        }
    }
    (events, stats)
}

/// Whether the quota stage reaches this queued job while its tenant's
/// head stays blocked: it is the head, or its queue is best-effort and the
/// head has not waited past the starvation window (then the head holds the
/// queue). Preemption makes room only for jobs quota would reach: room
/// made for a job behind a head that holds its queue would sit idle.
pub fn within_reach(state: &State, cfg: &CycleConfig, now: Timestamp, job: &Job) -> bool {
    let Some(t) = job.tenant else { return false };
    let tenant = state.tenant(t);
    let Some(head) = tenant.pending.first() else {
        return false;
    };
    if head.job == job.id {
        return true;
    }
    let head_submitted = state.job(head.job).map_or(now, |h| h.submitted_at);
    tenant.spec.queueing == QueueingMode::BestEffortFifo && !starved(cfg, now, head_submitted)
}

/// Budgets whose standing the log must change at `now`: spent (used up
/// in the current period, not yet marked) or renewed (marked spent, but a
/// new period began or the budget was raised past what was used).
pub fn budget_events(state: &State, now: Timestamp) -> Vec<Event> {
    let mut events = Vec::new();
    for tenant in state.tenants() {
        for (f, ledger) in tenant.budgets.iter().enumerate() {
            let Some(l) = ledger else { continue };
            let f = f as FlavorIdx;
            let period_start = l.budget.period.start_of(now.max(l.at));
            let used_up = l.left_at(tenant.used(f).get(), now) == 0;
            let (tenant, flavor) = (tenant.spec.name.clone(), state.flavor_name(f).to_string());
            match l.spent_in {
                None if used_up => events.push(Event::BudgetSpent {
                    tenant,
                    flavor,
                    period_start,
                    at: now,
                }),
                Some(p) if p != period_start || !used_up => events.push(Event::BudgetRenewed {
                    tenant,
                    flavor,
                    period_start,
                    at: now,
                }),
                _ => {}
            }
        }
    }
    events
}

/// Whether a best-effort pass may go on past this blocked head: not if the
/// head has waited past the starvation window (then it holds the queue as
/// in strict FIFO), nor if no job could fit (no flavor of the tenant has
/// room for even one more GPU). A tenant below nominal somewhere goes on
/// too: its jobs may reclaim lent quota, and each needs its reason recorded.
fn may_pass(
    state: &State,
    ov: &QuotaOverlay,
    cfg: &CycleConfig,
    now: Timestamp,
    t: TenantIdx,
    head: &Job,
) -> bool {
    let tenant = state.tenant(t);
    tenant.spec.queueing == QueueingMode::BestEffortFifo
        && !starved(cfg, now, head.submitted_at)
        && tenant.flavor_order.iter().any(|&f| {
            check(state, ov, t, f, QuotaGpus::from(1)).is_ok()
                || (!tenant.budget_holds(f) && ov.used(state, t, f) < tenant.nominal(f))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;

    fn key(borrows: bool, share: f64, tenant: TenantIdx) -> HeadKey {
        let head = QueueKey {
            priority: Reverse(0),
            order: 0,
            job: gpusched_model::JobId(1),
        };
        HeadKey {
            borrows,
            share,
            tenant,
            head,
        }
    }

    #[test]
    fn heads_are_served_within_nominal_first_then_lowest_share_then_by_index() {
        assert_eq!(key(false, 0.5, 1), key(false, 0.5, 1));
        assert_ne!(key(false, 0.5, 1), key(true, 0.5, 1));
        assert_ne!(key(false, 0.5, 1), key(false, 0.25, 1));
        assert_ne!(key(false, 0.5, 1), key(false, 0.5, 2));
        let mut keys = [
            key(true, 0.0, 0),
            key(false, 0.9, 3),
            key(false, 0.1, 2),
            key(false, 0.1, 1),
        ];
        keys.sort();
        let order: Vec<TenantIdx> = keys.iter().map(|k| k.tenant).collect();
        assert_eq!(order, [1, 2, 3, 0]);
    }
}
