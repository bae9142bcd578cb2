//! Worked examples of the accounting, each checkable by hand: given a
//! job's events, when they are folded, then each part holds exactly the
//! GPU-ms written beside it.

use super::*;
use gpusched_events::{CheckpointRef, PreemptionCause, RequeueReason, Victim};
use gpusched_model::{JobSpec, NodeId};

const J: JobId = JobId(1);

fn t(s: u64) -> Timestamp {
    Timestamp(s * 1000)
}

fn submitted(gpus: u32, at: u64) -> Event {
    Event::JobSubmitted {
        job: J,
        spec: JobSpec::new("team-a", 1, gpus),
        at: t(at),
    }
}

fn bound(at: u64) -> Event {
    Event::JobBound {
        job: J,
        assignments: vec![],
        backfill_for: None,
        at: t(at),
    }
}

fn started(at: u64) -> Event {
    Event::JobStarted { job: J, at: t(at) }
}

fn checkpointed(progress_s: u64, at: u64) -> Event {
    Event::JobCheckpointed {
        job: J,
        progress_ms: progress_s * 1000,
        uri: format!("ckpt/{progress_s}"),
        at: t(at),
    }
}

fn chosen(at: u64) -> Event {
    Event::PreemptionPlanned {
        beneficiary: JobId(2),
        cause: PreemptionCause::Reservation,
        victims: vec![Victim {
            job: J,
            deadline: t(at + 300),
            expected_lost_gpu_ms: 0,
            cost: 0,
        }],
        reserve: vec![],
        at: t(at),
    }
}

fn preempted(resume_s: Option<u64>, lost_gpu_s: u64, at: u64) -> Event {
    Event::JobPreempted {
        job: J,
        lost_gpu_ms: lost_gpu_s * 1000,
        resume_from: resume_s.map(|p| CheckpointRef {
            progress_ms: p * 1000,
            uri: format!("ckpt/{p}"),
        }),
        at: t(at),
    }
}

fn finished(outcome: Outcome, at: u64) -> Event {
    Event::JobFinished {
        job: J,
        outcome,
        at: t(at),
        exits: vec![],
        reason: None,
    }
}

fn account(events: &[Event]) -> Account {
    let acc = job_account(J, events, None).expect("the job was submitted");
    assert_eq!(acc.parts_gpu_ms(), acc.allocated_gpu_ms, "{acc:?}");
    acc
}

/// GPU-seconds, as GPU-ms.
fn gs(gpu_s: u64) -> u64 {
    gpu_s * 1000
}

#[test]
fn a_job_that_runs_once_is_useful_from_start_to_end_and_waits_by_reason() {
    // Given 2 GPUs submitted at 0, held by quota from 10 s, admitted at
    // 30 s, bound at 40 s, started at 45 s and succeeded at 145 s.
    let quota = Event::JobPending {
        job: J,
        reason: PendingReason::QuotaExceeded {
            flavor: "h100".into(),
            used: 8,
            nominal: 8,
            borrowable: 0,
            need: 2,
        },
        at: t(10),
    };
    let admitted = Event::JobAdmitted {
        job: J,
        flavor: "h100".into(),
        borrowed: 0,
        at: t(30),
    };
    let acc = account(&[
        submitted(2, 0),
        quota,
        admitted,
        bound(40),
        started(45),
        finished(Outcome::Succeeded, 145),
    ]);
    // Then: waits 2 × 10 s queued, 2 × 20 s on quota, 2 × 10 s queued for
    // placement; allocated 2 × 105 s, of which 2 × 5 s startup and
    // 2 × 100 s useful.
    assert_eq!(acc.wait_gpu_ms.get(&WaitReason::Queued), Some(&gs(40)));
    assert_eq!(acc.wait_gpu_ms.get(&WaitReason::Quota), Some(&gs(40)));
    assert_eq!(acc.wait_total_gpu_ms(), gs(80));
    assert_eq!(acc.allocated_gpu_ms, gs(210));
    assert_eq!(acc.startup_gpu_ms, gs(10));
    assert_eq!(acc.useful_gpu_ms, gs(200));
    assert_eq!(acc.recovery_gpu_ms(), 0);
    assert_eq!(acc.goodput(), Some(200.0 / 210.0));
}

#[test]
fn a_victim_that_checkpoints_on_request_costs_its_checkpoint_and_its_restart() {
    // Given 8 GPUs bound and started at 0, a periodic checkpoint of 600 s
    // of work complete at 700 s, chosen as a victim at 1000 s, its
    // requested checkpoint capturing 1000 s of work complete at 1030 s,
    // stopped then; bound again at 1100 s, started at 1120 s, succeeded
    // at 1620 s.
    let acc = account(&[
        submitted(8, 0),
        bound(0),
        started(0),
        checkpointed(600, 700),
        chosen(1000),
        checkpointed(1000, 1030),
        preempted(Some(1000), 8 * 30, 1030),
        bound(1100),
        started(1120),
        finished(Outcome::Succeeded, 1620),
    ]);
    // Then: useful 8 × 1000 s (saved) + 8 × 500 s (the second run);
    // checkpoint 8 × 30 s (capture at 1000 s → stop at 1030 s); restart
    // 8 × 20 s; requeued wait 8 × 70 s; nothing lost.
    assert_eq!(acc.useful_gpu_ms, gs(8 * 1500));
    assert_eq!(acc.checkpoint_gpu_ms, gs(8 * 30));
    assert_eq!(acc.restart_gpu_ms, gs(8 * 20));
    assert_eq!(acc.lost_gpu_ms, 0);
    assert_eq!(
        acc.wait_gpu_ms.get(&WaitReason::Requeued),
        Some(&gs(8 * 70))
    );
    assert_eq!(acc.allocated_gpu_ms, gs(8 * (1030 + 520)));
    assert_eq!((acc.holds, acc.preemptions), (2, 1));
}

