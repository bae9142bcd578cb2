//! An admin's queue and node operations (docs/architecture.md, "Queue and
//! node operations"): hold, release, drain and stop a tenant's queue;
//! evict a node's jobs for maintenance. Each test sets a cluster up through
//! events, plays the node agent by hand and asserts one rule that would
//! fail if the rule broke.
#![allow(clippy::unwrap_used)]

mod common;

use common::{job, tenant, Driver, FLAVOR};
use gpusched_core::{ApplyError, CycleConfig, NodeStatus, Phase};
use gpusched_events::{Event, EvictionCause, QueueState, RejectReason, RequeueReason, Victim};
use gpusched_model::{CheckpointPolicy, JobId, JobSpec, NodeId};

/// Every EvictionPlanned in a batch: (cause, victims).
fn evictions(events: &[Event]) -> Vec<(EvictionCause, Vec<Victim>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::EvictionPlanned { cause, victims, .. } => Some((cause.clone(), victims.clone())),
            _ => None,
        })
        .collect()
}

fn victims_of(events: &[Event]) -> Vec<JobId> {
    let mut v: Vec<JobId> = evictions(events)
        .into_iter()
        .flat_map(|(_, vs)| vs.into_iter().map(|v| v.job))
        .collect();
    v.sort_unstable();
    v
}

/// A 1×8 job checkpointing every 10 min, each in 60 s.
fn ckpt_job(tenant: &str) -> JobSpec {
    JobSpec {
        checkpoint: Some(CheckpointPolicy {
            interval_s: 600,
            duration_s: 60,
        }),
        ..job(tenant, 1, 8, "node")
    }
}

/// 4 nodes × 8 GPUs in one block; `a` and `b` with 16 nominal each in one
/// cohort.
fn two_tenants() -> Driver {
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("a").cohort("c").best_effort().quota(FLAVOR, 16));
    d.tenant(tenant("b").cohort("c").best_effort().quota(FLAVOR, 16));
    d
}

#[test]
fn a_held_queue_takes_submissions_but_admits_nothing_until_released() {
    // Given a held queue
    let mut d = two_tenants();
    d.set_queue("a", QueueState::Held);
    // When a job is submitted to it and cycles run
    let j = d.submit(job("a", 1, 8, "node"));
    let ev = d.settle();
    // Then it is accepted into the queue and no further
    assert!(ev
        .iter()
        .any(|e| matches!(e, Event::JobAccepted { job } if *job == j)));
    assert_eq!(d.phase(j), Phase::Queued);
    // and explain says why
    let now = gpusched_core::explain::history(&d.log, &d.state, j);
    assert!(now.last().unwrap().contains("its queue is held"), "{now:?}");
    // and an admission written anyway (by an older stage) is refused.
    let refused = d.try_apply(Event::JobAdmitted {
        job: j,
        flavor: FLAVOR.into(),
        borrowed: 0,
        at: d.now,
    });
    assert!(
        matches!(refused, Err(ApplyError::QueueClosed { .. })),
        "{refused:?}"
    );
    // When it is released, the job runs.
    d.set_queue("a", QueueState::Open);
    d.settle();
    assert_eq!(d.phase(j), Phase::Running);
}

#[test]
fn a_draining_queue_refuses_submissions_and_lets_running_jobs_finish() {
    // Given `a` running on the whole cluster, one more of its jobs queued
    let mut d = two_tenants();
    let running = d.submit(job("a", 1, 8, "node"));
    for _ in 0..3 {
        d.submit(job("a", 1, 8, "node"));
    }
    let queued_before = d.submit(job("a", 1, 8, "node"));
    d.settle();
    assert_eq!(d.phase(running), Phase::Running);
    // When its queue drains and a job is submitted
    d.set_queue("a", QueueState::Draining);
    let late = d.submit(job("a", 1, 8, "node"));
    let ev = d.settle();
    // Then the new job is refused, naming the queue and its state
    let reason = ev.iter().find_map(|e| match e {
        Event::JobRejected { job, reason } if *job == late => Some(reason.clone()),
        _ => None,
    });
    assert_eq!(
        reason,
        Some(RejectReason::QueueClosed {
            tenant: "a".into(),
            state: QueueState::Draining
        })
    );
    // the running job is left alone, and runs to its end
    assert!(evictions(&ev).is_empty());
    assert_eq!(d.phase(running), Phase::Running);
    d.finish(running);
    d.settle();
    assert_eq!(d.phase(running), Phase::Succeeded);
    // and a job queued before the drain is not admitted, though there is room.
    assert_eq!(d.phase(queued_before), Phase::Queued);
}

