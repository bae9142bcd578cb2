//! Property tests of the scheduling core: random clusters, tenants, jobs and
//! interleavings of cycles, agent facts, cancellations, cordons and node
//! losses. After every step the rules of docs/architecture.md ("The rules the core keeps") hold (1–3 via
//! `check_invariants`, 8 via the cycle's stats), and the recorded log
//! replays to the same state hash at every point (invariant 6).

mod common;

use common::gen::{admin, admin_op_gen, AdminOp};
use common::gen::{cluster_gen, job_gen, pick, quota, setup, tenant_gen};
use common::gen::{ClusterGen, JobExtras, JobGen, TenantGen, TenantMix};
use common::Driver;
use gpusched_core::{run_cycle, snapshot, CycleConfig, NodeStatus, Phase, ScanMemo, State};
use gpusched_events::{Event, Outcome};
use gpusched_model::{JobId, NodeId};
use proptest::prelude::*;
use std::collections::BTreeMap;

const MAX_JOBS: usize = 60;

#[derive(Clone, Debug)]
enum Op {
    Submit(JobGen),
    Cycle,
    Start(usize),
    Finish(usize, bool),
    Cancel(usize),
    Cordon(usize),
    Uncordon(usize),
    Drain(usize),
    Lose(usize),
    AddNode(usize),
    Advance(u64),
    Admin(AdminOp),
    Gated(JobGen, Gate),
    /// Cohort `c{0}` keeps use with a half-life of `{1}` s (0: none).
    HalfLife(u8, u64),
    /// Tenant `{0} % tenants` gets a daily budget in its first flavor of
    /// `{1}` GPU-hours, borrow-only if `{2}` (`{1}` 0: none).
    Budget(usize, u64, bool),
    /// Tenant `{0} % tenants`'s first quota set to `{1}` GPUs nominal,
    /// lending at most `{2}` (`None`: all of it), as an admin might while
    /// its jobs and its borrowers' run.
    Requota(usize, u32, Option<u32>),
}

/// `op_gen` with tenants' quotas raised and lowered under running jobs (a
/// separate strategy, so `op_gen`'s cases and saved seeds stay as they
/// were).
fn op_with_quota_changes_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => op_gen(),
        2 => (any::<usize>(), 0u32..=24, proptest::option::of(0u32..=24))
            .prop_map(|(t, n, l)| Op::Requota(t, n, l)),
    ]
}

/// `op_gen` with budgets set, changed and dropped, and time moving on in
/// hours so that they are spent and renewed (a separate strategy, so
/// `op_gen`'s cases and saved seeds stay as they were).
fn op_with_budgets_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => op_gen(),
        2 => (any::<usize>(), 0u64..=4, any::<bool>()).prop_map(|(t, h, b)| Op::Budget(t, h, b)),
        2 => (1u64..=10).prop_map(|h| Op::Advance(h * 3_600)),
    ]
}

fn half_life_gen() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(30), Just(300), Just(3_600)]
}

/// `op_gen` with cohorts' half-lives set and changed (a separate
/// strategy, so `op_gen`'s cases and saved seeds stay as they were).
fn op_with_half_lives_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => op_gen(),
        1 => (0u8..2, half_life_gen()).prop_map(|(c, h)| Op::HalfLife(c, h)),
    ]
}

/// What a gated submission waits on.
#[derive(Clone, Copy, Debug)]
enum Gate {
    /// The job submitted `back` submissions earlier (any tenant's: another
    /// tenant's must be refused); `ok`: after_ok, else after.
    After { back: usize, ok: bool },
    /// A task of array `1_000_000 + array`, limited to `array % 3 + 1`.
    Task { array: u8 },
}

fn gate_gen() -> impl Strategy<Value = Gate> {
    prop_oneof![
        2 => (0usize..6, any::<bool>()).prop_map(|(back, ok)| Gate::After { back, ok }),
        1 => (0u8..4).prop_map(|array| Gate::Task { array }),
    ]
}

/// `op_gen` with dependencies and limited arrays mixed in (a separate
/// strategy, so `op_gen`'s cases and saved seeds stay as they were).
fn op_with_gates_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => op_gen(),
        2 => (suite_job(), gate_gen()).prop_map(|(j, g)| Op::Gated(j, g)),
    ]
}

/// `g`'s spec with `gate`.
fn gated_spec(d: &Driver, tenants: usize, g: &JobGen, gate: Gate) -> gpusched_model::JobSpec {
    let mut spec = g.spec(tenants);
    match gate {
        Gate::After { back, ok } => {
            let Some(dep) = d.jobs.len().checked_sub(back + 1).map(|i| d.jobs[i]) else {
                return spec;
            };
            if ok {
                spec.after_ok.push(dep);
            } else {
                spec.after.push(dep);
            }
        }
        Gate::Task { array } => {
            spec.array = Some(gpusched_model::ArrayTask {
                array: 1_000_000 + u64::from(array),
                index: d.jobs.len() as u32,
                max_running: Some(u32::from(array % 3) + 1),
            });
        }
    }
    spec
}

