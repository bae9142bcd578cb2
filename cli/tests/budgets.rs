//! `gpusched simulate --scenario budget`: the report's budgets section, in
//! the table and the `--report` JSON, for both policies, and the run
//! replays to its state hash.
#![allow(clippy::unwrap_used)]

mod exit;
use exit::ok;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_budget_scenario_reports_each_budget_period_by_period() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .current_dir(root())
        .args(["simulate", "--scenario", "budget", "--verify-replay"])
        .arg("--report")
        .arg(&path)
        .output()
        .unwrap();
    let table = ok(&out);
    for line in [
        "budget         capped in h100-80g: 160 GPU-h a day, when spent: wait;",
        "budget         flex in h100-80g: 160 GPU-h a day, when spent: borrow-only;",
        "replay_hash_matches: true",
    ] {
        assert!(table.contains(line), "{line:?} missing:\n{table}");
    }
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let budgets = r["budgets"].as_array().unwrap();
    assert_eq!(budgets.len(), 2);
    let (capped, flex) = (&budgets[0], &budgets[1]);
    assert_eq!(
        (&capped["tenant"], &capped["when_spent"], &capped["period"]),
        (&"capped".into(), &"wait".into(), &"day".into())
    );
    assert_eq!(flex["when_spent"], "borrow-only");
    for b in budgets {
        // Spent on each of the three days its tenant submits.
        assert!(b["times_spent"].as_u64().unwrap() >= 3, "{b}");
        let periods = b["periods"].as_array().unwrap();
        let used: f64 = periods
            .iter()
            .map(|p| p["used_gpu_hours"].as_f64().unwrap())
            .sum();
        assert!((used - b["used_gpu_hours"].as_f64().unwrap()).abs() < 1e-6);
        // Renewed at 00:00 each time it began a day spent.
        for p in periods {
            if let Some(s) = p["renewed_after_s"].as_f64() {
                assert_eq!(s, 0.0, "{p}");
            }
        }
    }
    assert!(capped["jobs_pending_budget_spent"].as_u64().unwrap() > 0);
    assert_eq!(capped["jobs_admitted_while_spent"], 0);
    assert!(flex["jobs_admitted_while_spent"].as_u64().unwrap() > 0);
    assert!(flex["jobs_preempted_while_spent"].as_u64().unwrap() > 0);
    assert_eq!(r["replay_hash_matches"], true);
}
