//! End-to-end simulator runs: determinism, replay, real traces.
#![allow(clippy::unwrap_used)]

use gpusched_core::Phase;
use gpusched_sim::workload::{self, ItpOptions, SyntheticOptions};
use gpusched_sim::{replay, Cluster, Report, Workload};
use std::path::Path;

mod common;
use common::run;

fn synthetic(cluster: &Cluster, jobs: usize, seed: u64) -> Workload {
    workload::synthetic(&SyntheticOptions {
        jobs,
        tenants: cluster.tenants.clone(),
        seed,
        arrival_rate_per_s: 0.5,
        gpus_per_node: cluster.gpus_per_node,
    })
}

#[test]
fn same_inputs_same_events_and_hash() {
    let c = Cluster::demo();
    let a = run(&c, synthetic(&c, 300, 42));
    let b = run(&c, synthetic(&c, 300, 42));
    assert_eq!(
        a.log(),
        b.log(),
        "same seed must give the same event sequence"
    );
    assert_eq!(a.state().state_hash(), b.state().state_hash());
    let d = run(&c, synthetic(&c, 300, 43));
    assert_ne!(a.state().state_hash(), d.state().state_hash());
}

#[test]
fn demo_runs_to_completion_and_replays() {
    let c = Cluster::demo();
    let sim = run(&c, workload::demo(&c.tenants));
    let s = sim.state();
    assert_eq!(s.phase_counts().get(Phase::Succeeded), 400);
    s.check_invariants().unwrap();
    let replayed = replay(sim.log()).unwrap();
    assert_eq!(replayed.state_hash(), s.state_hash());
    let r = Report::build(&sim, "demo".into());
    assert_eq!(r.jobs_finished, 400);
    assert!(r.utilization.mean > 0.0 && r.utilization.mean <= 1.0);
    assert!(r.cycle.max_heads_examined as usize <= 2 * c.cycle.max_heads);
    let json = serde_json::to_value(&r).unwrap();
    for key in [
        "jobs_submitted",
        "jobs_finished",
        "state_hash",
        "events",
        "wall_s",
        "decisions_per_s",
    ] {
        assert!(json.get(key).is_some(), "report lacks {key}");
    }
    assert!(json["utilization"]["while_backlog"].is_number());
    assert!(json["wait_s"]["p99"].is_number());
    assert!(json["tenants"]["vision"]["wait_s"]["p90"].is_number());
    assert!(json["jct_s"]["p50"].is_number());
    assert!(json["cycle"]["max_domains_probed"].is_number());
}

#[test]
fn node_loss_requeues_and_the_job_finishes_later() {
    let c = Cluster::demo();
    let text = "submit_s,tenant,workers,gpus_per_worker,duration_s,event,node\n\
                0,vision,1,8,1000,,\n\
                10,,,,,node_lost,h100-80g-rack-0-block-0-node-0\n";
    let w = workload::parse_native(text.as_bytes(), "inline").unwrap();
    let sim = run(&c, w);
    let job = sim.state().job(gpusched_model::JobId(1)).unwrap();
    assert_eq!(job.phase, Phase::Succeeded);
    assert_eq!(
        job.requeues, 1,
        "the job ran on the first node of block 0 and was requeued"
    );
    assert_eq!(job.lost_gpu_ms, 8 * 10_000);
    assert_eq!(job.ended_at.unwrap().as_secs(), 1010);
}

#[test]
fn itp_trace_runs_end_to_end() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/traces/itp/cluster10.csv");
    assert!(path.exists(), "ITP trace missing at {}", path.display());
    let c = Cluster::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/clusters/1250x8.toml"),
    )
    .unwrap();
    let w = workload::load_itp(
        &path,
        &ItpOptions {
            tenants: c.tenants.clone(),
            gpus_per_node: c.gpus_per_node,
            max_jobs: None,
        },
    )
    .unwrap();
    let n = w.items.len() as u64;
    let sim = run(&c, w);
    let r = Report::build(&sim, "itp".into());
    assert_eq!(r.jobs_submitted, n);
    assert_eq!(r.jobs_finished + r.jobs_rejected, n);
    assert_eq!(replay(sim.log()).unwrap().state_hash(), r.state_hash);
}

#[test]
fn a_failing_job_from_a_csv_cancels_what_waits_on_it_to_succeed() {
    use gpusched_events::Event;
    use gpusched_model::JobId;
    let c = Cluster::demo();
    let text = "submit_s,tenant,workers,gpus_per_worker,duration_s,id,after_ok,after,fails,array,array_max_running\n\
                0,vision,1,8,600,prep,,,yes,,\n\
                0,vision,1,8,3600,train,prep,,,,\n\
                0,vision,1,1,60,cleanup,,train,,,\n\
                0,vision,1,8,300,,,,,sweep,2\n\
                0,vision,1,8,300,,,,,sweep,\n\
                0,vision,1,8,300,,,,,sweep,\n";
    let w = workload::parse_native(text.as_bytes(), "inline").unwrap();
    let sim = run(&c, w);
    let s = sim.state();
    let phase = |n| s.job(JobId(n)).unwrap().phase;
    assert_eq!(phase(1), Phase::Failed);
    assert_eq!(phase(2), Phase::Cancelled);
    assert_eq!(phase(3), Phase::Succeeded);
    assert!(sim.log().contains(&Event::JobDependencyFailed {
        job: JobId(2),
        dependency: JobId(1),
        at: gpusched_model::Timestamp::from_secs(600),
    }));
    // Two of the three tasks at once: the third starts when one ends.
    let started = |n| s.job(JobId(n)).unwrap().first_started_at.unwrap().as_secs();
    assert_eq!((started(4), started(5), started(6)), (0, 0, 300));
    let r = Report::build(&sim, "csv".into());
    let g = r.gates.unwrap();
    assert_eq!((g.dependent_jobs, g.cancelled_by_failed_dependency), (2, 1));
    assert_eq!(g.arrays[0].peak_holding_quota, 2);
    assert_eq!(replay(sim.log()).unwrap().state_hash(), s.state_hash());
}
