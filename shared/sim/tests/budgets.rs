//! GPU-hour budgets in the simulator, on the budget scenario: with `wait`
//! no job of the tenant is admitted from its `BudgetSpent` to the
//! `BudgetRenewed` that comes at the next period's start; with
//! `borrow-only` its jobs admitted meanwhile borrow all their GPUs and a
//! returning owner reclaims from them; the report's budgets section agrees
//! with sums computed here from the event log alone, by two methods; and
//! the run replays to the same state hash.
#![allow(clippy::unwrap_used)]

use gpusched_core::{Phase, State};
use gpusched_events::{Event, PendingReason, PreemptionCause};
use gpusched_model::{BudgetPeriod, JobId, Timestamp};
use gpusched_sim::report::BudgetReport;
use gpusched_sim::scenario::{self, BUDGET_DAYS, BUDGET_GPU_HOURS, BUDGET_OWNER_RETURNS_S};
use gpusched_sim::{Report, Simulator};
use std::collections::{BTreeMap, BTreeSet};

mod common;

const FLAVOR: &str = "h100-80g";
const DAY_MS: u64 = 86_400_000;
const HOUR_MS: f64 = 3_600_000.0;
const SEEDS: [u64; 3] = [1, 2, 3];

fn run(seed: u64) -> Simulator {
    let (c, w) = scenario::budget(seed);
    common::run(&c, w)
}

fn section(sim: &Simulator, tenant: &str) -> BudgetReport {
    let r = Report::build(sim, String::new());
    let budgets = r.budgets.expect("a budgets section");
    budgets
        .into_iter()
        .find(|b| b.tenant == tenant)
        .expect("the tenant's budget")
}

/// Each job's tenant, from its submission.
fn tenants(log: &[Event]) -> BTreeMap<JobId, String> {
    log.iter()
        .filter_map(|e| match e {
            Event::JobSubmitted { job, spec, .. } => Some((*job, spec.tenant.clone())),
            _ => None,
        })
        .collect()
}

/// A budget event of `tenant`: `Some(true)` spent, `Some(false)` renewed.
fn budget_event(e: &Event, tenant: &str) -> Option<(bool, Timestamp, Timestamp)> {
    match e {
        Event::BudgetSpent {
            tenant: t,
            flavor,
            period_start,
            at,
        } if t == tenant && flavor == FLAVOR => Some((true, *period_start, *at)),
        Event::BudgetRenewed {
            tenant: t,
            flavor,
            period_start,
            at,
        } if t == tenant && flavor == FLAVOR => Some((false, *period_start, *at)),
        _ => None,
    }
}

#[test]
fn the_scenario_is_the_documented_cluster_and_is_deterministic() {
    let (c, w) = scenario::budget(1);
    assert_eq!((c.nodes, c.gpus), (8, 64));
    assert_eq!(w, scenario::budget(1).1);
    assert_ne!(w.items, scenario::budget(2).1.items);
    let sim = run(1);
    let capped = section(&sim, "capped");
    let flex = section(&sim, "flex");
    assert_eq!(
        (
            capped.gpu_hours,
            capped.period.as_str(),
            capped.when_spent.as_str()
        ),
        (BUDGET_GPU_HOURS, "day", "wait")
    );
    assert_eq!(
        (
            flex.gpu_hours,
            flex.period.as_str(),
            flex.when_spent.as_str()
        ),
        (BUDGET_GPU_HOURS, "day", "borrow-only")
    );
    // Every job ends; the run covers at least the days jobs are submitted.
    let r = Report::build(&sim, String::new());
    assert_eq!((r.jobs_unfinished, r.jobs_rejected), (0, 0));
    assert!(capped.periods.len() as u64 > BUDGET_DAYS);
    // The same seed gives the same events and the same section.
    let again = run(1);
    assert_eq!(sim.log(), again.log());
    let json = |s: &Simulator| serde_json::to_value(Report::build(s, String::new()).budgets);
    assert_eq!(json(&sim).unwrap(), json(&again).unwrap());
}

#[test]
fn the_run_replays_to_the_same_state_hash() {
    for seed in SEEDS {
        let sim = run(seed);
        let replayed = gpusched_sim::replay(sim.log()).unwrap();
        replayed.check_invariants().unwrap();
        assert_eq!(
            replayed.state_hash(),
            sim.state().state_hash(),
            "seed {seed}"
        );
    }
}

