//! Dependencies between jobs (`after_ok`, `after`) and the limit on an
//! array's tasks at once (`%N`) (docs/architecture.md, "Dependencies and
//! array limits"). Each test sets a cluster up through events, plays the
//! node agent by hand and asserts one rule that would fail if it broke.
#![allow(clippy::unwrap_used)]

mod common;

use common::{job, tenant, Driver, FLAVOR};
use gpusched_core::explain::{history, pending_reason};
use gpusched_core::{ApplyError, Phase};
use gpusched_events::{Event, Outcome, PendingReason, RejectReason};
use gpusched_model::{ArrayTask, JobId, JobSpec};

/// 4 nodes × 8 GPUs; tenants `a` and `b` with 32 nominal each.
fn cluster() -> Driver {
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("a").quota(FLAVOR, 32));
    d.tenant(tenant("b").quota(FLAVOR, 32));
    d
}

fn after_ok(deps: &[JobId]) -> JobSpec {
    JobSpec {
        after_ok: deps.to_vec(),
        ..job("a", 1, 8, "node")
    }
}

fn after(deps: &[JobId]) -> JobSpec {
    JobSpec {
        after: deps.to_vec(),
        ..job("a", 1, 8, "node")
    }
}

fn end(d: &mut Driver, id: JobId, outcome: Outcome) {
    if d.phase(id) == Phase::Bound {
        d.start_bound();
    }
    let at = d.now;
    d.apply(Event::JobFinished {
        job: id,
        outcome,
        at,
        exits: Vec::new(),
        reason: None,
    });
}

fn rejection(events: &[Event], id: JobId) -> Option<RejectReason> {
    events.iter().find_map(|e| match e {
        Event::JobRejected { job, reason } if *job == id => Some(reason.clone()),
        _ => None,
    })
}

