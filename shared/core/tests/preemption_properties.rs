//! Property tests of preemption, reservations and checkpoints: random
//! clusters, tenants (cohorts, nominal/borrowing/lending, priority
//! preemption on or off), jobs (preemptible or not, checkpoint policy, max
//! runtime, priority) and interleavings of cycles, time, agent checkpoints
//! (monotonic per run), starts, finishes and node losses. After every step:
//! invariants 1–3 (`check_invariants`); 4 — no non-preemptible job is ever
//! a victim, preempted or in `Preempting` but by an admin's eviction (a
//! stopped queue, a node emptied for maintenance); 5 — every start of a job with a
//! complete checkpoint is on that checkpoint's flavor and resumes from its
//! progress, every preemption resumes from the last complete checkpoint,
//! and lost work is exactly the GPU-time since it; 6 — the log replays to
//! the same state hash; 7 — goodput accounting gives every allocated
//! GPU-ms exactly one part, and its lost + checkpoint parts are what the
//! log's preemptions and requeues lost; 8 — a reclaim takes from a
//! borrower only what it still borrows once the victims already stopping
//! are gone (before its last, indivisible victim it is above nominal).
#![allow(clippy::unwrap_used)]

mod common;

use common::gen::{admin, admin_op_gen, AdminOp};
use common::gen::{cluster_gen, job_gen, pick, quota, setup, tenant_gen};
use common::gen::{ClusterGen, JobExtras, JobGen, TenantGen, TenantMix};
use common::Driver;
use gpusched_core::{CycleConfig, Goodput, Phase, PreemptionConfig, State, VictimOrder};
use gpusched_events::{CheckpointRef, Event, PreemptionCause, Victim};
use gpusched_model::{Gpus, JobId, NodeId, Timestamp};
use proptest::prelude::*;
use std::collections::BTreeMap;

const MAX_JOBS: usize = 50;

#[derive(Clone, Debug)]
enum Op {
    Submit(JobGen),
    Cycle,
    Start(usize),
    Finish(usize),
    /// A complete checkpoint of a running or preempting job, capturing all
    /// but this many seconds of its work.
    Checkpoint(usize, u64),
    Lose(usize),
    AddNode(usize),
    Advance(u64),
    Admin(AdminOp),
}

/// Tenants of weight 1, priority preemption on 7 times in 10, smaller
/// quotas with a lending limit 3 times in 10.
fn suite_tenant() -> impl Strategy<Value = TenantGen> {
    tenant_gen(TenantMix {
        in_cohort: 0.85,
        weight: Just(1u8).boxed(),
        priority_preemption: proptest::bool::weighted(0.7).boxed(),
        quota: quota(
            0..=24,
            0..=16,
            proptest::option::weighted(0.3, 0u32..=24).boxed(),
        )
        .boxed(),
        second_flavor: 0.25,
    })
}

fn suite_cluster() -> impl Strategy<Value = ClusterGen> {
    cluster_gen(2, 3, 0.2)
}

/// Jobs that may be non-preemptible, checkpoint every 60 or 300 s, or
/// declare a max runtime.
fn suite_job() -> impl Strategy<Value = JobGen> {
    job_gen(
        3,
        JobExtras {
            preemptible: proptest::bool::weighted(0.75).boxed(),
            checkpoint: proptest::option::weighted(
                0.6,
                (prop_oneof![Just(60u64), Just(300)], 5u64..=120),
            )
            .boxed(),
            max_runtime_s: proptest::option::weighted(0.4, 30u64..=1200).boxed(),
        },
    )
}

fn op_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => suite_job().prop_map(Op::Submit),
        7 => Just(Op::Cycle),
        4 => any::<usize>().prop_map(Op::Start),
        1 => any::<usize>().prop_map(Op::Finish),
        3 => (any::<usize>(), prop_oneof![Just(0u64), Just(5), Just(40)])
            .prop_map(|(s, lag)| Op::Checkpoint(s, lag)),
        1 => any::<usize>().prop_map(Op::Lose),
        1 => any::<usize>().prop_map(Op::AddNode),
        4 => prop_oneof![1u64..=20, 20u64..=400].prop_map(Op::Advance),
    ]
}

/// `op_gen` with queue changes and node evictions mixed in (a separate
/// strategy: `op_gen`'s cases and saved seeds stay as they were).
fn op_with_admin_gen() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op_gen(),
        1 => admin_op_gen().prop_map(Op::Admin),
    ]
}