#[test]
fn a_stopped_queue_gives_borrowed_gpus_back_first_then_the_rest() {
    // Given `a` running four 1×8 jobs: 16 GPUs of nominal, 16 borrowed
    let mut d = two_tenants();
    let jobs: Vec<JobId> = (0..4).map(|_| d.submit(ckpt_job("a"))).collect();
    d.settle();
    let borrowed: Vec<JobId> = jobs
        .iter()
        .copied()
        .filter(|j| d.job(*j).borrowed > 0)
        .collect();
    assert_eq!(borrowed.len(), 2, "two of the four run on borrowed quota");
    // When its queue is stopped
    d.advance(120);
    d.set_queue("a", QueueState::Stopped);
    let ev = d.run_until_quiet();
    // Then only the borrowed ones are evicted first, each asked for a
    // checkpoint (60 s fits the grace: deadline 65 s from now)
    let first = evictions(&ev);
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].0,
        EvictionCause::QueueStopped { tenant: "a".into() }
    );
    let mut chosen: Vec<JobId> = first[0].1.iter().map(|v| v.job).collect();
    chosen.sort_unstable();
    assert_eq!(chosen, borrowed);
    for v in &first[0].1 {
        assert_eq!(v.deadline.0, d.now.0 + 65_000);
        assert_eq!(v.expected_lost_gpu_ms, 8 * 60_000);
    }
    // When they complete their checkpoints they stop, losing only the work
    // done while checkpointing, and the others are evicted next.
    d.advance(60);
    for j in &borrowed {
        d.checkpoint(*j, 180_000);
    }
    let ev = d.run_until_quiet();
    let stopped: Vec<JobId> = ev
        .iter()
        .filter_map(|e| match e {
            Event::JobPreempted { job, .. } => Some(*job),
            _ => None,
        })
        .collect();
    assert_eq!(stopped.len(), 2);
    let rest: Vec<JobId> = jobs
        .iter()
        .copied()
        .filter(|j| !borrowed.contains(j))
        .collect();
    assert_eq!(victims_of(&ev), rest);
    // Once every job stopped, the stopped queue holds nothing and its
    // jobs wait; released, they resume from their checkpoints.
    d.advance(70);
    let _ = d.run_until_quiet();
    assert!(jobs.iter().all(|j| d.phase(*j) == Phase::Queued));
    assert_eq!(d.state.gpus_in_use(), 0);
    d.set_queue("a", QueueState::Open);
    d.settle();
    assert!(jobs.iter().all(|j| d.phase(*j) == Phase::Running));
    for j in &borrowed {
        assert_eq!(d.job(*j).resume_progress_ms, 180_000);
    }
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn a_stopped_queue_sends_admitted_jobs_back_with_their_quota() {
    // Given a job of `a` admitted but not placed (no node has room)
    let mut d = Driver::default();
    d.cluster(1, 1, 1, 8, FLAVOR);
    d.tenant(tenant("a").quota(FLAVOR, 16));
    let running = d.submit(job("a", 1, 8, "node"));
    d.settle();
    let waiting = d.submit(job("a", 1, 8, "node"));
    d.run_until_quiet();
    assert_eq!(d.phase(waiting), Phase::Admitted);
    assert!(
        d.state.reservations().contains_key(&waiting),
        "blocked, it holds a reservation"
    );
    // When the queue is stopped
    d.set_queue("a", QueueState::Stopped);
    let ev = d.run_until_quiet();
    // Then it goes back to the queue and its quota is given back
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::JobRequeued { job, reason: RequeueReason::QueueStopped { .. }, lost_gpu_ms: 0, .. } if *job == waiting
    )));
    assert_eq!(d.phase(waiting), Phase::Queued);
    assert!(
        d.state.reservations().is_empty(),
        "its nodes go back to work"
    );
    assert_eq!(victims_of(&ev), vec![running]);
    let t = d.state.tenant_idx("a").unwrap();
    let f = d.state.flavor(FLAVOR).unwrap();
    assert_eq!(
        d.state.tenant(t).used(f),
        8,
        "only the stopping job holds quota"
    );
}

