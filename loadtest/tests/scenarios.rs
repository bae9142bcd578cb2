//! Every documented load-test scenario in its smallest form, against the
//! real Postgres and NATS on 127.0.0.1, every service its own process:
//! `steady`, `trace`, `reclaim` and `restart` (burst is `smoke.rs`, chaos
//! is `chaos.rs`). Each runs the scenario's own plan with fewer jobs and
//! nodes, so that a validation or default change that breaks a documented
//! command fails here first. Asserts what the run did (jobs bound, the
//! owner's jobs bound, every killed service back), not how fast.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// One scenario at a time: each starts a whole deployment, and four at once
/// on a 2-core machine only test the machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `loadtest ARGS --out DIR` and returns its report.json.
fn run(name: &str, args: &[&str]) -> serde_json::Value {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let out = std::env::temp_dir().join(format!("loadtest-{name}-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args(args)
        .args(["--ceiling-rows", "0", "--timeout-s", "180", "--out"])
        .arg(&out)
        .current_dir(repo_root())
        .status()
        .expect("running loadtest");
    let report = std::fs::read_to_string(out.join("report.json")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out);
    assert!(status.success(), "loadtest {args:?} failed ({status})");
    serde_json::from_str(&report).expect("report.json")
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn every_planned_job_bound(r: &serde_json::Value) {
    assert!(r["jobs"].as_u64().unwrap_or(0) > 0, "no jobs planned: {r}");
    assert_eq!(r["submitted"], r["jobs"], "not every job was accepted");
    assert_eq!(r["submit_failed"], 0);
    assert_eq!(r["unbound"], 0, "jobs never bound");
}

#[test]
fn steady_smallest_form_binds_every_job() {
    let r = run(
        "steady",
        &[
            "steady",
            "--rate",
            "40",
            "--duration-s",
            "3",
            "--nodes",
            "16",
        ],
    );
    assert_eq!(r["scenario"], "steady");
    every_planned_job_bound(&r);
}

#[test]
fn trace_smallest_form_replays_the_shipped_trace() {
    // The default trace (data/traces/itp/cluster04.csv), its first jobs,
    // 100,000x faster: their day and a half of submissions in about 1 s
    // (the default scale spreads any trace over two minutes).
    let r = run(
        "trace",
        &["trace", "--jobs", "60", "--time-scale", "100000"],
    );
    assert_eq!(r["scenario"], "trace");
    every_planned_job_bound(&r);
}

#[test]
fn reclaim_smallest_form_gives_the_owner_its_quota() {
    // The owner returns after 3 s; its reclaim waits until the borrower's
    // jobs pass the preemption stage's 60 s minimum runtime (wall time:
    // the services keep the real clock), so this test takes about a minute.
    let r = run(
        "reclaim",
        &["reclaim", "--nodes", "4", "--reclaim-wait-s", "3"],
    );
    assert_eq!(r["scenario"], "reclaim");
    let reclaim = &r["reclaim"];
    assert!(
        reclaim["owner_jobs"].as_u64().unwrap_or(0) > 0,
        "no owner jobs: {reclaim}"
    );
    assert!(
        reclaim["preempted"].as_u64().unwrap_or(0) > 0,
        "the owner got its GPUs without preempting a borrower: {reclaim}"
    );
}

#[test]
fn restart_default_plan_on_a_small_queue_brings_every_service_back() {
    // The default plan's cluster and quota factor (the documented
    // `loadtest restart` failed on its quota), with a small queue.
    let r = run("restart", &["restart", "--jobs", "400"]);
    assert_eq!(r["scenario"], "restart");
    let restarts = r["restarts"].as_array().expect("restarts");
    assert_eq!(restarts.len(), 5, "every service but the gateway: {r}");
    for s in restarts {
        assert!(
            s["kill_to_ready_ms"].is_number(),
            "{} was not ready again after its SIGKILL: {s}",
            s["service"]
        );
    }
}
