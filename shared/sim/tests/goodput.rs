//! Goodput accounting over whole simulations: every allocated GPU-ms is
//! accounted exactly once, the work every finished job needed is exactly
//! its useful part, and what the log says was lost is what the accounting
//! calls lost or spent checkpointing on request.
#![allow(clippy::unwrap_used)]

use common::run;
use gpusched_core::{Phase, VictimOrder, WaitReason};
use gpusched_events::Event;
use gpusched_sim::workload::{self, WorkloadKind};
use gpusched_sim::{scenario, Cluster, Simulator, Workload};

mod common;

/// GPU-ms the workload's jobs need: GPUs × true duration.
fn work_needed(w: &Workload) -> u64 {
    w.items
        .iter()
        .filter_map(|i| match &i.kind {
            WorkloadKind::Submit { spec, duration_s } => {
                Some(u64::from(spec.total_gpus()) * duration_s * 1000)
            }
            _ => None,
        })
        .sum()
}

/// Σ `lost_gpu_ms` of the log's preemptions and requeues.
fn logged_loss(log: &[Event]) -> u64 {
    log.iter()
        .map(|e| match e {
            Event::JobPreempted { lost_gpu_ms, .. } | Event::JobRequeued { lost_gpu_ms, .. } => {
                *lost_gpu_ms
            }
            _ => 0,
        })
        .sum()
}

/// The checks every finished run must pass.
fn check(sim: &Simulator, needed: u64) {
    let g = &sim.measurements.goodput;
    assert_eq!(g.in_flight(), 0, "every job ended");
    for (tenant, acc) in g.totals() {
        assert_eq!(
            acc.parts_gpu_ms(),
            acc.allocated_gpu_ms,
            "{tenant}: {acc:?}"
        );
    }
    let all = g.overall();
    assert_eq!(
        all.useful_gpu_ms, needed,
        "useful = the work the jobs needed"
    );
    assert_eq!(
        all.lost_gpu_ms + all.checkpoint_gpu_ms,
        logged_loss(sim.log()),
        "lost + checkpoint = what the log's preemptions and requeues lost"
    );
    assert_eq!(all.preemptions, sim.measurements.preemptions);
}

#[test]
fn a_reclaim_accounts_every_gpu_hour_under_both_victim_orders() {
    for order in [VictimOrder::Checkpoint, VictimOrder::Kueue] {
        let (mut cluster, w) = scenario::reclaim(1);
        cluster.cycle.preemption.order = order;
        let needed = work_needed(&w);
        let sim = run(&cluster, w);
        let submitted = sim.workload().items.len() as u64;
        assert_eq!(sim.state().phase_counts().get(Phase::Succeeded), submitted);
        check(&sim, needed);
        let all = sim.measurements.goodput.overall();
        assert!(
            all.preemptions > 0,
            "{order:?}: the owner reclaimed nothing"
        );
        assert!(all.restart_gpu_ms > 0 || all.wait_gpu_ms.contains_key(&WaitReason::Requeued));
        assert!(all.goodput().unwrap() < 1.0);
    }
}

#[test]
fn a_lost_node_costs_the_work_since_the_start_and_a_requeued_wait() {
    let c = Cluster::demo();
    let text = "submit_s,tenant,workers,gpus_per_worker,duration_s,event,node\n\
                0,vision,1,8,1000,,\n\
                10,,,,,node_lost,h100-80g-rack-0-block-0-node-0\n";
    let w = workload::parse_native(text.as_bytes(), "inline").unwrap();
    let needed = work_needed(&w);
    let sim = run(&c, w);
    check(&sim, needed);
    let all = sim.measurements.goodput.overall();
    // 8 GPUs × 10 s of work lost with the node (no checkpoint yet).
    assert_eq!(all.lost_gpu_ms, 8 * 10_000);
    assert_eq!(all.useful_gpu_ms, 8 * 1_000_000);
    assert_eq!(all.holds, 2);
}

#[test]
fn a_busy_synthetic_day_accounts_every_gpu_hour() {
    let c = Cluster::demo();
    let w = workload::synthetic(&workload::SyntheticOptions {
        jobs: 400,
        tenants: c.tenants.clone(),
        seed: 11,
        arrival_rate_per_s: 0.5,
        gpus_per_node: c.gpus_per_node,
    });
    let needed = work_needed(&w);
    let sim = run(&c, w);
    let finished = sim.state().phase_counts().get(Phase::Succeeded);
    assert_eq!(finished, 400);
    check(&sim, needed);
    let all = sim.measurements.goodput.overall();
    assert!(all.wait_total_gpu_ms() > 0, "a busy day makes jobs wait");
}