fn config_gen() -> impl Strategy<Value = CycleConfig> {
    (
        (1usize..=8, 1usize..=8, 0usize..=4),
        (
            prop_oneof![Just(0u64), Just(10_000), Just(60_000)],
            prop_oneof![Just(0u64), Just(30_000)],
            prop_oneof![Just(0u64), Just(120_000)],
            1usize..=16,
            1usize..=64,
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (max_heads, max_heads_per_tenant, reservations),
                (
                    min_runtime_ms,
                    grace_ms,
                    max_checkpoint_grace_ms,
                    max_sets,
                    max_candidates,
                    kueue,
                ),
            )| CycleConfig {
                max_heads,
                max_heads_per_tenant,
                reservations,
                preemption: PreemptionConfig {
                    min_runtime_ms,
                    grace_ms,
                    max_checkpoint_grace_ms,
                    max_sets,
                    max_candidates,
                    order: if kueue {
                        VictimOrder::Kueue
                    } else {
                        VictimOrder::Checkpoint
                    },
                    ..PreemptionConfig::default()
                },
                ..CycleConfig::default()
            },
        )
}

/// What the log says about one job's runs and checkpoints.
#[derive(Clone, Debug, Default)]
struct JobModel {
    /// Last complete checkpoint: reference and flavor it was taken on.
    ckpt: Option<(CheckpointRef, String)>,
    /// Start of the current run.
    run_start: Option<Timestamp>,
    /// Progress the current run resumed from.
    resume: u64,
}

/// Checks invariants 4 and 5 over the events applied since `from`, against
/// a model built from the log alone.
struct Checker {
    from: usize,
    jobs: BTreeMap<JobId, JobModel>,
    /// The state as each event found it, folded from the log alone.
    before: State,
    /// Counts, for the stats line.
    plans: u64,
    preempted: u64,
    resumed: u64,
}

impl Checker {
    fn new() -> Self {
        Checker {
            from: 0,
            jobs: BTreeMap::new(),
            before: State::new(),
            plans: 0,
            preempted: 0,
            resumed: 0,
        }
    }

    fn lost_since_checkpoint(&self, d: &Driver, job: JobId, at: Timestamp) -> u64 {
        let m = &self.jobs[&job];
        let Some(start) = m.run_start else { return 0 };
        let saved = m
            .ckpt
            .as_ref()
            .map_or(0, |(c, _)| c.progress_ms.saturating_sub(m.resume));
        d.job(job).spec.total_gpus() as u64 * at.millis_since(Timestamp(start.0 + saved))
    }

    /// Invariant 8: a reclaim takes from a borrower only what it borrows
    /// once the victims already stopping are gone: before its last victim
    /// (jobs are indivisible) the tenant is still above its nominal quota.
    fn reclaim_keeps_nominal(&self, victims: &[Victim]) -> Result<(), String> {
        let s = &self.before;
        let mut taken: BTreeMap<_, (Gpus, Gpus)> = BTreeMap::new();
        for v in victims {
            let j = s.job(v.job).ok_or("a victim the log never submitted")?;
            let (Some(t), Some(f)) = (j.tenant, j.flavor) else {
                return Err(format!("victim {} holds no quota", v.job));
            };
            let e = taken.entry((t, f)).or_default();
            e.0 += j.spec.total_gpus();
            e.1 = e.1.max(j.spec.total_gpus());
        }
        for (&(t, f), &(sum, largest)) in &taken {
            let stopping: Gpus = self
                .jobs
                .keys()
                .filter_map(|id| s.job(*id))
                .filter(|j| j.phase == Phase::Preempting && j.tenant == Some(t))
                .filter(|j| j.flavor == Some(f))
                .map(|j| j.spec.total_gpus())
                .sum();
            let tenant = s.tenant(t);
            let nominal = tenant.nominal(f).get();
            let keeps = tenant.used(f).get().saturating_sub(stopping);
            if sum - largest >= keeps.saturating_sub(nominal) {
                return Err(format!(
                    "a reclaim took {sum} GPUs from {} (largest victim {largest}), which keeps {keeps} once its {stopping} stopping GPUs are gone, nominal {nominal}",
                    tenant.spec.name
                ));
            }
        }
        Ok(())
    }

