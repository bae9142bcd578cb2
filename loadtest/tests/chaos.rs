//! `loadtest chaos --short`: the whole deployment on a private Postgres
//! and nats-server while a service is SIGKILLed, Postgres restarted,
//! nats-server SIGKILLed and restarted on its store, the gateway killed,
//! bad messages published on every event subject and the quota leader
//! paused past its lease. Asserts what was counted (nothing lost,
//! duplicated, wrongly refused or unanswered; every stage deciding again
//! after each fault, within a generous 20 s) and that nothing is left
//! behind, not how fast it ran (`loadtest chaos` itself holds the 5 s and
//! 1 s goals).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn short_chaos_run_loses_duplicates_and_refuses_nothing_and_leaves_nothing_behind() {
    let out = std::env::temp_dir().join(format!("loadtest-chaos-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        // The goals' times, generous: the machine is shared and noisy.
        // The counts are what this test holds the services to.
        .args([
            "chaos",
            "--short",
            "--seed",
            "1",
            "--recovery-goal-s",
            "20",
            "--stall-goal-s",
            "5",
            "--out",
        ])
        .arg(&out)
        .status()
        .expect("running loadtest chaos --short");
    let report = std::fs::read_to_string(out.join("report.json")).unwrap_or_default();
    let markdown = std::fs::read_to_string(out.join("report.md")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        !report.is_empty(),
        "no report: loadtest chaos failed before the checks ({status})"
    );
    let r: serde_json::Value = serde_json::from_str(&report).expect("report.json");

    // Nothing left behind: the private servers' directory and ports.
    let dir = r["infra_dir"].as_str().expect("infra_dir");
    assert!(!std::path::Path::new(dir).exists(), "{dir} left behind");
    for port in ["postgres_port", "nats_port"] {
        let p = r[port].as_u64().expect("port") as u16;
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", p)).is_err(),
            "something still listens on the private {port} {p}"
        );
    }

    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 7, "six faults and the probe");
    for row in rows {
        let label = row["label"].as_str().unwrap_or("?");
        for col in ["lost", "duplicated", "wrongly_refused", "gave_up"] {
            assert_eq!(row[col], 0, "{label}: {col}\n{markdown}");
        }
        assert_eq!(
            row["ended"], row["accepted"],
            "{label}: not every job ended\n{markdown}"
        );
        assert!(
            row["accepted"].as_u64().unwrap_or(0) > 0,
            "{label}: no job accepted\n{markdown}"
        );
    }
    assert!(
        status.success(),
        "loadtest chaos --short failed ({status})\n{markdown}"
    );
    assert_eq!(r["passed"], true);
}
