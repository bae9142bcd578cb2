//! Scenario tests of `explain`: it speaks the user's words. Each builds a
//! state from events through the driver, then asserts the exact phrases a
//! user reads: topology levels as places, times relative to now (never a
//! raw epoch number), declared durations stated as declarations, and what
//! preemption does for a waiting job (victims and when they stop, borrowers
//! protected by the minimum runtime and when they become eligible, or why
//! none can be taken).
#![allow(clippy::unwrap_used)]

mod common;

use common::{job, tenant, Driver, FLAVOR};
use gpusched_core::explain::{self, Context, Relief};
use gpusched_core::Phase;
use gpusched_model::{CheckpointPolicy, JobId, JobSpec, Timestamp};

/// A time like a real service's: milliseconds since the Unix epoch, 2026.
const EPOCH_NOW_S: u64 = 1_796_057_012;

/// A driver whose clock reads like a real service's.
fn epoch_driver() -> Driver {
    let mut d = Driver::default();
    d.now = Timestamp::from_secs(EPOCH_NOW_S);
    d
}

fn explain_now(d: &Driver, id: JobId) -> Vec<String> {
    explain::history_at(&d.log, &d.state, id, &Context::new(d.now, &d.cfg))
}

fn last(lines: &[String]) -> &str {
    lines.last().map(String::as_str).unwrap_or_default()
}

/// Whether `s` holds a run of at least ten digits (a raw epoch number).
fn has_epoch_digits(s: &str) -> bool {
    let mut run = 0;
    for c in s.chars() {
        run = if c.is_ascii_digit() { run + 1 } else { 0 };
        if run >= 10 {
            return true;
        }
    }
    false
}

/// Four 1×8 jobs of `borrower` fill a 4-node block it shares in cohort `c`
/// with `owner` (16 nominal each), started at the driver's now.
fn borrowed_block(d: &mut Driver, preemptible: bool) -> Vec<JobId> {
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 16));
    d.tenant(
        tenant("borrower")
            .cohort("c")
            .best_effort()
            .quota(FLAVOR, 16),
    );
    let b: Vec<JobId> = (0..4)
        .map(|_| {
            d.submit(JobSpec {
                preemptible,
                ..job("borrower", 1, 8, "node")
            })
        })
        .collect();
    d.settle();
    for &j in &b {
        assert_eq!(d.phase(j), Phase::Running);
    }
    b
}

#[test]
fn level_any_reads_as_anywhere_in_the_cluster() {
    // Given a 16-GPU cluster full with a 2×8 gang that may go anywhere,
    let mut d = epoch_driver();
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("a").quota(FLAVOR, 32));
    let first = d.submit(job("a", 2, 8, "any"));
    let waiting = d.submit(job("a", 1, 8, "any"));
    d.settle();
    assert_eq!(d.phase(first), Phase::Running);
    assert_eq!(d.phase(waiting), Phase::Admitted);
    // when both are explained,
    let h = explain_now(&d, first);
    let w = explain_now(&d, waiting);
    // then the level is a place, never the code's word `any`.
    assert!(
        h[0].ends_with("submitted to a: 2×8 GPUs anywhere in the cluster, priority 0, preemptible"),
        "{h:?}"
    );
    assert!(
        h.iter().any(|l| l.ends_with(
            "bound to node-0:8, node-1:8: room for the whole gang across the cluster, fullest nodes first"
        )),
        "{h:?}"
    );
    assert!(
        last(&w).contains(
            "waiting because no room for 1×8 GPUs of h100 anywhere in the cluster; the whole cluster has at most 0 free"
        ),
        "{w:?}"
    );
    for l in h.iter().chain(&w) {
        for code_word in [
            "one any",
            "no any",
            "any of",
            "largest any",
            " any,",
            " any;",
        ] {
            assert!(!l.contains(code_word), "{l}");
        }
    }
}