/// Tenants with weights 1–4 and quotas up to 32 GPUs.
fn suite_tenant() -> impl Strategy<Value = TenantGen> {
    tenant_gen(TenantMix {
        in_cohort: 0.8,
        weight: (1u8..=4).boxed(),
        priority_preemption: Just(true).boxed(),
        quota: quota(0..=32, 0..=32, proptest::option::of(0u32..=32).boxed()).boxed(),
        second_flavor: 0.3,
    })
}

fn suite_cluster() -> impl Strategy<Value = ClusterGen> {
    cluster_gen(3, 4, 0.25)
}

/// Plain jobs: preemptible, no checkpoint, no max runtime.
fn suite_job() -> impl Strategy<Value = JobGen> {
    job_gen(2, JobExtras::none())
}

fn op_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => suite_job().prop_map(Op::Submit),
        6 => Just(Op::Cycle),
        2 => any::<usize>().prop_map(Op::Start),
        3 => (any::<usize>(), proptest::bool::weighted(0.8)).prop_map(|(s, ok)| Op::Finish(s, ok)),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => any::<usize>().prop_map(Op::Cordon),
        1 => any::<usize>().prop_map(Op::Uncordon),
        1 => any::<usize>().prop_map(Op::Drain),
        1 => any::<usize>().prop_map(Op::Lose),
        1 => any::<usize>().prop_map(Op::AddNode),
        2 => (1u64..=120).prop_map(Op::Advance),
    ]
}

/// `op_gen` with an admin's queue and node operations mixed in (a
/// separate strategy, so `op_gen`'s cases and saved seeds stay as they were).
fn op_with_admin_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op_gen(),
        1 => admin_op_gen().prop_map(Op::Admin),
    ]
}

fn config_gen() -> impl Strategy<Value = CycleConfig> {
    (1usize..=8, 1usize..=8, 1usize..=16).prop_map(
        |(max_heads, max_heads_per_tenant, max_validations)| CycleConfig {
            max_heads,
            max_heads_per_tenant,
            max_validations,
            ..CycleConfig::default()
        },
    )
}

fn holders(d: &Driver) -> Vec<JobId> {
    d.jobs
        .iter()
        .copied()
        .filter(|&j| d.phase(j).holds_gpus())
        .collect()
}