fn assert_replays(d: &Driver) {
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn a_job_after_ok_waits_out_of_the_queue_until_its_dependency_succeeds() {
    // Given job 1 running and job 2 after_ok 1, with room for both
    let mut d = cluster();
    let first = d.submit(job("a", 1, 8, "node"));
    d.settle();
    let second = d.submit(after_ok(&[first]));
    d.settle();
    // Then the second waits, outside its tenant's queue, and says why
    assert_eq!(d.phase(first), Phase::Running);
    assert_eq!(d.phase(second), Phase::Queued);
    assert_eq!(
        gpusched_core::explain::queue_position(&d.state, second),
        None
    );
    assert_eq!(
        pending_reason(&d.state, second),
        Some(PendingReason::WaitingForJobs {
            after_ok: vec![first],
            after: vec![],
        })
    );
    let now = history(&d.log, &d.state, second);
    assert!(
        now.last()
            .unwrap()
            .contains(&format!("waits for job {first} to succeed")),
        "{now:?}"
    );
    let accepted = format!("accepted; it joins its tenant's queue once it is through waiting for job {first} (after_ok)");
    assert!(now.iter().any(|l| l.contains(&accepted)), "{now:?}");
    // and an admission written anyway is refused.
    let refused = d.try_apply(Event::JobAdmitted {
        job: second,
        flavor: FLAVOR.into(),
        borrowed: 0,
        at: d.now,
    });
    assert!(
        matches!(refused, Err(ApplyError::IllegalTransition { .. })),
        "{refused:?}"
    );
    // When the first succeeds, the second runs.
    end(&mut d, first, Outcome::Succeeded);
    d.settle();
    assert_eq!(d.phase(second), Phase::Running);
    assert_replays(&d);
}

#[test]
fn a_failed_dependency_cancels_its_after_ok_dependents_down_the_chain() {
    // Given 1 running; 2 after_ok 1; 3 after_ok 2; 4 after 2
    let mut d = cluster();
    let first = d.submit(job("a", 1, 8, "node"));
    d.settle();
    let second = d.submit(after_ok(&[first]));
    let third = d.submit(after_ok(&[second]));
    let fourth = d.submit(after(&[second]));
    d.settle();
    // When the first fails
    end(&mut d, first, Outcome::Failed);
    let ev = d.settle();
    // Then the second and third are cancelled, each naming its dependency
    for (job, dep) in [(second, first), (third, second)] {
        assert_eq!(d.phase(job), Phase::Cancelled, "job {job}");
        assert!(
            ev.iter().any(|e| matches!(e,
                Event::JobDependencyFailed { job: j, dependency, .. }
                    if *j == job && *dependency == dep)),
            "job {job}: {ev:?}"
        );
    }
    let lines = history(&d.log, &d.state, second);
    assert!(
        lines.iter().any(|l| l.contains(&format!(
            "job {first}, which it runs after (after_ok), ended failed"
        ))),
        "{lines:?}"
    );
    // and the fourth, which needed the second only to end, runs.
    assert_eq!(d.phase(fourth), Phase::Running);
    assert_replays(&d);
}

#[test]
fn after_runs_a_job_once_its_dependency_ends_however() {
    let mut d = cluster();
    let first = d.submit(job("a", 1, 8, "node"));
    d.settle();
    let second = d.submit(after(&[first]));
    d.settle();
    assert_eq!(d.phase(second), Phase::Queued);
    end(&mut d, first, Outcome::Failed);
    d.settle();
    assert_eq!(d.phase(second), Phase::Running);
}

#[test]
fn a_cancelled_dependent_leaves_nothing_waiting_behind() {
    // Given 2 after_ok 1 (running), then 2 is cancelled by its user
    let mut d = cluster();
    let first = d.submit(job("a", 1, 8, "node"));
    d.settle();
    let second = d.submit(after_ok(&[first]));
    d.settle();
    let at = d.now;
    d.apply(Event::JobCancelled { job: second, at });
    // When the first fails, nothing is cancelled twice
    end(&mut d, first, Outcome::Failed);
    let ev = d.settle();
    assert!(
        !ev.iter()
            .any(|e| matches!(e, Event::JobDependencyFailed { .. })),
        "{ev:?}"
    );
    assert_eq!(d.phase(second), Phase::Cancelled);
    d.state.check_invariants().unwrap();
}

#[test]
fn unknown_foreign_later_and_already_failed_dependencies_are_refused_naming_the_field() {
    let mut d = cluster();
    let theirs = d.submit(job("b", 1, 8, "node"));
    let failed = d.submit(job("a", 1, 8, "node"));
    d.settle();
    end(&mut d, failed, Outcome::Failed);
    let unknown = d.submit(after_ok(&[JobId(999)]));
    let foreign = d.submit(after(&[theirs]));
    let too_late = d.submit(after_ok(&[failed]));
    let ev = d.settle();
    let cases = [
        (unknown, "after_ok", "job 999 is not a job of tenant a"),
        (foreign, "after", "is not a job of tenant a"),
        (too_late, "after_ok", "already ended failed"),
    ];
    for (id, want_field, want_rule) in cases {
        match rejection(&ev, id) {
            Some(RejectReason::InvalidField { field, rule }) => {
                assert_eq!(field, want_field, "job {id}");
                assert!(rule.contains(want_rule), "job {id}: {rule}");
            }
            other => panic!("job {id}: {other:?}"),
        }
    }
    // A dependency on a later job (a cycle in the making) is refused by
    // the admission stage and, written anyway, by apply.
    let earlier = d.submit(JobSpec {
        after_ok: vec![JobId(d.jobs.len() as u64 + 2)],
        ..job("a", 1, 8, "node")
    });
    let later = d.submit(after_ok(&[earlier]));
    let forged = d.try_apply(Event::JobAccepted { job: earlier });
    assert!(
        matches!(forged, Err(ApplyError::BadDependency { job, .. }) if job == earlier),
        "{forged:?}"
    );
    let ev = d.settle();
    match rejection(&ev, earlier) {
        Some(RejectReason::InvalidField { field, rule }) => {
            assert_eq!(field, "after_ok");
            assert!(rule.contains("submitted after this job"), "{rule}");
        }
        other => panic!("{other:?}"),
    }
    // and its dependent, accepted while it was still submitted, is
    // cancelled once it is rejected.
    assert_eq!(d.phase(later), Phase::Cancelled);
    assert_eq!(d.job(later).failed_dependency, Some(earlier));
}

fn task(array: u64, index: u32, limit: u32) -> JobSpec {
    JobSpec {
        array: Some(ArrayTask {
            array,
            index,
            max_running: Some(limit),
        }),
        ..job("a", 1, 8, "node")
    }
}

#[test]
fn an_array_with_a_limit_runs_at_most_that_many_tasks_at_once() {
    // Given room for four tasks and an array of six limited to two
    let mut d = cluster();
    let tasks: Vec<JobId> = (0..6).map(|i| d.submit(task(1, i, 2))).collect();
    d.settle();
    let running = |d: &Driver| {
        tasks
            .iter()
            .filter(|t| d.phase(**t) == Phase::Running)
            .count()
    };
    // Then two run and the rest wait for a slot, saying so
    assert_eq!(running(&d), 2);
    assert_eq!(
        pending_reason(&d.state, tasks[5]),
        Some(PendingReason::ArrayLimit { array: 1, limit: 2 })
    );
    // and a cancelled waiting task frees no slot.
    let at = d.now;
    d.apply(Event::JobCancelled { job: tasks[5], at });
    d.settle();
    assert_eq!(running(&d), 2);
    // Each task that ends lets the next one in, in order, never more than two.
    let mut done = 0;
    while let Some(t) = tasks.iter().find(|t| d.phase(**t) == Phase::Running) {
        end(&mut d, *t, Outcome::Succeeded);
        done += 1;
        d.settle();
        assert!(running(&d) <= 2);
    }
    assert_eq!(done, 5);
    assert!(
        d.state.array_slots(1).is_none(),
        "the array's slots are freed"
    );
    assert_replays(&d);
}

#[test]
fn a_requeued_task_keeps_its_slot() {
    // Given an array of three limited to one, its first task running
    let mut d = cluster();
    let tasks: Vec<JobId> = (0..3).map(|i| d.submit(task(7, i, 1))).collect();
    d.settle();
    assert_eq!(d.phase(tasks[0]), Phase::Running);
    // When its node is lost, it goes back to the queue
    let node = d.job(tasks[0]).assignments[0].node;
    let at = d.now;
    d.apply(Event::NodeLost { node, at });
    d.cycle();
    // and it, not another task, runs next.
    d.settle();
    assert_eq!(d.phase(tasks[0]), Phase::Running);
    assert_eq!(d.phase(tasks[1]), Phase::Queued);
    assert_eq!(d.state.array_slots(7).map(|s| s.taken), Some(1));
}

#[test]
fn a_job_cancelled_for_its_dependency_stops_counting_its_wait() {
    // Given 2 after_ok 1, and 1 fails after a while
    let mut d = cluster();
    let first = d.submit(job("a", 1, 8, "node"));
    d.settle();
    let second = d.submit(after_ok(&[first]));
    d.settle();
    d.advance(600);
    end(&mut d, first, Outcome::Failed);
    d.settle();
    assert_eq!(d.phase(second), Phase::Cancelled);
    // Then its GPU-hour account is closed: an hour later it is the same.
    let account = |at| gpusched_core::goodput::job_account(second, d.log.iter(), Some(at));
    let now = d.now;
    assert_eq!(account(now), account(now.plus_secs(3600)));
}