#[test]
fn a_named_level_reads_as_one_domain_of_it() {
    // Given a block-constrained gang bound and a node-constrained job waiting,
    let mut d = epoch_driver();
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("a").quota(FLAVOR, 32));
    let gang = d.submit(job("a", 2, 8, "block"));
    let single = d.submit(job("a", 1, 8, "node"));
    d.settle();
    assert_eq!(d.phase(single), Phase::Admitted);
    // when explained,
    let g = explain_now(&d, gang);
    let s = explain_now(&d, single);
    // then the block is "in one block", the node "on one node".
    assert!(
        g[0].ends_with("submitted to a: 2×8 GPUs in one block, priority 0, preemptible"),
        "{g:?}"
    );
    assert!(
        g.iter().any(|l| l.ends_with(
            "bound to node-0:8, node-1:8: the fullest block with room for the whole gang (r0/b0)"
        )),
        "{g:?}"
    );
    assert!(s[0].contains("1×8 GPUs on one node"), "{s:?}");
    assert!(
        last(&s).contains(
            "waiting because no room for 1×8 GPUs of h100 on one node; one node has at most 0 free"
        ),
        "{s:?}"
    );
}

#[test]
fn declared_durations_are_declarations_and_log_times_are_offsets() {
    // Given a job declaring a checkpoint every 600 s (30 s each) and a max
    // runtime of 2 h, checkpointed 0.3 s of log time after its start,
    let mut d = epoch_driver();
    d.cluster(1, 1, 1, 8, FLAVOR);
    d.tenant(tenant("a").quota(FLAVOR, 8));
    let j = d.submit(JobSpec {
        checkpoint: Some(CheckpointPolicy {
            interval_s: 600,
            duration_s: 30,
        }),
        max_runtime_s: Some(7_200),
        ..job("a", 1, 8, "node")
    });
    d.settle();
    d.advance_ms(300);
    d.checkpoint(j, 300);
    // when explained,
    let h = explain_now(&d, j);
    // then the spec's durations are stated as declared, and the log's as
    // offsets from submission.
    assert!(
        h[0].ends_with(
            "preemptible; declares a checkpoint every 10 min (each takes 30 s) and a max runtime of 2 h"
        ),
        "{h:?}"
    );
    assert!(
        h.iter().any(|l| l
            .trim_start()
            .starts_with("+0.3 s checkpoint complete: 0.3 s of work saved")),
        "{h:?}"
    );
}

#[test]
fn no_explain_output_prints_a_raw_epoch_number() {
    // Given several scenarios on an epoch clock: a reservation with a
    // guaranteed start, backfill, a reclaim with victims and a requeue,
    let mut lines = Vec::new();
    {
        let mut d = epoch_driver();
        d.cluster(1, 1, 2, 8, FLAVOR);
        d.tenant(tenant("t").best_effort().quota(FLAVOR, 64));
        d.submit(JobSpec {
            max_runtime_s: Some(1000),
            preemptible: false,
            ..job("t", 1, 8, "node")
        });
        d.submit(JobSpec {
            max_runtime_s: Some(600),
            preemptible: false,
            ..job("t", 1, 4, "node")
        });
        d.settle();
        let gang = d.submit(job("t", 2, 8, "block"));
        d.submit(JobSpec {
            max_runtime_s: Some(500),
            ..job("t", 1, 4, "node")
        });
        d.settle();
        assert!(d
            .state
            .reservations()
            .get(&gang)
            .is_some_and(|r| r.start.is_some()));
        let gang_now = explain_now(&d, gang);
        assert!(
            last(&gang_now).contains("a reservation guarantees a start in 16 min 40 s"),
            "{gang_now:?}"
        );
        for &j in &d.jobs {
            lines.extend(explain_now(&d, j));
            lines.extend(explain::history(&d.log, &d.state, j));
        }
    }
    {
        let mut d = epoch_driver();
        borrowed_block(&mut d, true);
        d.advance(100);
        let owner = d.submit(job("owner", 2, 8, "block"));
        d.run_until_quiet();
        assert!(d.state.plan(owner).is_some());
        for &j in &d.jobs {
            lines.extend(explain_now(&d, j));
        }
        d.advance(60);
        d.settle();
        assert_eq!(d.phase(owner), Phase::Running);
        for &j in &d.jobs {
            lines.extend(explain_now(&d, j));
            lines.extend(explain::history(&d.log, &d.state, j));
        }
    }
    // then no line holds ten digits in a row.
    assert!(lines.len() > 20);
    for l in &lines {
        assert!(!has_epoch_digits(l), "raw epoch number in: {l}");
    }
}

