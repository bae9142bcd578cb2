//! Incident review from a real Postgres log with no service running: the
//! reclaim scenario's log (a borrower fills the cluster, the quota owner
//! returns and preempts) is appended, then `replay --at --show`,
//! `timeline`, `diff` and `why-preempted` are run on it and checked against
//! the same log folded in process.
#![allow(clippy::unwrap_used)]

mod exit;
use exit::{ok, refused};
use gpusched_core::State;
use gpusched_events::{Event, PreemptionCause};
mod simlog;

use gpusched_sim::{replay, scenario};
use gpusched_store::testing::TestDb;
use std::process::{Command, Output};

/// The reclaim scenario's log, in a database of its own.
async fn logged_reclaim() -> (Vec<Event>, TestDb) {
    let (cluster, workload) = scenario::reclaim(1);
    let (_, log) = simlog::simulate(&cluster, workload);
    let db = simlog::logged(&log).await;
    (log, db)
}

fn cli(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .unwrap()
}

/// The first reclaim plan: (its index in the log, beneficiary, first victim).
fn first_reclaim(log: &[Event]) -> (usize, u64, u64) {
    log.iter()
        .enumerate()
        .find_map(|(i, e)| match e {
            Event::PreemptionPlanned {
                beneficiary,
                cause: PreemptionCause::Reclaim { .. },
                victims,
                ..
            } => Some((i, beneficiary.0, victims[0].job.0)),
            _ => None,
        })
        .unwrap()
}

/// The queue rows of a state, as (tenant, flavor, used).
fn used_rows(s: &State) -> Vec<(String, String, u64)> {
    let v = serde_json::to_value(gpusched_gateway::queues_view(s, s.clock())).unwrap();
    v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["tenant"].as_str().unwrap().to_string(),
                q["flavor"].as_str().unwrap().to_string(),
                q["used"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_commands_read_the_log_alone() {
    let (log, db) = logged_reclaim().await;
    let url = db.url.clone();
    let (plan_i, beneficiary, victim) = first_reclaim(&log);
    let plan_seq = plan_i as i64 + 1;

    // The state at an instant: the queues just before the plan, as the
    // prefix folded in process has them.
    let before = replay(&log[..plan_i]).unwrap();
    let text = ok(&cli(
        &url,
        &["replay", "--at", &plan_i.to_string(), "--show", "queues"],
    ));
    assert!(
        text.contains(&format!("the log at seq {plan_i} ")),
        "{text}"
    );
    for (tenant, flavor, used) in used_rows(&before) {
        let row = text
            .lines()
            .find(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.first() == Some(&tenant.as_str()) && w.get(3) == Some(&flavor.as_str())
            })
            .unwrap_or_else(|| panic!("no row for {tenant}/{flavor} in:\n{text}"));
        // TENANT QUEUE COHORT FLAVOR NOMINAL BORROW_LIMIT USED ...
        assert_eq!(
            row.split_whitespace().nth(6),
            Some(used.to_string().as_str()),
            "{row}"
        );
    }
    // By time: the plan's own time holds the plan (and what came at that
    // same instant), not what came later.
    let at = match &log[plan_i] {
        Event::PreemptionPlanned { at, .. } => *at,
        _ => unreachable!(),
    };
    let iso = chrono::DateTime::from_timestamp_millis(at.0 as i64)
        .unwrap()
        .to_rfc3339();
    let text = ok(&cli(
        &url,
        &["replay", "--at", &iso, "--show", "jobs", "--limit", "5"],
    ));
    let seq: usize = text
        .split_whitespace()
        .nth(4)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(seq > plan_i, "{text}");
    assert!(text.contains("--limit shows more"), "{text}");
    let text = ok(&cli(&url, &["replay", "--show", "nodes"]));
    assert!(text.contains("TOTAL"), "{text}");

    // The victim's timeline: each of its events and the plan naming it.
    let text = ok(&cli(&url, &["timeline", "--job", &victim.to_string()]));
    let expected = log
        .iter()
        .filter(|e| {
            e.job().map(|j| j.0) == Some(victim)
                || matches!(e, Event::PreemptionPlanned { victims, .. }
                    if victims.iter().any(|v| v.job.0 == victim))
        })
        .count();
    assert!(
        text.contains(&format!("{expected} events about job {victim}")),
        "{expected}: {text}"
    );
    assert!(
        text.contains(&format!("preemption planned for job {beneficiary}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("job {victim} preempted on ")),
        "{text}"
    );
    // A node's timeline names the node, and a bound range cuts it.
    let text = ok(&cli(
        &url,
        &[
            "timeline",
            "--tenant",
            "research",
            "--to",
            &plan_seq.to_string(),
        ],
    ));
    assert!(text.contains(&format!("{:>9}  ", plan_seq)), "{text}");
    assert!(!text.contains(&format!("{:>9}  ", plan_seq + 1)), "{text}");

    // What changed across the reclaim: the preemptions it counted are
    // those the log holds in the range.
    let end = log.len();
    let text = ok(&cli(
        &url,
        &[
            "diff",
            "--from",
            &plan_i.to_string(),
            "--to",
            &end.to_string(),
        ],
    ));
    let preempted = log[plan_i..]
        .iter()
        .filter(|e| matches!(e, Event::JobPreempted { .. }))
        .count() as u64;
    let counted: u64 = text
        .lines()
        .filter(|l| l.starts_with("preempted "))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum();
    assert_eq!(counted, preempted, "{text}");
    assert!(text.contains("reclaim by research"), "{text}");
    assert!(text.contains("work lost: "), "{text}");

    // Why it was preempted: the search run again chooses what the plan logged.
    let text = ok(&cli(&url, &["why-preempted", &victim.to_string()]));
    assert!(
        text.contains("was chosen as a victim at ")
            && text.contains(&format!("for job {beneficiary}")),
        "{text}"
    );
    assert!(text.contains(" * "), "no chosen set: {text}");
    assert!(!text.contains("note: run again"), "{text}");
    assert!(text.contains("who got its GPUs:"), "{text}");
    assert!(text.contains("it stopped: "), "{text}");

    // Bad input names the flag; nothing is written.
    let head = db.store.max_seq().await.unwrap();
    let err = refused(&cli(&url, &["timeline", "--node", "no-such-node"]));
    assert!(err.contains("--node: no node no-such-node"), "{err}");
    let err = refused(&cli(
        &url,
        &["replay", "--at", "yesterday", "--show", "jobs"],
    ));
    assert!(err.contains("--at"), "{err}");
    let err = refused(&cli(&url, &["why-preempted", &beneficiary.to_string()]));
    assert!(err.contains("no preemption plan"), "{err}");
    let err = refused(&cli(
        &url,
        &["replay", "--show", "jobs", "--state", "sleeping"],
    ));
    assert!(err.contains("--state sleeping"), "{err}");
    assert_eq!(db.store.max_seq().await.unwrap(), head);
}
