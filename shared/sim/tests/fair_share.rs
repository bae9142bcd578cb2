//! The fair-share section of the report and the usage half-life, on the
//! fairshare scenario: with the half-life the backlogged borrowers' shares
//! of GPU-hours are measurably closer to their weights than without; the
//! section has one row per cohort member, its shares add up, and its
//! GPU-hours agree with the engine's own utilisation count.
#![allow(clippy::unwrap_used)]

use gpusched_events::Event;
use gpusched_sim::report::{FairShareReport, ReportOptions};
use gpusched_sim::scenario::{self, FAIRSHARE_HALF_LIFE_S};
use gpusched_sim::{Cluster, Report, Simulator};

mod common;

/// The fairshare scenario run with this usage half-life (`None`: the
/// scenario's own).
fn run(seed: u64, half_life_s: Option<u64>) -> Simulator {
    let (mut c, w) = scenario::fairshare(seed);
    if let Some(h) = half_life_s {
        scenario::set_usage_half_life(&mut c, h);
    }
    common::run(&c, w)
}

fn section(sim: &Simulator) -> FairShareReport {
    Report::build(sim, String::new())
        .fair_share
        .expect("a fair-share section")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn with_the_half_life_shares_track_weights_better_than_without() {
    for seed in 1..=3 {
        let with = section(&run(seed, None));
        let without = section(&run(seed, Some(0)));
        assert_eq!(with.cohorts[0].usage_half_life_s, FAIRSHARE_HALF_LIFE_S);
        assert_eq!(without.cohorts[0].usage_half_life_s, 0);
        assert!(with.windows_counted >= 4 && without.windows_counted >= 4);
        // Measurably: at least a quarter closer.
        assert!(
            with.deviation < 0.75 * without.deviation,
            "seed {seed}: deviation {} with the half-life, {} without",
            with.deviation,
            without.deviation
        );
    }
}

#[test]
fn the_section_has_a_row_per_member_and_its_shares_add_up() {
    let sim = run(1, None);
    let f = section(&sim);
    assert_eq!(f.window_s, 6 * 3600);
    assert_eq!(f.cohorts.len(), 1);
    let c = &f.cohorts[0];
    assert_eq!(c.cohort, "lab");
    let names: Vec<&str> = c.tenants.iter().map(|t| t.tenant.as_str()).collect();
    assert_eq!(names, ["small", "medium", "large", "pool"]);
    let weights: Vec<f64> = c.tenants.iter().map(|t| t.weight).collect();
    assert_eq!(weights, [1.0, 2.0, 4.0, 1.0]);
    assert!(close(c.tenants.iter().map(|t| t.weight_share).sum(), 1.0));
    assert!(close(c.tenants.iter().map(|t| t.share).sum(), 1.0));
    // The GPU-hours are the engine's own count of GPUs in use, integrated.
    let used_h = sim.measurements.used_gpu_ms / 3_600_000.0;
    assert!(
        (c.gpu_hours - used_h).abs() < 1e-6,
        "{} ≠ {used_h}",
        c.gpu_hours
    );
    let sum: f64 = c.tenants.iter().map(|t| t.gpu_hours).sum();
    assert!((sum - c.gpu_hours).abs() < 1e-6);
    // Each window: shares add up to 1; among the backlogged, both the
    // shares and the entitlements do, and the deviation is half the
    // distance between them.
    let end = sim.measurements.end.as_secs_f64();
    assert_eq!(c.windows.len(), (end / 21600.0).ceil() as usize);
    for w in &c.windows {
        assert_eq!(w.tenants.len(), 4);
        if w.gpu_hours > 0.0 {
            assert!(close(w.tenants.values().map(|t| t.share).sum(), 1.0));
        }
        let Some(d) = w.deviation else { continue };
        let b: Vec<_> = w.tenants.values().filter(|t| t.backlogged).collect();
        assert!(b.len() >= 2);
        let shares: f64 = b.iter().map(|t| t.share_of_backlogged.unwrap()).sum();
        let entitled: f64 = b.iter().map(|t| t.entitled.unwrap()).sum();
        assert!(close(shares, 1.0) && close(entitled, 1.0));
        let dist: f64 = b
            .iter()
            .map(|t| (t.share_of_backlogged.unwrap() - t.entitled.unwrap()).abs())
            .sum();
        assert!(close(d, dist / 2.0));
    }
    // The pool lends and never asks; the others were backlogged.
    let pool = &c.tenants[3];
    assert_eq!((pool.gpu_hours, pool.backlogged_windows), (0.0, 0));
    assert!(c.tenants[..3].iter().all(|t| t.backlogged_windows >= 3));
    // Decayed use is shown under a half-life only.
    assert!(c.tenants.iter().all(|t| t.decayed_use_gpus.is_some()));
    let off = section(&run(1, Some(0)));
    assert!(off.cohorts[0]
        .tenants
        .iter()
        .all(|t| t.decayed_use_gpus.is_none()));
}

#[test]
fn the_window_is_an_option_and_the_table_shows_the_section() {
    let sim = run(1, None);
    let opts = ReportOptions {
        fair_share_window_s: 3 * 3600,
    };
    let r = Report::build_with(&sim, String::new(), &opts);
    let f = r.fair_share.as_ref().unwrap();
    assert_eq!(f.window_s, 3 * 3600);
    let end = sim.measurements.end.as_secs_f64();
    assert_eq!(f.cohorts[0].windows.len(), (end / 10800.0).ceil() as usize);
    let table = r.to_table();
    assert!(table.contains("fair share"), "{table}");
    assert!(table.contains("usage half-life 7200 s"), "{table}");
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["fair_share"]["cohorts"][0]["windows"].is_array());
}

#[test]
fn the_scenario_is_deterministic_and_its_seed_matters() {
    let a = run(1, None);
    let b = run(1, None);
    assert_eq!(a.log(), b.log());
    assert_eq!(section(&a).deviation, section(&b).deviation);
    assert_ne!(a.state().state_hash(), run(2, None).state().state_hash());
    assert_eq!(
        a.state()
            .phase_counts()
            .get(gpusched_core::Phase::Succeeded),
        335
    );
    let replayed = gpusched_sim::replay(a.log()).unwrap();
    assert_eq!(replayed.state_hash(), a.state().state_hash());
}

/// The cohorts' half-lives as the cluster's events set them.
fn half_lives(c: &Cluster) -> Vec<(String, u64)> {
    c.events
        .iter()
        .filter_map(|e| match e {
            Event::CohortConfigured { spec, .. } => {
                Some((spec.name.clone(), spec.usage_half_life_s))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn setting_the_half_life_overrides_the_cluster_or_adds_it() {
    // A cohort the cluster configures gets the new value.
    let (mut c, _) = scenario::fairshare(1);
    assert_eq!(half_lives(&c), [("lab".to_string(), FAIRSHARE_HALF_LIFE_S)]);
    scenario::set_usage_half_life(&mut c, 60);
    assert_eq!(half_lives(&c), [("lab".to_string(), 60)]);
    scenario::set_usage_half_life(&mut c, 0);
    assert_eq!(half_lives(&c), [("lab".to_string(), 0)]);
    // One it does not configure gets one appended after the configuration.
    let (mut r, _) = scenario::reclaim(1);
    let before = r.events.clone();
    scenario::set_usage_half_life(&mut r, 0);
    assert_eq!(r.events, before, "0 where none is set changes nothing");
    scenario::set_usage_half_life(&mut r, 3600);
    assert_eq!(r.events[..before.len()], before[..]);
    assert_eq!(half_lives(&r), [("lab".to_string(), 3600)]);
}