#[test]
fn a_victim_stopped_at_its_deadline_loses_the_work_since_its_last_checkpoint() {
    // Given 4 GPUs started at 0, a periodic checkpoint of 600 s of work
    // complete at 700 s, chosen at 1000 s and stopped at its deadline
    // (1300 s) with no checkpoint since.
    let acc = account(&[
        submitted(4, 0),
        bound(0),
        started(0),
        checkpointed(600, 700),
        chosen(1000),
        preempted(Some(600), 4 * 700, 1300),
    ]);
    // Then: 4 × 600 s useful, 4 × 700 s lost (600 s → 1300 s of work).
    assert_eq!(acc.useful_gpu_ms, gs(4 * 600));
    assert_eq!(acc.lost_gpu_ms, gs(4 * 700));
    assert_eq!(acc.checkpoint_gpu_ms, 0);
    assert_eq!(acc.allocated_gpu_ms, gs(4 * 1300));
}

#[test]
fn a_checkpoint_that_completed_before_the_job_was_chosen_is_not_one_on_request() {
    // Given a checkpoint complete at 999 s and the job chosen at 1000 s,
    // stopped at 1300 s: the work after the capture is lost, not spent
    // checkpointing on request.
    let acc = account(&[
        submitted(1, 0),
        bound(0),
        started(0),
        checkpointed(900, 999),
        chosen(1000),
        preempted(Some(900), 400, 1300),
    ]);
    assert_eq!(acc.useful_gpu_ms, gs(900));
    assert_eq!(acc.lost_gpu_ms, gs(400));
    assert_eq!(acc.checkpoint_gpu_ms, 0);
}

#[test]
fn a_resumed_run_counts_only_the_work_its_own_checkpoints_add() {
    // Given a job resumed from 1000 s of work at 2000 s, which then
    // checkpoints 1500 s of work (complete at 2600 s) and loses its node
    // at 2800 s.
    let lost = Event::JobRequeued {
        job: J,
        reason: RequeueReason::NodeLost { node: NodeId(0) },
        lost_gpu_ms: 500_000,
        at: t(2800),
    };
    let acc = account(&[
        submitted(1, 0),
        bound(0),
        started(0),
        checkpointed(1000, 1100),
        chosen(1200),
        checkpointed(1200, 1250),
        preempted(Some(1200), 50, 1250),
        bound(1990),
        started(2000),
        checkpointed(1500, 2400),
        lost,
    ]);
    // Then, second run (2000 s → 2800 s, resumed at 1200 s of work): 300 s
    // useful (1200 → 1500), 500 s lost; restart 10 s. First run: 1200 s
    // useful, 50 s on request.
    assert_eq!(acc.useful_gpu_ms, gs(1200 + 300));
    assert_eq!(acc.lost_gpu_ms, gs(500));
    assert_eq!(acc.checkpoint_gpu_ms, gs(50));
    assert_eq!(acc.restart_gpu_ms, gs(10));
    assert_eq!(acc.holds, 2);
}

#[test]
fn a_failed_run_leaves_its_unsaved_work_apart_from_recovery() {
    // Given 2 GPUs started at 10 s (bound at 0), a checkpoint of 100 s of
    // work, failing at 310 s.
    let acc = account(&[
        submitted(2, 0),
        bound(0),
        started(10),
        checkpointed(100, 150),
        finished(Outcome::Failed, 310),
    ]);
    // Then: 2 × 100 s useful, 2 × 200 s unsaved at the end, 2 × 10 s startup.
    assert_eq!(acc.useful_gpu_ms, gs(200));
    assert_eq!(acc.unsaved_at_end_gpu_ms, gs(400));
    assert_eq!(acc.startup_gpu_ms, gs(20));
    assert_eq!(acc.recovery_gpu_ms(), 0);
}

#[test]
fn a_superseded_event_counts_nothing_and_a_live_job_shows_its_open_wait() {
    let mut g = Goodput::default();
    g.observe(&submitted(4, 0), true);
    g.observe(&bound(5), false);
    assert_eq!(
        g.job(J, Some(t(10))).map(|a| a.wait_total_gpu_ms()),
        Some(gs(40))
    );
    assert_eq!(g.overall().allocated_gpu_ms, 0);
    assert_eq!(g.in_flight(), 1);
    g.observe(&Event::JobCancelled { job: J, at: t(12) }, true);
    assert_eq!(g.in_flight(), 0);
    assert_eq!(
        g.overall().wait_gpu_ms.get(&WaitReason::Queued),
        Some(&gs(48))
    );
    // Not kept once ended, unless asked.
    assert_eq!(g.job(J, None), None);
}