#[test]
fn a_queue_that_stops_admitting_ends_its_reclaim_holds() {
    // Given `owner` reclaiming from a borrower: a hold on the cohort
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 16));
    d.tenant(
        tenant("borrower")
            .cohort("c")
            .best_effort()
            .quota(FLAVOR, 16),
    );
    for _ in 0..4 {
        d.submit(ckpt_job("borrower"));
    }
    d.settle();
    d.advance(600);
    let o = d.submit(job("owner", 2, 8, "block"));
    d.run_until_quiet();
    assert!(d.state.reclaim_holders().any(|j| j == o), "a reclaim hold");
    // When the owner's queue is held
    d.set_queue("owner", QueueState::Held);
    // Then its hold ends: nobody of the owner will take the room
    assert_eq!(d.state.reclaim_holders().count(), 0);
}

#[test]
fn evicting_a_node_moves_its_jobs_elsewhere_with_checkpoints_and_keeps_it_empty() {
    // Given two jobs on node 0 and room elsewhere (no reservations: a
    // blocked job's would pin it to the nodes it was planned on)
    let mut d = Driver::new(CycleConfig {
        reservations: 0,
        ..CycleConfig::default()
    });
    d.cluster(1, 1, 3, 8, FLAVOR);
    d.tenant(tenant("a").quota(FLAVOR, 24));
    let n0 = NodeId(0);
    let x = d.place_manually(ckpt_job_g("a", 4), &[(n0, 4)]);
    d.advance(300);
    let y = d.place_manually(
        JobSpec {
            preemptible: false,
            ..job("a", 1, 4, "node")
        },
        &[(n0, 4)],
    );
    // When the node is evicted for maintenance
    d.advance(300);
    let at = d.now;
    d.apply(Event::NodeEvicted { node: n0, at });
    let ev = d.run_until_quiet();
    // Then both are evicted (the non-preemptible one too: the admin asked)
    let planned = evictions(&ev);
    assert_eq!(planned.len(), 1);
    assert_eq!(planned[0].0, EvictionCause::NodeEvicted { node: n0 });
    assert_eq!(victims_of(&ev), vec![x, y]);
    let deadline = |j: JobId| planned[0].1.iter().find(|v| v.job == j).unwrap().deadline;
    // x may complete a 60 s checkpoint (65 s); y cannot, and has the 30 s
    // base grace.
    assert_eq!(deadline(x).0, at.0 + 65_000);
    assert_eq!(deadline(y).0, at.0 + 30_000);
    // When y's deadline passes and x completes its checkpoint
    d.advance(60);
    d.checkpoint(x, 360_000);
    d.settle();
    // Then both run again on other nodes, x from its checkpoint
    for j in [x, y] {
        assert_eq!(d.phase(j), Phase::Running);
        assert!(d.job(j).assignments.iter().all(|a| a.node != n0));
    }
    assert_eq!(d.job(x).resume_progress_ms, 360_000);
    // and the node stays out of service, empty, until uncordoned.
    assert_eq!(d.state.nodes()[0].status, NodeStatus::Evicted);
    assert!(d.state.nodes()[0].jobs.is_empty());
    let z = d.submit(job("a", 2, 8, "any"));
    d.settle();
    assert_eq!(
        d.phase(z),
        Phase::Admitted,
        "no room but on the evicted node"
    );
    d.apply(Event::NodeUncordoned { node: n0 });
    d.settle();
    assert_eq!(d.phase(z), Phase::Running);
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn an_eviction_names_only_running_jobs_of_its_node_or_stopped_queue() {
    // Given a running job on node 1, and node 0 evicted
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("a").quota(FLAVOR, 16));
    let on1 = d.place_manually(job("a", 1, 8, "node"), &[(NodeId(1), 8)]);
    let at = d.now;
    d.apply(Event::NodeEvicted {
        node: NodeId(0),
        at,
    });
    let victim = |job| Victim {
        job,
        deadline: at,
        expected_lost_gpu_ms: 0,
        cost: 0,
    };
    // Then an eviction of node 0 naming it is refused
    let r = d.try_apply(Event::EvictionPlanned {
        cause: EvictionCause::NodeEvicted { node: NodeId(0) },
        victims: vec![victim(on1)],
        at,
    });
    assert!(matches!(r, Err(ApplyError::BadPreemption { .. })), "{r:?}");
    // as is one of an open queue
    let r = d.try_apply(Event::EvictionPlanned {
        cause: EvictionCause::QueueStopped { tenant: "a".into() },
        victims: vec![victim(on1)],
        at,
    });
    assert!(matches!(r, Err(ApplyError::BadPreemption { .. })), "{r:?}");
    // and of node 1, which is not being evicted.
    let r = d.try_apply(Event::EvictionPlanned {
        cause: EvictionCause::NodeEvicted { node: NodeId(1) },
        victims: vec![victim(on1)],
        at,
    });
    assert!(matches!(r, Err(ApplyError::BadPreemption { .. })), "{r:?}");
}

