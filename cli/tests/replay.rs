//! `gpusched replay` against a real Postgres event log: the state it
//! rebuilds has the live simulation's hash, whole and up to a sequence.
#![allow(clippy::unwrap_used)]

mod simlog;

use gpusched_sim::{replay, Cluster};
use gpusched_store::testing::TestDb;
use std::process::Command;

fn state_hash_line(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "replay failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("state_hash: "))
        .unwrap_or_else(|| panic!("no state_hash line in: {text}"))
        .to_string()
}

/// The demo simulation run, and a database holding its log.
async fn logged_demo() -> (String, Vec<gpusched_events::Event>, TestDb) {
    let cluster = Cluster::demo();
    let workload = gpusched_sim::workload::demo(&cluster.tenants);
    let (live, log) = simlog::simulate(&cluster, workload);
    let db = simlog::logged(&log).await;
    (live, log, db)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_postgres_matches_the_live_hash() {
    let (live, log, db) = logged_demo().await;
    let bin = env!("CARGO_BIN_EXE_gpusched");
    let out = Command::new(bin)
        .args(["replay", "--database-url", &db.url])
        .output()
        .unwrap();
    assert_eq!(state_hash_line(&out), live);

    // Up to a sequence: the same state as folding that prefix in process.
    let n = log.len() / 2;
    let out = Command::new(bin)
        .args([
            "replay",
            "--database-url",
            &db.url,
            "--until-seq",
            &n.to_string(),
        ])
        .output()
        .unwrap();
    let prefix = replay(&log[..n]).unwrap().state_hash();
    assert_eq!(state_hash_line(&out), prefix);
    assert_ne!(prefix, live);
}

#[test]
fn replay_names_a_bad_time() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .args(["replay", "--until-time", "yesterday"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--until-time"), "{err}");
}

/// Runs `gpusched replay` with `args` on the database at `url`.
fn replay_cli(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .args(["replay", "--database-url", url])
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_a_snapshot_is_the_replay_from_zero() {
    let (live, log, db) = logged_demo().await;
    let (early, late) = (log.len() / 3, 2 * log.len() / 3);
    for at in [early, late] {
        let state = replay(&log[..at]).unwrap();
        let body = gpusched_core::snapshot::encode(&state, at as u64);
        db.store.save_snapshot(&body, "test").await.unwrap();
    }

    let out = replay_cli(&db.url, &["--from-snapshot"]);
    assert_eq!(state_hash_line(&out), live);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("from snapshot at {late} ")),
        "{text}"
    );

    // Up to a sequence before the newest snapshot: the older one is used.
    let half = log.len() / 2;
    let out = replay_cli(
        &db.url,
        &["--from-snapshot", "--until-seq", &half.to_string()],
    );
    assert_eq!(
        state_hash_line(&out),
        replay(&log[..half]).unwrap().state_hash()
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("from snapshot at {early} ")));

    let out = replay_cli(&db.url, &["--verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("verified: both replays give the same state")
    );

    // A snapshot that passes its own checks but lies about its sequence
    // (it lacks the 20 events before it) is caught by --verify.
    let liar = gpusched_core::snapshot::encode(&replay(&log[..late]).unwrap(), late as u64 + 20);
    db.store.save_snapshot(&liar, "test").await.unwrap();
    let out = replay_cli(&db.url, &["--verify"]);
    assert!(!out.status.success(), "a wrong snapshot must fail --verify");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("differs from the replay from the first event"),
        "{err}"
    );
}