    fn check(&mut self, d: &Driver) -> Result<(), String> {
        let events = d.log[self.from..].to_vec();
        self.from = d.log.len();
        for e in &events {
            match e {
                Event::JobSubmitted { job, .. } => {
                    self.jobs.insert(*job, JobModel::default());
                }
                Event::PreemptionPlanned { victims, cause, .. } => {
                    self.plans += 1;
                    if let PreemptionCause::Reclaim { .. } = cause {
                        self.reclaim_keeps_nominal(victims)?;
                    }
                    for v in victims {
                        if !d.job(v.job).spec.preemptible {
                            return Err(format!(
                                "non-preemptible job {} planned as a victim",
                                v.job
                            ));
                        }
                    }
                }
                Event::JobPreempted {
                    job,
                    lost_gpu_ms,
                    resume_from,
                    at,
                } => {
                    self.preempted += 1;
                    let evicted = self
                        .before
                        .job(*job)
                        .is_some_and(|j| matches!(j.preempt, Some((_, None))));
                    if !d.job(*job).spec.preemptible && !evicted {
                        return Err(format!("non-preemptible job {job} preempted"));
                    }
                    let last = self.jobs[job].ckpt.as_ref().map(|(c, _)| c.clone());
                    if *resume_from != last {
                        return Err(format!(
                            "job {job} preempted to resume from {resume_from:?}, last complete checkpoint {last:?}"
                        ));
                    }
                    let want = self.lost_since_checkpoint(d, *job, *at);
                    if *lost_gpu_ms != want {
                        return Err(format!(
                            "job {job} preempted losing {lost_gpu_ms}, not {want}"
                        ));
                    }
                    self.jobs.get_mut(job).unwrap().run_start = None;
                }
                Event::JobRequeued {
                    job,
                    lost_gpu_ms,
                    at,
                    ..
                } => {
                    let want = self.lost_since_checkpoint(d, *job, *at);
                    if *lost_gpu_ms != want {
                        return Err(format!(
                            "job {job} requeued losing {lost_gpu_ms}, not {want}"
                        ));
                    }
                    self.jobs.get_mut(job).unwrap().run_start = None;
                }
                Event::JobCheckpointed {
                    job,
                    progress_ms,
                    uri,
                    ..
                } => {
                    let flavor = d
                        .job(*job)
                        .flavor
                        .map(|f| d.state.flavor_name(f).to_string())
                        .ok_or("checkpoint of a job without a flavor")?;
                    self.jobs.get_mut(job).unwrap().ckpt = Some((
                        CheckpointRef {
                            progress_ms: *progress_ms,
                            uri: uri.clone(),
                        },
                        flavor,
                    ));
                }
                Event::JobStarted { job, at } => {
                    let j = d.job(*job);
                    let m = self.jobs.get_mut(job).unwrap();
                    if let Some((c, flavor)) = &m.ckpt {
                        self.resumed += 1;
                        let on = j.flavor.map(|f| d.state.flavor_name(f).to_string());
                        if on.as_deref() != Some(flavor.as_str()) {
                            return Err(format!(
                                "job {job} resumed on {on:?}, its checkpoint is on {flavor}"
                            ));
                        }
                        if j.resume_progress_ms != c.progress_ms {
                            return Err(format!(
                                "job {job} resumed from {} ms, its checkpoint holds {}",
                                j.resume_progress_ms, c.progress_ms
                            ));
                        }
                    } else if j.resume_progress_ms != 0 {
                        return Err(format!("job {job} resumed without a checkpoint"));
                    }
                    m.run_start = Some(*at);
                    m.resume = j.resume_progress_ms;
                }
                _ => {}
            }
            self.before
                .apply(e)
                .map_err(|err| format!("the log does not fold: {err}"))?;
        }
        for &j in &d.jobs {
            let job = d.job(j);
            let evicted = matches!(job.preempt, Some((_, None)));
            if job.phase == Phase::Preempting && !job.spec.preemptible && !evicted {
                return Err(format!("non-preemptible job {j} is preempting"));
            }
        }
        d.state.check_invariants()
    }
}

