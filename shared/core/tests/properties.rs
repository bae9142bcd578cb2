//! Property tests of the scheduling core: random clusters, tenants, jobs and
//! interleavings of cycles, agent facts, cancellations, cordons and node
//! losses. After every step the rules of docs/architecture.md ("The rules the core keeps") hold (1–3 via
//! `check_invariants`, 8 via the cycle's stats), and the recorded log
//! replays to the same state hash at every point (invariant 6).

mod common;

use common::{job, tenant, Driver};
use gpusched_core::{run_cycle, snapshot, CycleConfig, NodeStatus, Phase, ScanMemo, State};
use gpusched_events::{Event, Outcome};
use gpusched_model::{JobId, NodeId};
use proptest::prelude::*;

const TOPOLOGIES: [&str; 4] = ["node", "block", "rack", "any"];
const MAX_JOBS: usize = 60;

#[derive(Clone, Debug)]
struct QuotaGen {
    nominal: u32,
    borrowing: Option<u32>,
    lending: Option<u32>,
}

#[derive(Clone, Debug)]
struct TenantGen {
    cohort: Option<u8>,
    weight: u8,
    best_effort: bool,
    a: QuotaGen,
    b: Option<QuotaGen>,
}

#[derive(Clone, Debug)]
struct ClusterGen {
    racks: u32,
    blocks_per_rack: u32,
    nodes_per_block: u32,
    /// Per block: GPUs per node (4 or 8) and whether its flavor is `b`.
    blocks: Vec<(u32, bool)>,
}

#[derive(Clone, Debug)]
struct JobGen {
    tenant: usize,
    workers: u32,
    gpw: u32,
    topology: usize,
    priority: i32,
    flavors: u8,
}

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
}

fn quota_gen() -> impl Strategy<Value = QuotaGen> {
    (
        0u32..=32,
        proptest::option::of(0u32..=32),
        proptest::option::of(0u32..=32),
    )
        .prop_map(|(nominal, borrowing, lending)| QuotaGen {
            nominal,
            borrowing,
            lending,
        })
}

fn tenant_gen() -> impl Strategy<Value = TenantGen> {
    (
        proptest::option::weighted(0.8, 0u8..2),
        1u8..=4,
        any::<bool>(),
        quota_gen(),
        proptest::option::weighted(0.3, quota_gen()),
    )
        .prop_map(|(cohort, weight, best_effort, a, b)| TenantGen {
            cohort,
            weight,
            best_effort,
            a,
            b,
        })
}

fn cluster_gen() -> impl Strategy<Value = ClusterGen> {
    (
        1u32..=2,
        1u32..=3,
        1u32..=4,
        proptest::collection::vec(
            (
                prop_oneof![Just(4u32), Just(8u32)],
                proptest::bool::weighted(0.25),
            ),
            6,
        ),
    )
        .prop_map(
            |(racks, blocks_per_rack, nodes_per_block, blocks)| ClusterGen {
                racks,
                blocks_per_rack,
                nodes_per_block,
                blocks,
            },
        )
}

fn job_gen() -> impl Strategy<Value = JobGen> {
    (
        0usize..8,
        1u32..=4,
        prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
        0usize..4,
        0i32..=2,
        prop_oneof![6 => Just(0u8), 1 => Just(1), 1 => Just(2)],
    )
        .prop_map(
            |(tenant, workers, gpw, topology, priority, flavors)| JobGen {
                tenant,
                workers,
                gpw,
                topology,
                priority,
                flavors,
            },
        )
}

fn op_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => job_gen().prop_map(Op::Submit),
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

/// Builds the cluster and tenants.
fn setup(d: &mut Driver, c: &ClusterGen, tenants: &[TenantGen]) {
    d.apply(Event::TopologyConfigured {
        levels: vec!["rack".into(), "block".into()],
    });
    for r in 0..c.racks {
        for b in 0..c.blocks_per_rack {
            let (gpus, flavor_b) = c.blocks[(r * c.blocks_per_rack + b) as usize];
            let flavor = if flavor_b { "b" } else { "a" };
            for _ in 0..c.nodes_per_block {
                d.add_node(&format!("r{r}"), &format!("b{b}"), gpus, flavor);
            }
        }
    }
    for (i, t) in tenants.iter().enumerate() {
        let mut tb = tenant(&format!("t{i}")).weight(t.weight as f64);
        if let Some(c) = t.cohort {
            tb = tb.cohort(&format!("c{c}"));
        }
        if t.best_effort {
            tb = tb.best_effort();
        }
        for (flavor, q) in [("a", Some(&t.a)), ("b", t.b.as_ref())] {
            let Some(q) = q else { continue };
            tb = tb.quota(flavor, q.nominal);
            if let Some(l) = q.borrowing {
                tb = tb.borrowing(l);
            }
            if let Some(l) = q.lending {
                tb = tb.lending(l);
            }
        }
        d.tenant(tb);
    }
}

fn pick<T: Copy>(v: &[T], sel: usize) -> Option<T> {
    (!v.is_empty()).then(|| v[sel % v.len()])
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
                let mut spec = job(
                    &format!("t{}", g.tenant % tenants),
                    g.workers,
                    g.gpw,
                    TOPOLOGIES[g.topology],
                );
                spec.priority = g.priority;
                spec.flavors = match g.flavors {
                    0 => vec![],
                    1 => vec!["a".into()],
                    _ => vec!["b".into(), "a".into()],
                };
                d.submit(spec);
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
        let examined =
            s.quota_heads + s.placement_heads + s.validated + s.requeued + s.beneficiaries;
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
        if let Err(err) = st.apply(e) {
            return Err(TestCaseError::fail(format!(
                "replay refused event {i} {e:?}: {err}"
            )));
        }
        let after = st.state_hash();
        // Every event but a pending reason (and the topology, here the
        // default one) changes something the hash covers.
        if !matches!(
            e,
            Event::JobPending { .. } | Event::TopologyConfigured { .. }
        ) {
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
    prop_assert!(st.check_invariants().is_ok());
    Ok(())
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
        c in cluster_gen(),
        tenants in proptest::collection::vec(tenant_gen(), 1..=4),
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

    /// With every node healthy and enough cycles, nothing stays queued that
    /// its tenant's quota and the cluster's shape allow: all accepted jobs end.
    #[test]
    fn healthy_cluster_drains_every_accepted_job(
        c in cluster_gen(),
        tenants in proptest::collection::vec(tenant_gen(), 1..=4),
        cfg in config_gen(),
        jobs in proptest::collection::vec(job_gen(), 1..40),
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
        c in cluster_gen(),
        tenants in proptest::collection::vec(tenant_gen(), 1..=4),
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
