//! GPU-hour budgets: a tenant may use so many GPU-hours of a flavor per
//! calendar period; once they are spent, its jobs there wait for the next
//! period, or run only on quota its cohort lends (docs/architecture.md,
//! "GPU-hour budgets"). Each test would fail if the rule broke.

mod common;

use common::{job, tenant, Driver, TenantBuilder, FLAVOR};
use gpusched_core::{explain, ApplyError, Phase};
use gpusched_events::{Event, PendingReason};
use gpusched_model::{Budget, BudgetPeriod, Timestamp, WhenSpent};

const HOUR_S: u64 = 3_600;
const DAY_MS: u64 = 86_400_000;

fn budget(t: TenantBuilder, gpu_hours: u64, when_spent: WhenSpent) -> TenantBuilder {
    let mut t = t;
    t.0.quotas.last_mut().expect("a quota first").budget = Some(Budget {
        gpu_hours,
        period: BudgetPeriod::Day,
        when_spent,
    });
    t
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind()).collect()
}

/// Tenant `a` (16 GPUs nominal, 32 GPU-hours a day) on 16 GPUs; it runs
/// 16 GPUs for two hours from 08:00 on day 1, which spends the budget.
fn a_spends_its_day(when_spent: WhenSpent, lender: bool) -> Driver {
    let mut d = Driver::default();
    d.cluster(1, 1, if lender { 4 } else { 2 }, 8, FLAVOR);
    d.tenant(budget(
        tenant("a").cohort("c").best_effort().quota(FLAVOR, 16),
        32,
        when_spent,
    ));
    if lender {
        d.tenant(tenant("l").cohort("c").quota(FLAVOR, 16));
    }
    a_runs_two_hours_on_day_one(&mut d);
    d
}

/// Tenant `a` runs 16 GPUs for two hours from 08:00 on day 1.
fn a_runs_two_hours_on_day_one(d: &mut Driver) {
    d.now = Timestamp(DAY_MS + 8 * HOUR_S * 1000);
    let first = d.submit(job("a", 2, 8, "any"));
    d.run_until_quiet();
    d.start_bound();
    d.advance(2 * HOUR_S);
    d.finish(first);
}