/// Applies one operation; returns the cycle's output events when it ran one.
fn step(d: &mut Driver, tenants: usize, op: &Op) -> Option<Vec<Event>> {
    let node_count = d.state.nodes().len();
    let node = |sel: usize| NodeId((sel % node_count) as u32);
    match op {
        Op::Submit(g) => {
            if d.jobs.len() < MAX_JOBS {
                d.submit(g.spec(tenants));
            }
        }
        Op::Cycle => {
            let out = d.cycle();
            for e in &out.events {
                if let Event::JobBound { assignments, .. } = e {
                    for a in assignments {
                        let status = d.state.nodes()[a.node.index()].status;
                        assert_eq!(
                            status,
                            NodeStatus::Ready,
                            "work bound on {} in status {status:?}",
                            a.node
                        );
                    }
                }
            }
            return Some(out.events);
        }
        Op::Start(sel) => {
            if let Some(j) = pick(&d.in_phase(Phase::Bound), *sel) {
                d.apply(Event::JobStarted { job: j, at: d.now });
            }
        }
        Op::Finish(sel, ok) => {
            if let Some(j) = pick(&holders(d), *sel) {
                if d.phase(j) == Phase::Bound {
                    d.apply(Event::JobStarted { job: j, at: d.now });
                }
                let outcome = if *ok {
                    Outcome::Succeeded
                } else {
                    Outcome::Failed
                };
                d.apply(Event::JobFinished {
                    job: j,
                    outcome,
                    at: d.now,
                    exits: Vec::new(),
                    reason: None,
                });
            }
        }
        Op::Cancel(sel) => {
            let live: Vec<JobId> = d
                .jobs
                .iter()
                .copied()
                .filter(|&j| !d.phase(j).is_terminal())
                .collect();
            if let Some(j) = pick(&live, *sel) {
                d.apply(Event::JobCancelled { job: j, at: d.now });
            }
        }
        // Node events may be illegal for the node's status: then they must be
        // refused without changing anything (`try_apply` asserts that).
        Op::Cordon(sel) => {
            let _ = d.try_apply(Event::NodeCordoned { node: node(*sel) });
        }
        Op::Uncordon(sel) => {
            let _ = d.try_apply(Event::NodeUncordoned { node: node(*sel) });
        }
        Op::Drain(sel) => {
            let _ = d.try_apply(Event::NodeDrained { node: node(*sel) });
        }
        Op::Lose(sel) => {
            let _ = d.try_apply(Event::NodeLost {
                node: node(*sel),
                at: d.now,
            });
        }
        Op::AddNode(sel) => {
            let spec = d.state.nodes()[node(*sel).index()].spec.clone();
            d.add_node(&spec.path[0], &spec.path[1], spec.gpus, &spec.flavor);
        }
        Op::Advance(s) => d.advance(*s),
        Op::Admin(op) => admin(d, tenants, *op),
        Op::Gated(g, gate) => {
            if d.jobs.len() < MAX_JOBS {
                let spec = gated_spec(d, tenants, g, *gate);
                d.submit(spec);
            }
        }
        Op::Budget(sel, gpu_hours, borrow_only) => {
            let t = (*sel % tenants) as u32;
            let mut spec = d.state.tenant(t).spec.clone();
            if let Some(q) = spec.quotas.first_mut() {
                q.budget = (*gpu_hours > 0).then_some(gpusched_model::Budget {
                    gpu_hours: *gpu_hours,
                    period: gpusched_model::BudgetPeriod::Day,
                    when_spent: if *borrow_only {
                        gpusched_model::WhenSpent::BorrowOnly
                    } else {
                        gpusched_model::WhenSpent::Wait
                    },
                });
            }
            d.apply(Event::TenantConfigured { spec });
        }
        Op::Requota(sel, nominal, lending) => {
            let t = (*sel % tenants) as u32;
            let mut spec = d.state.tenant(t).spec.clone();
            if let Some(q) = spec.quotas.first_mut() {
                q.nominal = *nominal;
                q.lending_limit = *lending;
            }
            d.apply(Event::TenantConfigured { spec });
        }
        Op::HalfLife(c, h) => {
            let at = d.now;
            d.apply(Event::CohortConfigured {
                spec: gpusched_model::CohortSpec {
                    name: format!("c{c}"),
                    usage_half_life_s: *h,
                },
                at,
            });
        }
    }
    None
}

fn decisions(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| !matches!(e, Event::JobPending { .. }))
        .collect()
}

/// The scan memo is a pure cache: on a copy, run memo'd cycles until they
/// settle (nothing examined and nothing decided, or ten cycles deciding
/// nothing); then a cycle with a fresh memo must decide nothing either. A
/// stale memo entry would hide a job that could be admitted, placed or
/// given victims.
fn assert_memo_hides_nothing(d: &Driver) {
    let mut st = d.state.clone();
    let mut memo = d.memo.clone();
    let mut idle = 0;
    for _ in 0..200 {
        let out = run_cycle(&mut st, &mut memo, &d.cfg, d.now).expect("memo'd cycle");
        let s = out.stats;
        let decided = !decisions(&out.events).is_empty();
        // A cycle plans victims for one beneficiary per flavor: the next
        // one may plan for another, so a plan is work, not a settled state.
        let examined = s.quota.heads_examined
            + s.placement.heads_examined
            + s.validated
            + s.requeued
            + s.preemption.beneficiaries;
        if examined == 0 && !decided {
            break;
        }
        idle = if decided { 0 } else { idle + 1 };
        if idle >= 10 {
            break;
        }
    }
    let out = run_cycle(&mut st, &mut ScanMemo::default(), &d.cfg, d.now).expect("fresh cycle");
    let hidden = decisions(&out.events);
    assert!(hidden.is_empty(), "the memo hid work: {hidden:?}");
}

/// Runs the operations, then drains: cycles and finishes work until nothing
/// moves. Returns the driver and (log length, live hash) after every step.
fn run(
    c: &ClusterGen,
    tenants: &[TenantGen],
    cfg: CycleConfig,
    ops: &[Op],
) -> (Driver, Vec<(usize, String)>) {
    let mut d = Driver::new(cfg);
    setup(&mut d, c, tenants);
    let mut checkpoints = vec![(d.log.len(), d.state.state_hash())];
    for op in ops {
        if step(&mut d, tenants.len(), op).is_some() {
            assert_memo_hides_nothing(&d);
        }
        if let Err(e) = d.state.check_invariants() {
            panic!("invariant broken after {op:?}: {e}");
        }
        checkpoints.push((d.log.len(), d.state.state_hash()));
    }
    for _ in 0..500 {
        let moved = !step(&mut d, tenants.len(), &Op::Cycle)
            .unwrap_or_default()
            .is_empty();
        let busy = !holders(&d).is_empty();
        d.advance(1);
        d.finish_all();
        checkpoints.push((d.log.len(), d.state.state_hash()));
        if !moved && !busy {
            break;
        }
    }
    (d, checkpoints)
}