fn step(d: &mut Driver, tenants: usize, op: &Op) {
    let node_count = d.state.nodes().len();
    let node = |sel: usize| NodeId((sel % node_count) as u32);
    match op {
        Op::Submit(g) => {
            if d.jobs.len() < MAX_JOBS {
                d.submit(g.spec(tenants));
            }
        }
        Op::Cycle => {
            d.cycle();
        }
        // The agent starts one bound job, or (one time in three) all of them.
        Op::Start(sel) => {
            if sel % 3 == 0 {
                d.start_bound();
            } else if let Some(j) = pick(&d.in_phase(Phase::Bound), *sel) {
                d.apply(Event::JobStarted { job: j, at: d.now });
            }
        }
        Op::Finish(sel) => {
            let mut running = d.in_phase(Phase::Running);
            running.extend(d.in_phase(Phase::Preempting));
            if let Some(j) = pick(&running, *sel) {
                d.finish(j);
            }
        }
        Op::Checkpoint(sel, lag) => {
            let mut running = d.in_phase(Phase::Running);
            running.extend(d.in_phase(Phase::Preempting));
            if let Some(j) = pick(&running, *sel) {
                let job = d.job(j);
                let ran = d.now.millis_since(job.started_at.unwrap());
                let done = job.resume_progress_ms + ran.saturating_sub(lag * 1000);
                let last = job.last_checkpoint.as_ref().map_or(0, |c| c.progress_ms);
                d.checkpoint(j, done.max(last).max(job.resume_progress_ms));
            }
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
    }
}

fn run(
    c: &ClusterGen,
    tenants: &[TenantGen],
    cfg: CycleConfig,
    ops: &[Op],
) -> Result<(Driver, Checker), TestCaseError> {
    let mut d = Driver::new(cfg);
    setup(&mut d, c, tenants);
    let mut chk = Checker::new();
    for op in ops {
        step(&mut d, tenants.len(), op);
        chk.check(&d)
            .map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))?;
    }
    // Drain: the agent starts what is bound, checkpoints and finishes work
    // while time passes, so plans run to their end.
    for i in 0..300u64 {
        let out = d.cycle();
        chk.check(&d).map_err(TestCaseError::fail)?;
        d.start_bound();
        chk.check(&d).map_err(TestCaseError::fail)?;
        d.advance(30);
        if i % 3 == 0 {
            step(&mut d, tenants.len(), &Op::Checkpoint(i as usize, 0));
            chk.check(&d).map_err(TestCaseError::fail)?;
        }
        if i % 2 == 1 {
            step(&mut d, tenants.len(), &Op::Finish(i as usize));
            chk.check(&d).map_err(TestCaseError::fail)?;
        }
        let busy = d.jobs.iter().any(|&j| d.phase(j).holds_gpus());
        if out.events.is_empty() && !busy {
            break;
        }
    }
    Ok((d, chk))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("GPUSCHED_PROP_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64), ..ProptestConfig::default() })]

    /// Invariants 1–6 under random preemption, reservations and checkpoints.
    #[test]
    fn preemption_keeps_invariants_and_replays(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        ops in proptest::collection::vec(op_gen(), 1..160),
    ) {
        verify(&c, &tenants, cfg, &ops)?;
    }

    /// The same with queues held, drained, stopped and released and nodes
    /// evicted for maintenance: evictions take the checkpoint protocol
    /// like any preemption, and every rule above still holds.
    #[test]
    fn admin_evictions_keep_invariants_and_replay(
        c in suite_cluster(),
        tenants in proptest::collection::vec(suite_tenant(), 1..=4),
        cfg in config_gen(),
        ops in proptest::collection::vec(op_with_admin_gen(), 1..160),
    ) {
        verify(&c, &tenants, cfg, &ops)?;
    }
}

/// Runs the operations and checks the replay and the goodput accounting.
fn verify(
    c: &ClusterGen,
    tenants: &[TenantGen],
    cfg: CycleConfig,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let (d, chk) = run(c, tenants, cfg, ops)?;
    let replayed = d.replay();
    prop_assert_eq!(replayed.state_hash(), d.state.state_hash());
    prop_assert_eq!(replayed.phase_counts(), d.state.phase_counts());
    let mut goodput = Goodput::default();
    let mut logged_loss = 0;
    for e in &d.log {
        goodput.observe(e, true);
        if let Event::JobPreempted { lost_gpu_ms, .. } | Event::JobRequeued { lost_gpu_ms, .. } = e
        {
            logged_loss += lost_gpu_ms;
        }
    }
    for (tenant, acc) in goodput.totals() {
        prop_assert_eq!(
            acc.parts_gpu_ms(),
            acc.allocated_gpu_ms,
            "{}: {:?}",
            tenant,
            acc
        );
    }
    let all = goodput.overall();
    prop_assert_eq!(all.lost_gpu_ms + all.checkpoint_gpu_ms, logged_loss);
    if std::env::var("GPUSCHED_PROP_STATS").is_ok() {
        eprintln!(
            "jobs {} plans {} preempted {} resumed {} events {}",
            d.jobs.len(),
            chk.plans,
            chk.preempted,
            chk.resumed,
            d.log.len()
        );
    }
    Ok(())
}