#[test]
fn with_wait_no_job_is_admitted_until_the_renewal_at_the_next_period_start() {
    for seed in SEEDS {
        let sim = run(seed);
        let log = sim.log();
        let tenant_of = tenants(log);
        let mut spent: Option<(Timestamp, Timestamp)> = None;
        let (mut spents, mut renewals, mut pending) = (0, 0, BTreeSet::new());
        for e in log {
            if let Some((is_spent, period_start, at)) = budget_event(e, "capped") {
                if is_spent {
                    assert!(spent.is_none(), "seed {seed}: spent twice");
                    assert_eq!(period_start, BudgetPeriod::Day.start_of(at));
                    spent = Some((period_start, at));
                    spents += 1;
                } else {
                    let (was, spent_at) = spent.take().expect("renewed while not spent");
                    // At the next period's start, to the millisecond.
                    assert_eq!(period_start, BudgetPeriod::Day.next_start(spent_at));
                    assert_eq!(period_start.0, was.0 + DAY_MS);
                    assert_eq!(at, period_start, "seed {seed}: renewed late");
                    renewals += 1;
                }
            }
            match e {
                Event::JobAdmitted { job, at, .. } if tenant_of[job] == "capped" => {
                    assert!(
                        spent.is_none(),
                        "seed {seed}: capped's job {job} admitted at {at:?} while its budget was spent ({spent:?})"
                    );
                }
                Event::JobPending {
                    job,
                    reason: PendingReason::BudgetSpent { .. },
                    ..
                } => {
                    assert_eq!(tenant_of[job], "capped", "only wait holds jobs back");
                    pending.insert(*job);
                }
                _ => {}
            }
        }
        // It was spent on every day it submitted, and its jobs waited.
        assert!(spents >= BUDGET_DAYS, "seed {seed}: spent {spents} times");
        assert!(renewals >= BUDGET_DAYS - 1, "seed {seed}");
        assert!(!pending.is_empty(), "seed {seed}");
        let r = section(&sim, "capped");
        assert_eq!(r.times_spent as u64, spents);
        assert_eq!(r.jobs_pending_budget_spent, pending.len() as u64);
        assert!(r.jobs_waited_while_spent >= r.jobs_pending_budget_spent);
        assert_eq!(r.jobs_admitted_while_spent, 0);
        for p in &r.periods {
            assert_eq!(p.after_spent_gpu_hours, 0.0, "seed {seed}: {p:?}");
        }
    }
}

#[test]
fn with_borrow_only_jobs_borrow_all_their_gpus_and_the_returning_owner_reclaims_them() {
    for seed in SEEDS {
        let sim = run(seed);
        let log = sim.log();
        let tenant_of = tenants(log);
        let mut spent = false;
        let mut admitted = BTreeSet::new();
        let mut planned = BTreeSet::new();
        let mut preempted = BTreeSet::new();
        let mut state = State::new();
        for e in log {
            if let Some((is_spent, _, _)) = budget_event(e, "flex") {
                spent = is_spent;
            }
            match e {
                Event::JobAdmitted { job, borrowed, .. } if spent && tenant_of[job] == "flex" => {
                    let gpus = state.job(*job).unwrap().spec.total_gpus();
                    assert_eq!(
                        *borrowed, gpus,
                        "seed {seed}: job {job} has quota of its own"
                    );
                    admitted.insert(*job);
                }
                Event::PreemptionPlanned {
                    beneficiary,
                    cause: PreemptionCause::Reclaim { tenant, .. },
                    victims,
                    at,
                    ..
                } if tenant == "owner" => {
                    assert_eq!(tenant_of[beneficiary], "owner");
                    assert!(at.0 >= BUDGET_OWNER_RETURNS_S * 1000);
                    for v in victims {
                        if tenant_of[&v.job] == "flex" && spent {
                            planned.insert(v.job);
                        }
                    }
                }
                Event::JobPreempted { job, .. } if spent && tenant_of[job] == "flex" => {
                    preempted.insert(*job);
                }
                _ => {}
            }
            state.apply(e).unwrap();
        }
        assert!(!admitted.is_empty(), "seed {seed}");
        assert!(
            !planned.is_empty(),
            "seed {seed}: the owner reclaimed nothing from flex past its budget"
        );
        assert!(planned.is_subset(&preempted), "seed {seed}");
        // Every flex job it reclaimed ran on, and ended.
        for j in &planned {
            assert_eq!(state.job(*j).unwrap().phase, Phase::Succeeded);
        }
        let r = section(&sim, "flex");
        assert_eq!(r.jobs_admitted_while_spent, admitted.len() as u64);
        assert_eq!(r.jobs_preempted_while_spent, preempted.len() as u64);
        assert_eq!(r.jobs_pending_budget_spent, 0);
        assert!(r.periods.iter().any(|p| p.after_spent_gpu_hours > 0.0));
    }
}