#[test]
fn a_reclaim_in_progress_names_its_victims_and_when_they_stop() {
    // Given borrowers that ran past the minimum runtime and an owner back,
    let mut d = epoch_driver();
    borrowed_block(&mut d, true);
    d.advance(100);
    let owner = d.submit(job("owner", 2, 8, "block"));
    d.run_until_quiet();
    let victims: Vec<JobId> = d.state.plan(owner).unwrap().iter().copied().collect();
    assert_eq!(victims.len(), 2);
    // when the owner is explained 10 s into the victims' 30 s grace,
    d.advance(10);
    let h = explain_now(&d, owner);
    // then it hears a reclaim is in progress, its cause, and each victim.
    let now = last(&h);
    assert!(
        now.contains(
            "a preemption for it is in progress (tenant owner reclaims 16 GPUs of its lent h100 quota)"
        ),
        "{now}"
    );
    for v in &victims {
        assert!(
            now.contains(&format!("job {v} stops in 20 s at the latest")),
            "{now}"
        );
    }
    assert!(
        matches!(
            explain::relief(&d.state, owner, &Context::new(d.now, &d.cfg)),
            Some(Relief::InProgress { ref victims }) if victims.len() == 2
        ),
        "{now}"
    );
    // And a victim hears whom it stops for and when.
    let v = explain_now(&d, victims[0]);
    assert!(
        last(&v).contains(&format!(
            "stopping for job {owner}: it stops in 20 s at the latest, or on its next complete checkpoint"
        )),
        "{v:?}"
    );
    assert!(
        v.iter().any(
            |l| l.contains(&format!("chosen as a victim for job {owner}"))
                && l.contains("stops by +2 min 10 s at the latest")
        ),
        "{v:?}"
    );
}

#[test]
fn borrowers_protected_by_the_minimum_runtime_say_when_they_become_eligible() {
    // Given borrowers started 10 s ago (the minimum runtime is 60 s) and an
    // owner back that needs their quota,
    let mut d = epoch_driver();
    let b = borrowed_block(&mut d, true);
    d.advance(10);
    let owner = d.submit(job("owner", 2, 8, "block"));
    d.run_until_quiet();
    assert!(d.state.plan(owner).is_none(), "too young to preempt");
    // when the owner is explained,
    let h = explain_now(&d, owner);
    let now = last(&h);
    // then it hears why nothing is reclaimed yet, and when each borrower
    // becomes eligible, relative to now.
    assert!(
        now.contains("waiting because cohort c has 0 GPUs of h100 left to lend"),
        "{now}"
    );
    assert!(
        now.contains("no reclaim yet: no borrower in cohort c may be preempted now"),
        "{now}"
    );
    let expected = format!(
        "protected by the minimum runtime, borrowers become eligible: job {} in 50 s, job {} in 50 s, job {} in 50 s, job {} in 50 s",
        b[0], b[1], b[2], b[3]
    );
    assert!(now.contains(&expected), "{now}");
    // And once they are old enough, a reclaim is planned and explained.
    d.advance(50);
    d.run_until_quiet();
    assert!(d.state.plan(owner).is_some());
    assert!(
        last(&explain_now(&d, owner)).contains("a preemption for it is in progress"),
        "{h:?}"
    );
}

#[test]
fn no_preemptible_borrower_says_why_none_can_be_taken() {
    // Given borrowers that are not preemptible and an owner back,
    let mut d = epoch_driver();
    let b = borrowed_block(&mut d, false);
    d.advance(100);
    let owner = d.submit(job("owner", 2, 8, "block"));
    d.run_until_quiet();
    assert!(d.state.plan(owner).is_none());
    // when explained, then it hears no borrower can be preempted, and why.
    let h = explain_now(&d, owner);
    let expected = format!(
        "no borrower can be preempted: every borrower's job in h100 (jobs {}, {}, {}, {}) is not preemptible",
        b[0], b[1], b[2], b[3]
    );
    assert!(last(&h).contains(&expected), "{h:?}");
}

#[test]
fn a_job_above_its_nominal_quota_hears_no_reclaim_can_help() {
    // Given an owner whose job would take it above its nominal 16,
    let mut d = epoch_driver();
    borrowed_block(&mut d, true);
    d.advance(100);
    let big = d.submit(job("owner", 3, 8, "block"));
    d.run_until_quiet();
    assert!(d.state.plan(big).is_none());
    // when explained, then it hears why no reclaim helps.
    let h = explain_now(&d, big);
    assert!(
        last(&h).contains(
            "no reclaim can help: its tenant uses 0 of its nominal 16 h100 GPUs and the job needs 24"
        ),
        "{h:?}"
    );
}