#[test]
fn a_spent_budget_with_wait_holds_the_tenants_jobs_until_the_next_period() {
    let mut d = a_spends_its_day(WhenSpent::Wait, false);
    let next = d.submit(job("a", 1, 8, "any"));
    let events = d.run_until_quiet();
    assert!(kinds(&events).contains(&"budget_spent"), "{events:?}");
    assert_eq!(d.phase(next), Phase::Queued);
    let reason = explain::pending_reason(&d.state, next);
    assert!(
        matches!(
            &reason,
            Some(PendingReason::BudgetSpent { gpu_hours: 32, period, renews_at, .. })
                if period == "day" && *renews_at == Timestamp(2 * DAY_MS)
        ),
        "{reason:?}"
    );
    let line = explain::budget_standing(&d.state, next, d.now).expect("a budget line");
    assert!(
        line.contains("a's budget in h100: spent (32 GPU-hours this day)")
            && line.contains("wait until it renews in 14 h"),
        "{line}"
    );
    // An hour before midnight: still waiting.
    d.advance(13 * HOUR_S);
    d.run_until_quiet();
    assert_eq!(d.phase(next), Phase::Queued);
    // The next day: renewed, admitted.
    d.advance(HOUR_S);
    let events = d.run_until_quiet();
    assert_eq!(kinds(&events)[0], "budget_renewed", "{events:?}");
    assert_eq!(d.phase(next), Phase::Bound);
    let a = d.state.tenant_idx("a").expect("a");
    let ledger = d.state.tenant(a).budget(0).expect("a budget");
    assert_eq!(ledger.period_start, Timestamp(2 * DAY_MS));
    assert_eq!(ledger.used_at(8, d.now), 0, "nothing held yet today");
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn a_budget_left_admits_and_says_how_much_is_left() {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(budget(tenant("a").quota(FLAVOR, 16), 100, WhenSpent::Wait));
    d.now = Timestamp(DAY_MS);
    let first = d.submit(job("a", 1, 8, "any"));
    d.run_until_quiet();
    d.start_bound();
    d.advance(HOUR_S);
    let waiting = d.submit(job("a", 2, 8, "any"));
    let events = d.run_until_quiet();
    assert!(!kinds(&events).contains(&"budget_spent"));
    let line = explain::budget_standing(&d.state, waiting, d.now).expect("a budget line");
    assert!(
        line.contains("8.00 GPU-hours of 100 used this day, 92.00 GPU-hours left; renews in 23 h"),
        "{line}"
    );
    d.finish(first);
    d.run_until_quiet();
    assert_eq!(d.phase(waiting), Phase::Bound);
}

#[test]
fn a_spent_budget_with_borrow_only_runs_on_lent_quota_and_is_reclaimed_first() {
    let mut d = a_spends_its_day(WhenSpent::BorrowOnly, true);
    let a = d.state.tenant_idx("a").expect("a");
    // Spent: a lends all 16 of its own GPUs; it has 0 nominal now.
    let next = d.submit(job("a", 4, 8, "any"));
    let events = d.run_until_quiet();
    assert!(kinds(&events).contains(&"budget_spent"), "{events:?}");
    assert_eq!(d.state.tenant(a).nominal(0), 0);
    assert_eq!(d.state.cohort(0).capacity(0), 32);
    // It runs on the cohort's idle quota, all of it borrowed.
    assert_eq!(d.phase(next), Phase::Bound);
    assert_eq!(d.job(next).borrowed, 32);
    d.start_bound();
    d.advance(HOUR_S);
    // The lender returns: a's job is reclaimed, though a had 16 GPUs of
    // its own before its budget was spent.
    let owner = d.submit(job("l", 2, 8, "any"));
    let events = d.run_until_quiet();
    assert!(kinds(&events).contains(&"preemption_planned"), "{events:?}");
    let line = explain::budget_standing(&d.state, owner, d.now);
    assert!(line.is_none(), "l has no budget: {line:?}");
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

/// Tenant `a` (16 GPUs nominal, 8 of them never lent; 32 GPU-hours a day,
/// borrow-only) spends its day on a 24-GPU cluster; then `b` (no quota of
/// its own) borrows all 16 of a's GPUs, the 8 a never lends included.
fn b_borrows_what_a_lends_while_spent() -> (Driver, [gpusched_model::JobId; 2]) {
    let mut d = Driver::default();
    d.cluster(1, 1, 3, 8, FLAVOR);
    d.tenant(budget(
        tenant("a")
            .cohort("c")
            .best_effort()
            .quota(FLAVOR, 16)
            .lending(8),
        32,
        WhenSpent::BorrowOnly,
    ));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    a_runs_two_hours_on_day_one(&mut d);
    let borrowed = [
        d.submit(job("b", 1, 8, "any")),
        d.submit(job("b", 1, 8, "any")),
    ];
    let events = d.run_until_quiet();
    assert!(kinds(&events).contains(&"budget_spent"), "{events:?}");
    d.start_bound();
    for j in borrowed {
        assert_eq!(d.phase(j), Phase::Running);
    }
    assert_eq!(d.state.cohort(0).capacity(0), 16);
    (d, borrowed)
}

#[test]
fn a_renewed_budget_takes_back_what_others_borrowed_and_its_owner_reclaims_it_at_once() {
    let (mut d, borrowed) = b_borrows_what_a_lends_while_spent();
    // The next day a's budget renews: the pool lends 8 again (a keeps 8),
    // but b draws 16 from it. The cohort is over-lent by 8 until b's jobs
    // end or are reclaimed; b's jobs run on.
    d.now = Timestamp(2 * DAY_MS);
    let events = d.run_until_quiet();
    assert_eq!(kinds(&events), ["budget_renewed"], "{events:?}");
    assert_eq!(d.state.cohort(0).capacity(0), 8);
    assert_eq!(d.state.cohort(0).over_lent(0), 8);
    d.state.check_invariants().expect("invariants");
    // Nothing more is lent while over-lent.
    let more = d.submit(job("b", 1, 8, "any"));
    d.run_until_quiet();
    assert_eq!(d.phase(more), Phase::Queued);
    assert!(
        matches!(
            explain::pending_reason(&d.state, more),
            Some(PendingReason::CohortExhausted {
                lendable_left: 0,
                ..
            })
        ),
        "{:?}",
        explain::pending_reason(&d.state, more)
    );
    d.apply(Event::JobCancelled {
        job: more,
        at: d.now,
    });
    // a wants all 16 of its own back: 8 it keeps and 8 it lends, which
    // the pool can give only once it is 8 under what b draws now. Room
    // for it needs one of b's jobs gone (8 GPUs are free), quota both: one
    // reclaim takes both, not one now and the other once it has ended.
    let owner = d.submit(job("a", 2, 8, "any"));
    let events = d.run_until_quiet();
    let planned: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind() == "preemption_planned")
        .collect();
    assert_eq!(planned.len(), 1, "{events:?}");
    let Event::PreemptionPlanned { victims, .. } = planned[0] else {
        unreachable!()
    };
    let mut victims: Vec<_> = victims.iter().map(|v| v.job).collect();
    victims.sort();
    assert_eq!(victims, borrowed);
    for job in borrowed {
        d.apply(Event::JobPreempted {
            job,
            lost_gpu_ms: 0,
            resume_from: None,
            at: d.now,
        });
    }
    d.run_until_quiet();
    assert_eq!(d.phase(owner), Phase::Bound);
    for j in borrowed {
        assert_eq!(d.phase(j), Phase::Queued, "nothing left to lend");
    }
    assert_eq!(d.state.cohort(0).over_lent(0), 0);
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn an_over_lent_cohort_does_not_hold_back_an_owner_within_what_it_keeps() {
    let (mut d, borrowed) = b_borrows_what_a_lends_while_spent();
    d.now = Timestamp(2 * DAY_MS);
    d.run_until_quiet();
    assert_eq!(d.state.cohort(0).over_lent(0), 8);
    // 8 GPUs of a's own, drawn from no pool, on the free node: nobody is
    // preempted for it, and b's jobs run on.
    let own = d.submit(job("a", 1, 8, "any"));
    let events = d.run_until_quiet();
    assert_eq!(d.phase(own), Phase::Bound, "{events:?}");
    assert!(
        !kinds(&events).contains(&"preemption_planned"),
        "{events:?}"
    );
    for j in borrowed {
        assert_eq!(d.phase(j), Phase::Running);
    }
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn raising_a_spent_budget_renews_it_at_once() {
    let mut d = a_spends_its_day(WhenSpent::Wait, false);
    let next = d.submit(job("a", 1, 8, "any"));
    d.run_until_quiet();
    assert_eq!(d.phase(next), Phase::Queued);
    d.tenant(budget(
        tenant("a").cohort("c").best_effort().quota(FLAVOR, 16),
        40,
        WhenSpent::Wait,
    ));
    let events = d.run_until_quiet();
    assert_eq!(kinds(&events)[0], "budget_renewed", "{events:?}");
    assert_eq!(d.phase(next), Phase::Bound);
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn budget_events_that_do_not_match_the_budget_are_refused() {
    let mut d = a_spends_its_day(WhenSpent::Wait, false);
    let at = d.now;
    let renewed = Event::BudgetRenewed {
        tenant: "a".into(),
        flavor: FLAVOR.into(),
        period_start: Timestamp(DAY_MS),
        at,
    };
    assert!(matches!(
        d.try_apply(renewed),
        Err(ApplyError::BadBudget {
            why: "the budget is not spent",
            ..
        })
    ));
    let other = Event::BudgetSpent {
        tenant: "a".into(),
        flavor: "a100".into(),
        period_start: Timestamp(DAY_MS),
        at,
    };
    assert!(matches!(
        d.try_apply(other),
        Err(ApplyError::BadBudget { .. })
    ));
    let nobody = Event::BudgetSpent {
        tenant: "z".into(),
        flavor: FLAVOR.into(),
        period_start: Timestamp(DAY_MS),
        at,
    };
    assert!(matches!(
        d.try_apply(nobody),
        Err(ApplyError::UnknownTenant(_))
    ));
}

#[test]
fn a_bad_budget_is_refused_naming_its_field() {
    let mut d = Driver::default();
    let spec = budget(tenant("a").quota(FLAVOR, 16), 0, WhenSpent::Wait).spec();
    let e = d.try_apply(Event::TenantConfigured { spec }).unwrap_err();
    assert!(
        matches!(&e, ApplyError::Invalid(f) if f.field == "quotas.budget.gpu_hours"),
        "{e}"
    );
}