/// GPU-ms of quota each tenant held, per day, from the state's own count
/// after each event of the log, replayed here.
fn used_per_day(log: &[Event], end: Timestamp, tenant: &str) -> BTreeMap<u64, f64> {
    let mut state = State::new();
    let mut per_day: BTreeMap<u64, f64> = BTreeMap::new();
    let (mut since, mut gpus) = (0u64, 0u64);
    let mut spread = |from: u64, to: u64, gpus: u64| {
        let mut a = from;
        while a < to {
            let b = ((a / DAY_MS + 1) * DAY_MS).min(to);
            *per_day.entry(a / DAY_MS).or_default() += (gpus * (b - a)) as f64;
            a = b;
        }
    };
    for e in log {
        if let Some(at) = e.at() {
            spread(since, at.0, gpus);
            since = at.0;
        }
        state.apply(e).unwrap();
        gpus = state.tenant_idx(tenant).map_or(0, |t| {
            let f = state.flavor(FLAVOR).unwrap();
            u64::from(state.tenant(t).used(f).get())
        });
    }
    spread(since, end.0, gpus);
    per_day
}

/// One hold of quota, from the events: (job, GPUs, admitted, released).
type Hold = (JobId, u64, u64, u64);

/// A tenant's holds, opened by `JobAdmitted` and closed by the events that
/// release quota.
fn holds(log: &[Event], end: Timestamp, tenant: &str) -> Vec<Hold> {
    let tenant_of = tenants(log);
    let mut gpus: BTreeMap<JobId, u64> = BTreeMap::new();
    let mut open: BTreeMap<JobId, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for e in log {
        match e {
            Event::JobSubmitted { job, spec, .. } => {
                gpus.insert(*job, u64::from(spec.total_gpus()));
            }
            Event::JobAdmitted { job, at, .. } if tenant_of[job] == tenant => {
                open.insert(*job, at.0);
            }
            Event::JobPreempted { job, at, .. } | Event::JobRequeued { job, at, .. } => {
                if let Some(a) = open.remove(job) {
                    out.push((*job, gpus[job], a, at.0));
                }
            }
            e if e.ends_job() => {
                let job = e.job().unwrap();
                if let Some(a) = open.remove(&job) {
                    out.push((job, gpus[&job], a, e.at().unwrap().0));
                }
            }
            _ => {}
        }
    }
    out.extend(open.into_iter().map(|(j, a)| (j, gpus[&j], a, end.0)));
    out
}

