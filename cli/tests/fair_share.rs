//! `gpusched simulate --usage-half-life` and `--scenario fairshare`: the
//! flag overrides the cluster file's half-life (and the scenario's), the
//! report's fair-share section says which one the run had, the scenario
//! tracks the weights better with its half-life than without, and bad
//! values are refused naming the flag.
#![allow(clippy::unwrap_used)]

mod exit;
use exit::{ok, refused};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn simulate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .current_dir(root())
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

/// The `--report` JSON of a run with these arguments.
fn report(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--report", path.to_str().unwrap()]);
    let table = ok(&simulate(&all));
    assert!(table.contains("fair share"), "{table}");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A short run of the ITP cluster 4 trace on the weighted cluster.
fn itp(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "--cluster",
        "docs/clusters/itp-512-weighted.toml",
        "--workload",
        "data/traces/itp/cluster04.csv",
        "--workload-format",
        "itp",
        "--max-jobs",
        "1500",
    ];
    args.extend(extra);
    report(&args)
}

#[test]
fn the_flag_overrides_the_cluster_files_half_life() {
    let cohort = |r: &serde_json::Value| r["fair_share"]["cohorts"][0].clone();
    let file = cohort(&itp(&[]));
    assert_eq!(file["cohort"], "org");
    assert_eq!(file["usage_half_life_s"], 21600);
    let tenants = file["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 4);
    assert!(tenants.iter().all(|t| t["decayed_use_gpus"].is_number()));
    let weights: Vec<f64> = tenants
        .iter()
        .map(|t| t["weight"].as_f64().unwrap())
        .collect();
    assert_eq!(weights, [1.0, 1.0, 2.0, 4.0]);

    let hour = cohort(&itp(&["--usage-half-life", "3600"]));
    assert_eq!(hour["usage_half_life_s"], 3600);
    let off = cohort(&itp(&["--usage-half-life", "0"]));
    assert_eq!(off["usage_half_life_s"], 0);
    let off_tenants = off["tenants"].as_array().unwrap();
    assert!(off_tenants
        .iter()
        .all(|t| t.get("decayed_use_gpus").is_none()));
}

#[test]
fn the_fairshare_scenario_tracks_weights_better_with_its_half_life() {
    let deviation = |r: &serde_json::Value| r["fair_share"]["deviation"].as_f64().unwrap();
    let with = report(&["--scenario", "fairshare"]);
    let without = report(&["--scenario", "fairshare", "--usage-half-life", "0"]);
    assert_eq!(with["fair_share"]["cohorts"][0]["usage_half_life_s"], 7200);
    assert_eq!(without["fair_share"]["cohorts"][0]["usage_half_life_s"], 0);
    assert!(
        deviation(&with) < 0.75 * deviation(&without),
        "{} with, {} without",
        deviation(&with),
        deviation(&without)
    );
    assert_ne!(with["state_hash"], without["state_hash"]);
    let windowed = report(&["--scenario", "fairshare", "--fair-share-window", "3600"]);
    assert_eq!(windowed["fair_share"]["window_s"], 3600);
    assert_eq!(windowed["state_hash"], with["state_hash"]);
}

#[test]
fn bad_values_are_refused_naming_the_flag() {
    let err = refused(&simulate(&[
        "--scenario",
        "fairshare",
        "--fair-share-window",
        "0",
    ]));
    assert!(err.contains("--fair-share-window"), "{err}");
    let err = refused(&simulate(&[
        "--scenario",
        "fairshare",
        "--usage-half-life",
        "316224001",
    ]));
    assert!(err.contains("--usage-half-life"), "{err}");
}
