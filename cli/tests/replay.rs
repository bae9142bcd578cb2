//! `gpusched replay` against a real Postgres event log: the state it
//! rebuilds has the live simulation's hash, whole and up to a sequence.
#![allow(clippy::unwrap_used)]

use gpusched_sim::{replay, Cluster, SimOptions, Simulator};
use gpusched_store::testing::TestDb;
use gpusched_store::NewEvent;
use std::process::Command;
use std::time::Duration;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_postgres_matches_the_live_hash() {
    let cluster = Cluster::demo();
    let workload = gpusched_sim::workload::demo(&cluster.tenants);
    let opts = SimOptions {
        cycle: cluster.cycle,
        until: None,
        record_events: true,
    };
    let mut sim = Simulator::new(&cluster, workload, opts).unwrap();
    sim.run(&mut |_| {}).unwrap();
    let live = sim.state().state_hash();
    let log = sim.log().to_vec();

    let db = TestDb::new().await;
    let lease = db
        .store
        .acquire_lease("simulator", "0", "test", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    for batch in log.chunks(1000) {
        let batch: Vec<NewEvent> = batch.iter().cloned().map(NewEvent::new).collect();
        db.store.append(&batch, &lease.fence()).await.unwrap();
    }

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
