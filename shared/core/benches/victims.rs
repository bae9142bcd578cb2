//! Victim search against the number of running jobs: the search must be
//! bounded (docs/architecture.md, "How a cycle stays bounded", "Preemption").
//!
//! Builds 12,500 nodes × 8 GPUs (50 racks × 10 blocks × 25 nodes) full of
//! 1-GPU checkpointing jobs of a borrowing tenant (1k … 100k running jobs;
//! the rest of the cluster is held by the owner's own jobs), with
//! checkpoints at scattered times. The quota owner then needs an 8-GPU
//! node and a 4×8 block gang back. Times one preemption decision pass (pure,
//! fresh memo each time) and reports p50/p99/max, candidates looked at and
//! victim sets costed.
//!
//! Run: `cargo bench -p gpusched-core --bench victims`.

use gpusched_core::{preemption, quota, CycleConfig, ScanMemo, State};
use gpusched_events::{Assignment, Event};
use gpusched_model::{
    CheckpointPolicy, FlavorQuota, JobId, JobSpec, NodeId, NodeSpec, QueueingMode, TenantSpec,
    Timestamp,
};
use std::time::Instant;

const NODES: u32 = 12_500;

fn spec(tenant: &str, workers: u32, gpw: u32, topology: &str) -> JobSpec {
    JobSpec {
        topology: topology.into(),
        checkpoint: Some(CheckpointPolicy {
            interval_s: 1800,
            duration_s: 600,
        }),
        ..JobSpec::new(tenant, workers, gpw)
    }
}

fn build(borrower_jobs: u32) -> State {
    let mut s = State::new();
    let ok = |s: &mut State, e: Event| s.apply(&e).expect("setup event");
    let mut id = 0;
    for r in 0..50 {
        for b in 0..10 {
            for n in 0..25 {
                ok(
                    &mut s,
                    Event::NodeAdded {
                        node: NodeId(id),
                        spec: NodeSpec::new(
                            format!("r{r}-b{b}-n{n}"),
                            "h100",
                            8,
                            &[&format!("r{r}"), &format!("b{b}")],
                        ),
                        at: Timestamp(0),
                    },
                );
                id += 1;
            }
        }
    }
    // The owner holds the rest of the cluster and is 64 GPUs under its
    // nominal; the borrower runs `borrower_jobs` 1-GPU jobs, 64 over its
    // nominal: the cohort has nothing left to lend.
    let total = NODES as u64 * 8;
    let borrower_nominal = borrower_jobs - 64;
    let owner_gpus = (total - borrower_jobs as u64) / 8 * 8;
    let owner_nominal = total as u32 - borrower_nominal;
    for (name, nominal) in [("owner", owner_nominal), ("borrower", borrower_nominal)] {
        ok(
            &mut s,
            Event::TenantConfigured {
                spec: TenantSpec {
                    cohort: Some("org".into()),
                    queueing: QueueingMode::BestEffortFifo,
                    ..TenantSpec::new(name, vec![FlavorQuota::new("h100", nominal)])
                },
            },
        );
    }
    let mut job = 1u64;
    let mut gpu = 0u64;
    let mut run = |s: &mut State, tenant: &str, g: u32, at_node: u64, t: u64| {
        let id = JobId(job);
        job += 1;
        let sp = spec(tenant, 1, g, "node");
        ok(
            s,
            Event::JobSubmitted {
                job: id,
                spec: sp,
                at: Timestamp(0),
            },
        );
        ok(s, Event::JobAccepted { job: id });
        let borrowed = 0;
        ok(
            s,
            Event::JobAdmitted {
                job: id,
                flavor: "h100".into(),
                borrowed,
                at: Timestamp(0),
            },
        );
        ok(
            s,
            Event::JobBound {
                job: id,
                assignments: vec![Assignment {
                    node: NodeId(at_node as u32),
                    gpus: g,
                }],
                backfill_for: None,
                at: Timestamp(t),
            },
        );
        ok(
            s,
            Event::JobStarted {
                job: id,
                at: Timestamp(t),
            },
        );
        id
    };
    for i in 0..borrower_jobs as u64 {
        let started = (i * 7919) % 3_600_000;
        let id = run(&mut s, "borrower", 1, gpu / 8, started);
        // Scattered complete checkpoints.
        if i % 3 != 0 {
            let progress = (i * 104_729) % (10_000_000 - started).max(1);
            ok(
                &mut s,
                Event::JobCheckpointed {
                    job: id,
                    progress_ms: progress,
                    uri: format!("c{i}"),
                    at: Timestamp(started + progress),
                },
            );
        }
        gpu += 1;
    }
    gpu = gpu.div_ceil(8) * 8;
    let mut held = 0;
    while held < owner_gpus && gpu < total {
        run(&mut s, "owner", 8, gpu / 8, 0);
        gpu += 8;
        held += 8;
    }
    // The owner returns: an 8-GPU node job and a 4×8 block gang.
    for (w, topo) in [(1, "node"), (4, "block")] {
        let id = JobId(job);
        job += 1;
        ok(
            &mut s,
            Event::JobSubmitted {
                job: id,
                spec: spec("owner", w, 8, topo),
                at: Timestamp(10_000_000),
            },
        );
        ok(&mut s, Event::JobAccepted { job: id });
    }
    let cfg = CycleConfig::default();
    let (pending, _) = quota::decide(&s, &mut ScanMemo::default(), &cfg, Timestamp(10_000_000));
    for e in &pending {
        s.apply(e).expect("pending");
    }
    s
}

fn main() {
    let cfg = CycleConfig::default();
    let iters = 200;
    println!("victim search vs running jobs; 12,500 nodes × 8 GPUs, owner reclaims a 1×8 node and a 4×8 block gang");
    println!(
        "{:>9} {:>9} {:>9} {:>9} {:>11} {:>6} {:>8}",
        "running", "p50_us", "p99_us", "max_us", "candidates", "sets", "planned"
    );
    let mut p99s = Vec::new();
    for n in [1_000u32, 10_000, 100_000] {
        let s = build(n);
        let mut times = Vec::with_capacity(iters);
        let mut last = Default::default();
        for _ in 0..iters {
            let t = Instant::now();
            let (ev, st) =
                preemption::decide(&s, &mut ScanMemo::default(), &cfg, Timestamp(10_000_000));
            times.push(t.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(ev);
            last = st;
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let p = |q: f64| times[((q * iters as f64).ceil() as usize).clamp(1, iters) - 1];
        let running = s.phase_counts().get(gpusched_core::Phase::Running);
        println!(
            "{:>9} {:>9.0} {:>9.0} {:>9.0} {:>11} {:>6} {:>8}",
            running,
            p(0.5),
            p(0.99),
            times[iters - 1],
            last.candidates,
            last.max_sets_costed,
            last.planned
        );
        p99s.push(p(0.99));
    }
    if let (Some(a), Some(b)) = (p99s.first(), p99s.last()) {
        println!("p99 ratio 100k/1k borrower jobs: {:.2}", b / a);
    }
}