/// In the day `[from, to)`: GPU-ms held, the moment they reached the
/// budget (ms), and GPU-ms held after it by holds admitted before / since.
fn day_figures(holds: &[Hold], from: u64, to: u64) -> (f64, Option<f64>, f64, f64) {
    let budget_ms = (BUDGET_GPU_HOURS * 3_600_000) as f64;
    let cut: Vec<(f64, f64, f64, f64)> = holds
        .iter()
        .filter_map(|&(_, g, a, b)| {
            let (x, y) = (a.max(from), b.min(to));
            (x < y).then_some((x as f64, y as f64, g as f64, a as f64))
        })
        .collect();
    let used: f64 = cut.iter().map(|&(x, y, g, _)| g * (y - x)).sum();
    // The running total is continuous and grows: bisect for the moment it
    // reaches the budget.
    let total_at = |t: f64| -> f64 {
        cut.iter()
            .map(|&(x, y, g, _)| g * (y.min(t) - x).max(0.0))
            .sum()
    };
    let used_up = (used >= budget_ms).then(|| {
        let (mut lo, mut hi) = (from as f64, to as f64);
        for _ in 0..100 {
            let mid = (lo + hi) / 2.0;
            if total_at(mid) >= budget_ms {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    });
    let (mut before, mut since) = (0.0, 0.0);
    if let Some(u) = used_up {
        for &(x, y, g, admitted) in &cut {
            let after = g * (y - x.max(u)).max(0.0);
            if admitted < u {
                before += after;
            } else {
                since += after;
            }
        }
    }
    (used, used_up, before, since)
}

#[test]
fn the_report_agrees_with_sums_from_the_event_log() {
    for seed in SEEDS {
        let sim = run(seed);
        let log = sim.log();
        let end = sim.measurements.end;
        for tenant in ["capped", "flex"] {
            let r = section(&sim, tenant);
            let by_state = used_per_day(log, end, tenant);
            let holds = holds(log, end, tenant);
            let spent_at: BTreeMap<u64, u64> = log
                .iter()
                .filter_map(|e| budget_event(e, tenant))
                .filter(|(s, _, _)| *s)
                .map(|(_, p, at)| (p.0, at.0))
                .collect();
            let days = end.0.div_ceil(DAY_MS);
            assert_eq!(r.periods.len() as u64, days, "seed {seed} {tenant}");
            let mut total = 0.0;
            for (d, p) in r.periods.iter().enumerate() {
                let (from, to) = (d as u64 * DAY_MS, ((d as u64 + 1) * DAY_MS).min(end.0));
                assert_eq!((p.from_s, p.to_s), (from as f64 / 1e3, to as f64 / 1e3));
                let state_ms = by_state.get(&(d as u64)).copied().unwrap_or(0.0);
                let (used, used_up, before, since) = day_figures(&holds, from, to);
                let what = format!("seed {seed}, {tenant}, day {d}: {p:?}");
                // Two counts from the log, and the report, agree.
                assert!(
                    (used - state_ms).abs() < 1e-6,
                    "{what}: {used} ≠ {state_ms}"
                );
                assert!((p.used_gpu_hours - used / HOUR_MS).abs() < 1e-9, "{what}");
                total += p.used_gpu_hours;
                match (used_up, p.used_up_after_s) {
                    (Some(u), Some(s)) => {
                        assert!(((u - from as f64) / 1e3 - s).abs() < 1e-3, "{what}: {u}")
                    }
                    (None, None) => {}
                    other => panic!("{what}: used up {other:?}"),
                }
                assert!(
                    (p.run_on_gpu_hours - before / HOUR_MS).abs() < 1e-6,
                    "{what}"
                );
                assert!(
                    (p.after_spent_gpu_hours - since / HOUR_MS).abs() < 1e-6,
                    "{what}"
                );
                // Never more than the budget plus what jobs admitted before
                // it ran out held afterwards, and (borrow-only) what jobs
                // admitted since held, all on lent quota.
                let budget_ms = (BUDGET_GPU_HOURS * 3_600_000) as f64;
                let allowed = match r.when_spent.as_str() {
                    "wait" => budget_ms + before,
                    _ => budget_ms + before + since,
                };
                assert!(used <= allowed + 1e-6, "{what}: {used} > {allowed}");
                if r.when_spent == "wait" {
                    assert_eq!(since, 0.0, "{what}");
                }
                // The log says it is spent after it is used up, never before.
                match (spent_at.get(&from), used_up) {
                    (Some(&at), Some(u)) => {
                        assert!(at as f64 >= u - 1e-6, "{what}");
                        assert_eq!(p.spent_after_s, Some((at - from) as f64 / 1e3));
                    }
                    (None, _) => assert_eq!(p.spent_after_s, None, "{what}"),
                    (Some(_), None) => panic!("{what}: spent but never used up"),
                }
            }
            assert!((r.used_gpu_hours - total).abs() < 1e-9);
            assert_eq!(r.times_spent, spent_at.len());
        }
    }
}

#[test]
fn the_section_appears_only_when_a_tenant_has_a_budget() {
    let (c, w) = scenario::fairshare(1);
    let r = Report::build(&common::run(&c, w), String::new());
    assert!(r.budgets.is_none());
    let json = serde_json::to_value(&r).unwrap();
    assert!(json.get("budgets").is_none());
    assert!(!r.to_table().contains("budget "));
    let sim = run(1);
    let r = Report::build(&sim, String::new());
    let table = r.to_table();
    assert!(
        table.contains("budget         capped in h100-80g: 160 GPU-h a day, when spent: wait"),
        "{table}"
    );
    assert!(
        table.contains("budget         flex in h100-80g: 160 GPU-h a day, when spent: borrow-only")
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["budgets"][0]["tenant"], "capped");
    assert_eq!(json["budgets"][1]["tenant"], "flex");
    assert!(json["budgets"][0]["periods"][1]["renewed_after_s"].is_number());
}