fn check_replay(d: &Driver, checkpoints: &[(usize, String)]) -> Result<(), TestCaseError> {
    let mut st = State::new();
    let mut cp = checkpoints.iter().peekable();
    while let Some((0, h)) = cp.peek() {
        prop_assert_eq!(&st.state_hash(), h);
        cp.next();
    }
    for (i, e) in d.log.iter().enumerate() {
        let before = st.state_hash();
        // Setting a cohort to what it was set to at that same time.
        let same_settings = match e {
            Event::CohortConfigured { spec, at } => st.cohort_idx(&spec.name).is_some_and(|c| {
                let c = st.cohort(c);
                c.usage_half_life_s == spec.usage_half_life_s && c.configured_at == Some(*at)
            }),
            // Configuring a tenant as it is, or changing only its quota
            // settings: the hash covers usage and budgets, not quota
            // settings (older states hash as they did); the tenants are
            // compared whole at the end.
            Event::TenantConfigured { spec } => st
                .tenant_idx(&spec.name)
                .is_some_and(|t| same_but_quota_settings(&st.tenant(t).spec, spec)),
            _ => false,
        };
        if let Err(err) = st.apply(e) {
            return Err(TestCaseError::fail(format!(
                "replay refused event {i} {e:?}: {err}"
            )));
        }
        let after = st.state_hash();
        // Every event but a pending reason (and the topology, here the
        // default one) changes something the hash covers.
        if !same_settings
            && !matches!(
                e,
                Event::JobPending { .. } | Event::TopologyConfigured { .. }
            )
        {
            prop_assert_ne!(
                &before,
                &after,
                "event {} {:?} is invisible to the state hash",
                i,
                e
            );
        }
        while let Some((n, h)) = cp.peek() {
            if *n != i + 1 {
                break;
            }
            prop_assert_eq!(
                &after,
                h,
                "replayed state differs from the live one after event {}",
                i
            );
            cp.next();
        }
    }
    prop_assert_eq!(st.state_hash(), d.state.state_hash());
    prop_assert_eq!(st.applied(), d.state.applied());
    prop_assert_eq!(st.phase_counts(), d.state.phase_counts());
    prop_assert_eq!(st.tenants(), d.state.tenants());
    prop_assert!(st.check_invariants().is_ok());
    Ok(())
}

/// Whether two tenant specs differ at most in their quotas' nominal,
/// borrowing and lending settings.
fn same_but_quota_settings(a: &gpusched_model::TenantSpec, b: &gpusched_model::TenantSpec) -> bool {
    let settings_only = |s: &gpusched_model::TenantSpec| {
        let mut s = s.clone();
        for q in &mut s.quotas {
            (q.nominal, q.borrowing_limit, q.lending_limit) = (0, None, None);
        }
        s
    };
    settings_only(a) == settings_only(b)
}

/// Replays `log[..cut]`, takes a snapshot there, reads it back and folds
/// the rest: it must be the replay from zero, byte for byte (every index
/// included), and decide the same next cycle.
fn check_snapshot_at(d: &Driver, cut: usize) -> Result<(), TestCaseError> {
    let mut head = State::new();
    for e in &d.log[..cut] {
        prop_assert!(head.apply(e).is_ok());
    }
    let bytes = snapshot::encode(&head, cut as u64);
    let snap = snapshot::decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(snap.seq, cut as u64);
    prop_assert!(
        snap.state == head,
        "the state read back differs from the one written at {}",
        cut
    );
    prop_assert_eq!(
        next_decisions(&head, d),
        next_decisions(&snap.state, d),
        "a state read from its snapshot decides otherwise at {}",
        cut
    );
    let mut resumed = snap.state;
    for e in &d.log[cut..] {
        prop_assert!(resumed.apply(e).is_ok());
    }
    let replayed = d.replay();
    let end = d.log.len() as u64;
    prop_assert_eq!(resumed.state_hash(), replayed.state_hash());
    prop_assert!(
        resumed == replayed,
        "snapshot at {} + tail differs from the replay",
        cut
    );
    prop_assert!(
        snapshot::encode(&resumed, end) == snapshot::encode(&replayed, end),
        "snapshot at {} + tail differs from the replay",
        cut
    );
    prop_assert_eq!(
        next_decisions(&resumed, d),
        next_decisions(&replayed, d),
        "decisions differ after a snapshot at {}",
        cut
    );
    Ok(())
}