fn ckpt_job_g(tenant: &str, gpus: u32) -> JobSpec {
    JobSpec {
        checkpoint: Some(CheckpointPolicy {
            interval_s: 600,
            duration_s: 60,
        }),
        ..job(tenant, 1, gpus, "node")
    }
}

#[test]
fn evictions_in_one_cycle_stay_within_max_cycle_candidates() {
    // A node with three 1×2 jobs is evicted, and a stopped queue has three
    // admitted jobs to send back, under a bound of 2 a cycle: two victims,
    // then the third; two jobs sent back, then the third.
    let mut cfg = CycleConfig::default();
    cfg.preemption.max_cycle_candidates = 2;
    let mut d = Driver::new(cfg);
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("a").quota(FLAVOR, 16));
    let on_node: Vec<JobId> = (0..3).map(|_| d.submit(job("a", 1, 2, "node"))).collect();
    d.settle();
    let node = d.job(on_node[0]).assignments[0].node;
    assert!(on_node
        .iter()
        .all(|&j| d.job(j).assignments[0].node == node));
    let at = d.now;
    d.apply(Event::NodeEvicted { node, at });
    let counts =
        |events: &[Event]| -> usize { evictions(events).iter().map(|(_, v)| v.len()).sum() };
    assert_eq!(counts(&d.cycle().events), 2);
    assert_eq!(counts(&d.cycle().events), 1);

    // t runs 8 GPUs on the one node; three more of its jobs are admitted
    // and wait for room when its queue is stopped.
    let mut d = Driver::new(cfg);
    d.cluster(1, 1, 1, 8, FLAVOR);
    d.tenant(tenant("t").quota(FLAVOR, 32));
    d.submit(job("t", 1, 8, "node"));
    d.settle();
    let waiting: Vec<JobId> = (0..3).map(|_| d.submit(job("t", 1, 8, "node"))).collect();
    d.run_until_quiet();
    assert!(waiting.iter().all(|&j| d.phase(j) == Phase::Admitted));
    d.set_queue("t", QueueState::Stopped);
    let sent_back = |events: &[Event]| {
        events
            .iter()
            .filter(|e| matches!(e, Event::JobRequeued { .. }))
            .count()
    };
    assert_eq!(sent_back(&d.cycle().events), 2);
    assert_eq!(sent_back(&d.cycle().events), 1);
}

#[test]
fn which_node_status_may_follow_which_is_one_table() {
    // Rows: the status now; columns: the status asked for, in the order
    // ready, cordoned, drained, evicted, lost. A lost node comes back
    // only by rejoining (NodeAdded), never by an operator's change.
    use NodeStatus::{Cordoned, Drained, Evicted, Lost, Ready};
    let to = [Ready, Cordoned, Drained, Evicted, Lost];
    let table = [
        (Ready, [false, true, true, true, true]),
        (Cordoned, [true, false, true, true, true]),
        (Drained, [true, false, false, true, true]),
        (Evicted, [true, false, false, false, true]),
        (Lost, [false, false, false, false, false]),
    ];
    for (from, allowed) in table {
        for (to, want) in to.iter().zip(allowed) {
            assert_eq!(from.may_be_set_to(*to), want, "{from:?} → {to:?}");
        }
    }
}
