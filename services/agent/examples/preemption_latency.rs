//! Benchmark (a report, not a test): how soon a reclaimed victim's GPUs are
//! free. A quota owner returns to a cluster its borrower fills with
//! cooperative trainers whose checkpoint takes 1 s; for each preemption it
//! reports the time from `PreemptionPlanned` to the victim's `JobPreempted`
//! (its GPUs released: checkpoint complete and its processes exited).
//!
//! `cargo run --release -p gpusched-agent --example preemption_latency [-- N]`
//! (N nodes and victims, default 24).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;
use gpusched_events::Event;
use gpusched_model::{JobId, Timestamp};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(24);
    let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let nominal = u32::try_from(n).expect("node count");
    let c = Cluster::start(vec![tenant("owner", nominal), tenant("b", 0)], &refs).await;
    let knobs = [
        ("TRAINER_STEPS", "100000"),
        ("TRAINER_STEP_S", "0.05"),
        ("TRAINER_EXIT_ON_CHECKPOINT", "1"),
        ("TRAINER_CHECKPOINT_S", "1"),
    ];
    let mut borrowers = Vec::new();
    for _ in 0..n {
        borrowers.push(c.submit(checkpointing(job("b", 1, &knobs))).await);
    }
    c.wait_for("every borrower running", |c| {
        borrowers
            .iter()
            .all(|j| c.phase(*j) == Some(gpusched_core::Phase::Running))
    })
    .await;
    // Every trainer has its handler installed before the owner returns.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let short = [("TRAINER_STEPS", "2"), ("TRAINER_STEP_S", "0.05")];
    for _ in 0..n {
        c.submit(job("owner", 1, &short)).await;
    }
    c.wait_for("every victim preempted", |c| {
        let events = futures::executor::block_on(c.events());
        events
            .iter()
            .filter(|e| matches!(e, Event::JobPreempted { .. }))
            .count()
            >= n
    })
    .await;
    let events = c.events().await;
    let mut planned: BTreeMap<JobId, Timestamp> = BTreeMap::new();
    let mut freed_ms = Vec::new();
    for e in &events {
        match e {
            Event::PreemptionPlanned { victims, at, .. } => {
                for v in victims {
                    planned.entry(v.job).or_insert(*at);
                }
            }
            Event::JobPreempted { job, at, .. } => {
                if let Some(p) = planned.remove(job) {
                    freed_ms.push(at.millis_since(p));
                }
            }
            _ => {}
        }
    }
    freed_ms.sort_unstable();
    let q = |p: f64| freed_ms[((freed_ms.len() - 1) as f64 * p).round() as usize];
    println!(
        "preemptions: {}; PreemptionPlanned → GPUs free (JobPreempted): p50 {} ms, p99 {} ms, max {} ms (checkpoint takes 1,000 ms; goal ≤ 2,000 ms)",
        freed_ms.len(),
        q(0.5),
        q(0.99),
        freed_ms.last().copied().unwrap_or(0)
    );
}