/// What a cycle would decide now over a copy of `state`.
fn next_decisions(state: &State, d: &Driver) -> Option<Vec<Event>> {
    let mut s = state.clone();
    run_cycle(&mut s, &mut ScanMemo::default(), &d.cfg, d.now)
        .ok()
        .map(|o| o.events)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("GPUSCHED_PROP_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64), ..ProptestConfig::default() })]

    /// Invariants 1–3 and 8 after every step, and replay (6) at every point.
    #[test]
    fn random_workloads_keep_invariants_and_replay(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        ops in proptest::collection::vec(op_gen(), 1..150),
    ) {
        let (d, checkpoints) = run(&c, &tenants, cfg, &ops);
        check_replay(&d, &checkpoints)?;
        if std::env::var("GPUSCHED_PROP_STATS").is_ok() {
            let pc = d.state.phase_counts();
            eprintln!("jobs {} ok {} failed {} cancelled {} rejected {} admitted {} queued {} events {}",
                d.jobs.len(), pc.get(Phase::Succeeded), pc.get(Phase::Failed), pc.get(Phase::Cancelled),
                pc.get(Phase::Rejected), pc.get(Phase::Admitted), pc.get(Phase::Queued), d.log.len());
        }

        assert_memo_hides_nothing(&d);

        // Determinism: the same inputs give the same log.
        let (again, _) = run(&c, &tenants, cfg, &ops);
        prop_assert_eq!(&again.log, &d.log);
    }

    /// The same with queues held, drained, stopped and released and nodes
    /// evicted: invariants and replay hold, nothing is bound on a node out
    /// of service (checked in `step`), and no cycle admits from a queue
    /// that is not open or accepts into one draining or stopped (the fold
    /// refuses both, which would fail the cycle).
    #[test]
    fn admin_operations_keep_invariants_and_replay(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        ops in proptest::collection::vec(op_with_admin_gen(), 1..150),
    ) {
        let (d, checkpoints) = run(&c, &tenants, cfg, &ops);
        check_replay(&d, &checkpoints)?;
        assert_memo_hides_nothing(&d);
        // Every eviction and every requeue from a stopped queue took a
        // job the fold let it take: the log replayed above holds them.
        if std::env::var("GPUSCHED_PROP_STATS").is_ok() {
            let evicted = d.log.iter().filter(|e| matches!(e, Event::EvictionPlanned { .. })).count();
            let changes = d.log.iter().filter(|e| matches!(e, Event::QueueStateSet { .. } | Event::NodeEvicted { .. })).count();
            eprintln!("admin ops {changes} evictions {evicted}");
        }
    }

    /// Dependencies and limited arrays: invariants and replay hold (the
    /// gates' indexes among them), and, read back from the log, no job was
    /// admitted before each `after_ok` dependency succeeded and each
    /// `after` one ended, no limited array ever held quota for more tasks
    /// than its limit, and every job cancelled for a dependency had one
    /// that ended without succeeding.
    #[test]
    fn dependencies_and_array_limits_keep_invariants_and_replay(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        ops in proptest::collection::vec(op_with_gates_gen(), 1..150),
    ) {
        let (d, checkpoints) = run(&c, &tenants, cfg, &ops);
        check_replay(&d, &checkpoints)?;
        assert_memo_hides_nothing(&d);
        check_gates_in_log(&d.log)?;
        if std::env::var("GPUSCHED_PROP_STATS").is_ok() {
            let failed = d.log.iter().filter(|e| matches!(e, Event::JobDependencyFailed { .. })).count();
            let waited = d.jobs.iter().filter(|j| !d.job(**j).spec.after_ok.is_empty() || !d.job(**j).spec.after.is_empty()).count();
            let ran = d.jobs.iter().filter(|j| d.job(**j).spec.array.is_some() && d.job(**j).phase == Phase::Succeeded).count();
            eprintln!("gated jobs {waited} dependency-failed {failed} array tasks succeeded {ran}");
        }
    }

    /// Fair share with a half-life: invariants and replay hold with
    /// cohorts' half-lives set and changed at random, and each tenant's
    /// decayed use equals a sum computed apart from the fold: over the
    /// stretches of constant usage since its cohort's last change,
    /// `u·τ·(2^(−(now−end)/h) − 2^(−(now−start)/h))`.
    #[test]
    fn decayed_use_keeps_invariants_replays_and_sums_what_was_held(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        first in (half_life_gen(), half_life_gen()),
        ops in proptest::collection::vec(op_with_half_lives_gen(), 1..150),
    ) {
        let mut ops = ops;
        ops.insert(0, Op::HalfLife(0, first.0));
        ops.insert(1, Op::HalfLife(1, first.1));
        let (d, checkpoints) = run(&c, &tenants, cfg, &ops);
        check_replay(&d, &checkpoints)?;
        assert_memo_hides_nothing(&d);
        check_decayed_use_in_log(&d.log)?;
        if std::env::var("GPUSCHED_PROP_STATS").is_ok() {
            let kept = (0..d.state.tenants().len() as u32)
                .filter(|&t| d.state.decayed_use(t, d.now).gpu_ms.iter().any(|v| *v > 0.0))
                .count();
            let admitted = d.log.iter().filter(|e| matches!(e, Event::JobAdmitted { .. })).count();
            eprintln!("tenants with decayed use {kept} of {} admissions {admitted}", d.state.tenants().len());
        }
    }

    /// GPU-hour budgets: invariants and replay hold with budgets set,
    /// changed and dropped at random and days going by; read back from the
    /// log, each budget's count equals a sum computed apart from the fold,
    /// no tenant was admitted in a flavor while its budget there was spent
    /// with `wait`, everything admitted past a `borrow-only` budget was
    /// borrowed, and a budget was marked spent only when used up and
    /// renewed only in a new period or when raised.
    #[test]
    fn budgets_keep_invariants_replay_and_hold_what_they_promise(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        first in (0u64..=4, any::<bool>()),
        ops in proptest::collection::vec(op_with_budgets_gen(), 1..150),
    ) {
        let mut ops = ops;
        ops.insert(0, Op::Budget(0, first.0.max(1), first.1));
        let (d, checkpoints) = run(&c, &tenants, cfg, &ops);
        check_replay(&d, &checkpoints)?;
        assert_memo_hides_nothing(&d);
        check_budgets_in_log(&d.log)?;
        if std::env::var("GPUSCHED_PROP_STATS").is_ok() {
            let spent = d.log.iter().filter(|e| matches!(e, Event::BudgetSpent { .. })).count();
            let renewed = d.log.iter().filter(|e| matches!(e, Event::BudgetRenewed { .. })).count();
            let waited = d.log.iter().filter(|e| matches!(e, Event::JobPending { reason: gpusched_events::PendingReason::BudgetSpent { .. }, .. })).count();
            eprintln!("budgets spent {spent} renewed {renewed} waits for a budget {waited}");
        }
    }

    /// Quota taken back under running jobs: invariants and replay hold
    /// with tenants' nominal quotas and lending limits lowered and raised
    /// at random while their jobs and their borrowers' run. Usage past the
    /// new quota (a tenant past its limit, a cohort lending more than its
    /// members now lend) appears only with the change; no admission adds
    /// to it (the driver checks this after every event and cycle).
    #[test]
    fn quota_changes_keep_invariants_and_replay(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        ops in proptest::collection::vec(op_with_quota_changes_gen(), 1..150),
    ) {
        let (d, checkpoints) = run(&c, &tenants, cfg, &ops);
        check_replay(&d, &checkpoints)?;
        assert_memo_hides_nothing(&d);
        if std::env::var("GPUSCHED_PROP_STATS").is_ok() {
            let changes = ops.iter().filter(|o| matches!(o, Op::Requota(..))).count();
            eprintln!("quota changes {changes}");
        }
    }

    /// With every node healthy and enough cycles, nothing stays queued that
    /// its tenant's quota and the cluster's shape allow: all accepted jobs end.
    #[test]
    fn healthy_cluster_drains_every_accepted_job(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        jobs in proptest::collection::vec(suite_job(), 1..40),
    ) {
        // One usable flavor (`a`): a job admission accepts can always run
        // once the cluster is idle, so every accepted job must end.
        let tenants: Vec<TenantGen> = tenants.into_iter().map(|t| TenantGen { b: None, ..t }).collect();
        let ops: Vec<Op> = jobs
            .into_iter()
            .map(|j| Op::Submit(JobGen { flavors: j.flavors.min(1), ..j }))
            .collect();
        let (d, checkpoints) = run(&c, &tenants, cfg, &ops);
        check_replay(&d, &checkpoints)?;
        let has_a = d.state.flavor("a").is_some_and(|f| d.state.capacity().has_nodes(f));
        for &j in &d.jobs {
            let job = d.job(j);
            if job.phase == Phase::Rejected || !has_a {
                continue;
            }
            prop_assert_eq!(job.phase, Phase::Succeeded, "job {} stuck: {:?}", j, job.last_reason);
        }
    }

    /// Snapshots: a snapshot at a random cut of a recorded log, plus the
    /// tail, is the replay from zero (same bytes, same hash, same next
    /// decisions).
    #[test]
    fn a_snapshot_at_any_cut_plus_the_tail_is_the_replay(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        ops in proptest::collection::vec(op_gen(), 1..120),
        cuts in proptest::collection::vec(0.0f64..=1.0, 1..4),
    ) {
        let (d, _) = run(&c, &tenants, cfg, &ops);
        for f in cuts {
            check_snapshot_at(&d, (f * d.log.len() as f64) as usize)?;
        }
    }
}

/// Folds the log and checks what budgets promise (see
/// `budgets_keep_invariants_replay_and_hold_what_they_promise`); the count
/// is summed from the usage between events, from when each budget began
/// counting (its first configuration, or a change of period).
fn check_budgets_in_log(log: &[Event]) -> Result<(), TestCaseError> {
    /// When counting began, and the (start, end, GPUs held) stretches since.
    type Count = (u64, Vec<(u64, u64, u32)>);
    let mut counts: BTreeMap<(u32, u16), Count> = BTreeMap::new();
    let mut st = State::new();
    for (i, e) in log.iter().enumerate() {
        match e {
            Event::JobAdmitted {
                job,
                flavor,
                borrowed,
                ..
            } => {
                let j = st.job(*job).expect("admitted job");
                let (t, f) = (
                    j.tenant.expect("a tenant"),
                    st.flavor(flavor).expect("a flavor"),
                );
                let tenant = st.tenant(t);
                prop_assert!(
                    !tenant.budget_holds(f),
                    "event {}: job {} admitted past a spent budget",
                    i,
                    job
                );
                if tenant.budget_borrows_only(f) {
                    prop_assert_eq!(
                        *borrowed,
                        j.spec.total_gpus(),
                        "event {}: job {} not all borrowed",
                        i,
                        job
                    );
                }
            }
            Event::BudgetSpent {
                tenant, flavor, at, ..
            }
            | Event::BudgetRenewed {
                tenant, flavor, at, ..
            } => {
                let t = st.tenant_idx(tenant).expect("a tenant");
                let f = st.flavor(flavor).expect("a flavor");
                let l = st.tenant(t).budget(f).expect("a budget");
                let left = l.left_at(st.tenant(t).used(f).get(), *at);
                if matches!(e, Event::BudgetSpent { .. }) {
                    prop_assert_eq!(left, 0, "event {}: marked spent with GPU-ms left", i);
                } else {
                    let new_period = l.spent_in != Some(l.budget.period.start_of(*at));
                    prop_assert!(
                        new_period || left > 0,
                        "event {}: renewed in the same period, still spent",
                        i
                    );
                }
            }
            _ => {}
        }
        let before_clock = st.clock().0;
        let before: Vec<(Vec<u32>, Vec<Option<gpusched_model::Budget>>)> = st
            .tenants()
            .iter()
            .map(|t| {
                (
                    t.usage.iter().map(|u| u.get()).collect(),
                    t.budgets
                        .iter()
                        .map(|b| b.as_ref().map(|l| l.budget))
                        .collect(),
                )
            })
            .collect();
        st.apply(e).expect("the log replays");
        let now = st.clock().0;
        for (t, (usage, _)) in before.iter().enumerate() {
            if now <= before_clock {
                break;
            }
            for ((tt, f), (_, stretches)) in counts.iter_mut() {
                if *tt == t as u32 {
                    let u = usage.get(usize::from(*f)).copied().unwrap_or(0);
                    stretches.push((before_clock, now, u));
                }
            }
        }
        if let Event::TenantConfigured { spec } = e {
            let t = st.tenant_idx(&spec.name).expect("configured");
            let old = before
                .get(t as usize)
                .map(|(_, b)| b.clone())
                .unwrap_or_default();
            for (f, l) in st.tenant(t).budgets.iter().enumerate() {
                let key = (t, f as u16);
                match l {
                    None => {
                        counts.remove(&key);
                    }
                    Some(l) => {
                        let kept = old
                            .get(f)
                            .copied()
                            .flatten()
                            .is_some_and(|b| b.period == l.budget.period);
                        if !kept {
                            counts.insert(key, (now, Vec::new()));
                        }
                    }
                }
            }
            counts.retain(|(tt, f), _| *tt != t || st.tenant(t).budget(*f).is_some());
        }
    }
    let now = st.clock();
    for ((t, f), (from, stretches)) in &counts {
        let tenant = st.tenant(*t);
        let l = tenant.budget(*f).expect("a budget");
        let start = l.budget.period.start_of(now).0.max(*from);
        let want: u64 = stretches
            .iter()
            .map(|&(s, e, u)| u64::from(u) * e.min(now.0).saturating_sub(s.max(start)))
            .sum();
        prop_assert_eq!(
            l.used_at(tenant.used(*f).get(), now),
            want,
            "tenant {} flavor {}",
            t,
            f
        );
    }
    Ok(())
}

/// Folds the log and checks, before each admission, that the job's
/// dependencies had ended as it requires; after each event, that no
/// limited array holds quota for more tasks than its limit; and that each
/// `JobDependencyFailed` names an `after_ok` dependency that ended
/// without succeeding.
fn check_gates_in_log(log: &[Event]) -> Result<(), TestCaseError> {
    let mut st = State::new();
    for (i, e) in log.iter().enumerate() {
        match e {
            Event::JobAdmitted { job, .. } => {
                let spec = &st.job(*job).expect("admitted job").spec;
                for (dep, kind) in spec.dependencies() {
                    let phase = st.job(dep).map(|d| d.phase);
                    let ok = match kind {
                        gpusched_model::DependencyKind::AfterOk => phase == Some(Phase::Succeeded),
                        gpusched_model::DependencyKind::After => {
                            phase.is_some_and(Phase::is_terminal)
                        }
                    };
                    prop_assert!(
                        ok,
                        "event {}: job {} admitted with dependency {} {:?}",
                        i,
                        job,
                        dep,
                        phase
                    );
                }
            }
            Event::JobDependencyFailed {
                job, dependency, ..
            } => {
                let spec = &st.job(*job).expect("cancelled job").spec;
                let phase = st.job(*dependency).map(|d| d.phase);
                prop_assert!(spec.after_ok.contains(dependency));
                prop_assert!(
                    phase.is_some_and(|p| p.is_terminal() && p != Phase::Succeeded),
                    "event {}: {:?}",
                    i,
                    phase
                );
            }
            _ => {}
        }
        st.apply(e).expect("the log replays");
        let mut holding: std::collections::BTreeMap<u64, (u32, u32)> = Default::default();
        for j in st.jobs() {
            if let Some(a) = j.spec.array.filter(|_| j.phase.holds_quota()) {
                if let Some(limit) = a.max_running {
                    let e = holding.entry(a.array).or_insert((0, limit));
                    e.0 += 1;
                }
            }
        }
        for (array, (n, limit)) in holding {
            prop_assert!(
                n <= limit,
                "event {}: array {} holds quota for {} tasks, limit {}",
                i,
                array,
                n,
                limit
            );
        }
    }
    Ok(())
}

/// Folds the log and sums each tenant's decayed use apart from the fold:
/// from its cohort's last half-life change (the fold's value then), add
/// each stretch of constant usage decayed to the end. The two agree to
/// 1e-9 of the larger.
fn check_decayed_use_in_log(log: &[Event]) -> Result<(), TestCaseError> {
    /// A tenant's record: the base (value and time at the last change of
    /// its cohort's half-life), then (start, end, gpus) stretches.
    #[derive(Default)]
    struct Sum {
        base: Vec<f64>,
        base_at: u64,
        stretches: Vec<(u64, u64, Vec<u32>)>,
    }
    let mut st = State::new();
    let mut sums: Vec<Sum> = Vec::new();
    for e in log {
        let before_clock = st.clock().0;
        let before_usage: Vec<Vec<u32>> = st
            .tenants()
            .iter()
            .map(|t| t.usage.iter().map(|u| u.get()).collect())
            .collect();
        st.apply(e).expect("the log replays");
        let now = st.clock().0;
        sums.resize_with(st.tenants().len(), Sum::default);
        for (t, usage) in before_usage.into_iter().enumerate() {
            if now > before_clock {
                sums[t].stretches.push((before_clock, now, usage));
            }
        }
        if matches!(
            e,
            Event::CohortConfigured { .. } | Event::TenantConfigured { .. }
        ) {
            for (t, sum) in sums.iter_mut().enumerate() {
                let d = st.decayed_use(t as u32, st.clock());
                *sum = Sum {
                    base: d.gpu_ms,
                    base_at: now,
                    stretches: Vec::new(),
                };
            }
        }
    }
    let now = st.clock().0;
    for (t, sum) in sums.iter().enumerate() {
        let h = st.usage_half_life_ms(t as u32);
        let fold = st.decayed_use(t as u32, st.clock());
        if h == 0 {
            prop_assert!(fold.gpu_ms.is_empty());
            continue;
        }
        let tau = gpusched_core::mean_life_ms(h);
        let decay = |age: u64| 0.5f64.powf(age as f64 / h as f64);
        let flavors = fold.gpu_ms.len().max(sum.base.len());
        for f in 0..flavors {
            let mut want = sum.base.get(f).copied().unwrap_or(0.0) * decay(now - sum.base_at);
            for (start, end, usage) in &sum.stretches {
                let u = f64::from(usage.get(f).copied().unwrap_or(0));
                want += u * tau * (decay(now - end) - decay(now - start));
            }
            let got = fold.gpu_ms(f);
            let scale = want.abs().max(got.abs()).max(1.0);
            prop_assert!(
                (want - got).abs() <= 1e-9 * scale,
                "tenant {} flavor {}: fold {} sum {}",
                t,
                f,
                got,
                want
            );
        }
    }
    Ok(())
}
