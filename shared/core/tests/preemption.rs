//! Scenario tests of reclaim, priority preemption, reservations with
//! backfill, and checkpoint-aware requeues (docs/architecture.md, "Preemption" and "Reservations and backfill"):
//! each sets up a cluster through events, plays the node agent by hand
//! (starts, complete checkpoints, finishes, node losses) and asserts one
//! rule that would fail if the rule broke.
#![allow(clippy::unwrap_used)]

mod common;

use common::{job, tenant, Driver, FLAVOR};
use gpusched_core::{ApplyError, CycleConfig, Phase, QuotaGpus};
use gpusched_events::{
    Assignment, CheckpointRef, Event, Outcome, PendingReason, PreemptionCause, QueueState,
    RequeueReason, Victim,
};
use gpusched_model::{CheckpointPolicy, Gpus, JobId, JobSpec, Timestamp};
use std::collections::{BTreeMap, BTreeSet};

/// A job that checkpoints every `interval_s`, each taking `duration_s`.
fn ckpt_job(
    tenant: &str,
    workers: u32,
    gpw: Gpus,
    topology: &str,
    interval_s: u64,
    duration_s: u64,
) -> JobSpec {
    JobSpec {
        checkpoint: Some(CheckpointPolicy {
            interval_s,
            duration_s,
        }),
        ..job(tenant, workers, gpw, topology)
    }
}

/// Every PreemptionPlanned in a batch: (beneficiary, cause, victims, at).
fn plans(events: &[Event]) -> Vec<(JobId, PreemptionCause, Vec<Victim>, Timestamp)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::PreemptionPlanned {
                beneficiary,
                cause,
                victims,
                at,
                ..
            } => Some((*beneficiary, cause.clone(), victims.clone(), *at)),
            _ => None,
        })
        .collect()
}

/// Every JobPreempted in a batch, by job: (lost GPU-ms, resume_from).
fn preempted(events: &[Event]) -> BTreeMap<JobId, (u64, Option<CheckpointRef>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::JobPreempted {
                job,
                lost_gpu_ms,
                resume_from,
                ..
            } => Some((*job, (*lost_gpu_ms, resume_from.clone()))),
            _ => None,
        })
        .collect()
}

fn victim_set(v: &[Victim]) -> BTreeSet<JobId> {
    v.iter().map(|x| x.job).collect()
}

fn ckref(progress_ms: u64, id: JobId) -> CheckpointRef {
    CheckpointRef {
        progress_ms,
        uri: format!("ckpt://job-{}/{progress_ms}", id.0),
    }
}

/// Index in the log of the first event matching `f`.
fn first_in_log(d: &Driver, f: impl Fn(&Event) -> bool) -> Option<usize> {
    d.log.iter().position(f)
}

fn admitted_at(d: &Driver, id: JobId, after: usize) -> Option<usize> {
    d.log
        .iter()
        .enumerate()
        .skip(after)
        .find(|(_, e)| matches!(e, Event::JobAdmitted { job, .. } if *job == id))
        .map(|(i, _)| i)
}

// ---------------------------------------------------------------- reclaim

/// 4 nodes × 8 GPUs in one block; `owner` and `borrower` 16 nominal each in
/// one cohort. The borrower fills the idle cluster with four 1×8
/// checkpointable jobs started 100 s apart (t = 1, 101, 201, 301). Their
/// checkpoints take 400 s, longer than a victim is ever given to complete
/// one: a victim's cost is then its unsaved work alone.
fn borrowed_cluster() -> (Driver, [JobId; 4]) {
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 16));
    d.tenant(
        tenant("borrower")
            .cohort("c")
            .best_effort()
            .quota(FLAVOR, 16),
    );
    let mut b = [JobId(0); 4];
    for (i, slot) in b.iter_mut().enumerate() {
        if i > 0 {
            d.advance(100);
        }
        *slot = d.submit(ckpt_job("borrower", 1, 8, "node", 600, 400));
        d.settle();
        assert_eq!(d.phase(*slot), Phase::Running);
    }
    assert_eq!(d.state.gpus_in_use(), 32);
    (d, b)
}

#[test]
fn returning_owner_reclaims_from_the_victims_with_the_least_unsaved_work() {
    let (mut d, b) = borrowed_cluster();
    // t = 1001. Unsaved work since the last complete checkpoint:
    // b0 ran 1000 s, saved 980 s → 20 s; b1 ran 900 s, saved 500 s → 400 s;
    // b2 ran 800 s, saved 750 s → 50 s; b3 ran 700 s, never saved → 700 s.
    d.advance_to(Timestamp::from_secs(1001));
    d.checkpoint(b[0], 980_000);
    d.checkpoint(b[1], 500_000);
    d.checkpoint(b[2], 750_000);
    assert_eq!(d.job(b[0]).unsaved_ms(d.now), 20_000);
    assert_eq!(d.job(b[1]).unsaved_ms(d.now), 400_000);
    assert_eq!(d.job(b[2]).unsaved_ms(d.now), 50_000);
    assert_eq!(d.job(b[3]).unsaved_ms(d.now), 700_000);

    let owner = d.submit(job("owner", 2, 8, "block"));
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1, "{p:?}");
    let (beneficiary, cause, victims, planned_at) = p[0].clone();
    assert_eq!(beneficiary, owner);
    assert_eq!(
        cause,
        PreemptionCause::Reclaim {
            tenant: "owner".into(),
            flavor: FLAVOR.into(),
            quota_deficit: 16
        }
    );
    // Exactly the two with the least unsaved work, and no more than needed.
    assert_eq!(victim_set(&victims), BTreeSet::from([b[0], b[2]]));
    let lost: BTreeMap<JobId, u64> = victims
        .iter()
        .map(|v| (v.job, v.expected_lost_gpu_ms))
        .collect();
    assert!(lost[&b[0]] >= 8 * 20_000 && lost[&b[2]] >= 8 * 50_000);
    assert!(lost[&b[0]] < lost[&b[2]]);
    for v in &victims {
        assert_eq!(d.phase(v.job), Phase::Preempting);
        assert!(v.deadline > planned_at);
    }
    assert_eq!(d.phase(b[1]), Phase::Running);
    assert_eq!(d.phase(b[3]), Phase::Running);
    assert_eq!(d.phase(owner), Phase::Queued);
    let grace = victims
        .iter()
        .map(|v| v.deadline.millis_since(planned_at))
        .max()
        .unwrap();
    let first_deadline = victims.iter().map(|v| v.deadline).min().unwrap();

    // b2 completes a checkpoint before its deadline: it stops at the next
    // cycle and resumes from that new checkpoint, losing nothing.
    d.advance_ms(first_deadline.millis_since(d.now) / 2);
    let saved = d.now.millis_since(Timestamp::from_secs(201));
    d.checkpoint(b[2], saved);
    let ev = d.run_until_quiet();
    let stopped = preempted(&ev);
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[&b[2]], (0, Some(ckref(saved, b[2]))));
    assert_eq!(d.phase(b[2]), Phase::Queued);
    // The cohort now has 8 GPUs of quota (and a node) free, but they are held
    // for the owner: the borrower's requeued job is not re-admitted.
    assert_eq!(d.state.gpus_in_use(), 24);
    assert_eq!(d.phase(owner), Phase::Queued);
    assert_eq!(d.phase(b[0]), Phase::Preempting);

    // b0 never checkpoints: at its deadline it stops, losing the work since
    // its last complete checkpoint, and the owner is admitted and bound in
    // that same cycle.
    d.advance_to(Timestamp(planned_at.0 + grace));
    let ev = d.cycle().events;
    let stopped = preempted(&ev);
    let unsaved = d.now.millis_since(Timestamp::from_secs(1 + 980));
    assert_eq!(stopped[&b[0]], (8 * unsaved, Some(ckref(980_000, b[0]))));
    assert_eq!(d.phase(owner), Phase::Bound);
    assert!(d.now.millis_since(planned_at) <= grace);
    let bound_on: BTreeSet<_> = d.job(owner).assignments.iter().map(|a| a.node).collect();
    assert_eq!(bound_on.len(), 2);
    d.run_until_quiet();

    // Requeued borrowers were never admitted ahead of the owner, and stay
    // queued: the cohort's pool is full again.
    let plan_idx = first_in_log(&d, |e| matches!(e, Event::PreemptionPlanned { .. })).unwrap();
    let owner_admitted = admitted_at(&d, owner, plan_idx).unwrap();
    for v in [b[0], b[2]] {
        assert!(admitted_at(&d, v, plan_idx).is_none_or(|i| i > owner_admitted));
        assert_eq!(d.phase(v), Phase::Queued);
        assert!(matches!(
            d.job(v).last_reason,
            Some(PendingReason::CohortExhausted { .. })
        ));
    }
    // They resume from their checkpoints once room returns.
    d.finish(owner);
    d.settle();
    assert_eq!(d.phase(b[0]), Phase::Running);
    assert_eq!(d.job(b[0]).resume_progress_ms, 980_000);
    assert_eq!(d.phase(b[2]), Phase::Running);
    assert_eq!(d.job(b[2]).resume_progress_ms, saved);
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

/// 16 nodes × 8 GPUs in two blocks; `owner` and `borrower` 64 nominal
/// each in one cohort, both best-effort (in a strict FIFO queue only the
/// head may reclaim). The borrower fills the idle cluster with sixteen 1×8
/// jobs (it borrows 64 GPUs), and they run past the minimum runtime.
fn cluster_lent_to_one_borrower() -> (Driver, Vec<JobId>) {
    let mut d = Driver::default();
    d.cluster(1, 2, 8, 8, FLAVOR);
    d.tenant(tenant("owner").cohort("c").best_effort().quota(FLAVOR, 64));
    d.tenant(
        tenant("borrower")
            .cohort("c")
            .best_effort()
            .quota(FLAVOR, 64),
    );
    let borrowed: Vec<JobId> = (0..16)
        .map(|_| d.submit(job("borrower", 1, 8, "node")))
        .collect();
    d.settle();
    assert_eq!(d.state.gpus_in_use(), 128);
    d.advance(600);
    (d, borrowed)
}

/// Cycles until one plans a preemption; that cycle's plans.
fn first_planning_cycle(d: &mut Driver) -> Vec<(JobId, PreemptionCause, Vec<Victim>, Timestamp)> {
    for _ in 0..8 {
        let p = plans(&d.cycle().events);
        if !p.is_empty() {
            return p;
        }
    }
    panic!("no cycle planned a preemption");
}

#[test]
fn a_returning_owner_has_its_whole_deficit_planned_in_one_cycle() {
    let (mut d, borrowed) = cluster_lent_to_one_borrower();
    // The owner asks for all 64 of its GPUs at once: eight 1×8 jobs.
    let owners: Vec<JobId> = (0..8)
        .map(|_| d.submit(job("owner", 1, 8, "node")))
        .collect();
    let p = first_planning_cycle(&mut d);
    let beneficiaries: BTreeSet<JobId> = p.iter().map(|x| x.0).collect();
    assert_eq!(beneficiaries, owners.iter().copied().collect(), "{p:?}");
    // One victim each, no victim twice: exactly the 64 borrowed GPUs.
    let victims: Vec<JobId> = p.iter().flat_map(|x| victim_set(&x.2)).collect();
    assert_eq!(victims.len(), 8, "{p:?}");
    assert_eq!(victims.iter().collect::<BTreeSet<_>>().len(), 8);
    assert!(victims.iter().all(|v| borrowed.contains(v)));
    // Once they stop, every owner job binds and the borrower keeps its
    // nominal 64.
    d.advance(60);
    d.settle();
    for o in &owners {
        assert_eq!(d.phase(*o), Phase::Running);
    }
    let running = borrowed
        .iter()
        .filter(|b| d.phase(**b) == Phase::Running)
        .count();
    assert_eq!(running, 8);
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn an_owner_queue_deeper_than_the_depth_bound_is_planned_for_within_a_few_cycles() {
    // The quota stage looks 2 jobs deep into a best-effort queue a cycle.
    // Each pass goes on after the last job the one before looked at, so all
    // eight owner jobs get their reason, and a plan, within four cycles,
    // while the first victims are still stopping (no agent acts here).
    let (mut d, borrowed) = cluster_lent_to_one_borrower();
    d.cfg.max_heads_per_tenant = 2;
    let owners: Vec<JobId> = (0..8)
        .map(|_| d.submit(job("owner", 1, 8, "node")))
        .collect();
    let mut planned = BTreeSet::new();
    let mut victims = Vec::new();
    for _ in 0..5 {
        for (b, _, v, _) in plans(&d.cycle().events) {
            planned.insert(b);
            victims.extend(victim_set(&v));
        }
    }
    assert_eq!(
        planned,
        owners.iter().copied().collect(),
        "planned {planned:?}"
    );
    assert_eq!(victims.len(), 8, "{victims:?}");
    assert_eq!(victims.iter().collect::<BTreeSet<_>>().len(), 8);
    assert!(victims.iter().all(|v| borrowed.contains(v)));
}

#[test]
fn plans_in_flight_count_toward_the_next_owner_jobs_deficit() {
    let (mut d, borrowed) = cluster_lent_to_one_borrower();
    // Four owner jobs are planned for; while their victims are still
    // stopping, four more arrive, then the owner would exceed its nominal
    // with a ninth.
    let first: Vec<JobId> = (0..4)
        .map(|_| d.submit(job("owner", 1, 8, "node")))
        .collect();
    let p1 = first_planning_cycle(&mut d);
    assert_eq!(p1.len(), 4, "{p1:?}");
    let second: Vec<JobId> = (0..4)
        .map(|_| d.submit(job("owner", 1, 8, "node")))
        .collect();
    let p2 = first_planning_cycle(&mut d);
    let b2: BTreeSet<JobId> = p2.iter().map(|x| x.0).collect();
    assert_eq!(b2, second.iter().copied().collect(), "{p2:?}");
    let victims: BTreeSet<JobId> = p1
        .iter()
        .chain(&p2)
        .flat_map(|x| victim_set(&x.2))
        .collect();
    assert_eq!(
        victims.len(),
        8,
        "victims taken twice or too many: {p1:?} {p2:?}"
    );
    // A ninth would borrow: it reclaims nothing.
    let ninth = d.submit(job("owner", 1, 8, "node"));
    d.advance(60);
    let ev = d.settle();
    assert!(plans(&ev).is_empty(), "{:?}", plans(&ev));
    for o in first.iter().chain(&second) {
        assert_eq!(d.phase(*o), Phase::Running);
    }
    assert_ne!(d.phase(ninth), Phase::Running);
    let running = borrowed
        .iter()
        .filter(|b| d.phase(**b) == Phase::Running)
        .count();
    assert_eq!(running, 8, "the borrower keeps its nominal 64");
}

#[test]
fn quotas_near_u32_max_from_an_older_log_still_admit_borrow_and_reclaim_without_wrapping() {
    // Releases before the 1,000,000-GPU bound took any u32. A lender of
    // u32::MAX fills the cohort's pool to the top and a borrower may borrow
    // u32::MAX past its nominal 0: every sum of them stops at u32::MAX
    // (`QuotaGpus`), so admission, the pool and a reclaim read as with
    // small quotas.
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("vast").cohort("c").quota(FLAVOR, u32::MAX));
    d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 8));
    d.tenant(
        tenant("borrower")
            .cohort("c")
            .quota(FLAVOR, 0)
            .borrowing(u32::MAX),
    );
    let b: Vec<JobId> = (0..2)
        .map(|_| d.submit(job("borrower", 1, 8, "node")))
        .collect();
    d.settle();
    assert!(b.iter().all(|&j| d.phase(j) == Phase::Running));
    let borrower = d.state.tenant_idx("borrower").unwrap();
    assert_eq!(d.state.tenant(borrower).limit(0), QuotaGpus::UNLIMITED);
    assert_eq!(d.state.cohort(0).capacity(0), u32::MAX);
    assert_eq!(d.state.cohort(0).used(0), 16);
    d.advance(1000);

    // The owner returns for its nominal 8: room is reclaimed from one of
    // the borrower's jobs (no quota is missing: the pool is far from full).
    let owner = d.submit(job("owner", 1, 8, "node"));
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, owner);
    assert!(matches!(
        p[0].1,
        PreemptionCause::Reclaim {
            quota_deficit: 0,
            ..
        }
    ));
    assert_eq!(p[0].2.len(), 1);
    let victim = p[0].2[0].job;
    assert!(b.contains(&victim));
    d.advance_to(p[0].2[0].deadline);
    d.settle();
    assert_eq!(d.phase(owner), Phase::Running);
    // The victim is admitted again (its limit is unlimited) and waits for
    // room: the pool counts the owner's 8 and the borrower's 16, exactly.
    assert_eq!(d.phase(victim), Phase::Admitted);
    assert_eq!(d.state.gpus_in_use(), 16);
    assert_eq!(d.state.cohort(0).used(0), 24);
}

/// A cohort of 40 GPUs of quota and of room (five 8-GPU nodes in one
/// block): `owner` (nominal 16) and `lender` (nominal 24) lend all of it;
/// `borrower` (nominal 0) runs three 1×8 jobs, old enough to be victims.
/// The pool has 16 of its 40 GPUs left to lend; the cluster 16 free.
fn borrower_holds_24_of_40() -> (Driver, Vec<JobId>) {
    let mut d = Driver::default();
    d.cluster(1, 1, 5, 8, FLAVOR);
    d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 16));
    d.tenant(tenant("lender").cohort("c").quota(FLAVOR, 24));
    d.tenant(tenant("borrower").cohort("c").quota(FLAVOR, 0));
    let b: Vec<JobId> = (0..3)
        .map(|_| d.submit(job("borrower", 1, 8, "node")))
        .collect();
    d.settle();
    assert_eq!(d.state.cohort(0).used(0), 24);
    d.advance(1000);
    (d, b)
}

#[test]
fn a_reclaim_frees_only_the_quota_the_pool_cannot_lend_already() {
    // Given: the owner's lender lends 8 more (lender uses 8 of its own:
    // the pool has 40 − 32 = 8 left). When: the owner asks for its nominal
    // 16 (2×8 in one block; the pool can lend 8 of it and two nodes are
    // free). Then: the deficit is 16 − 8 = 8, one victim, not two or three.
    let (mut d, b) = borrower_holds_24_of_40();
    d.submit(job("lender", 1, 8, "node"));
    d.settle();
    assert_eq!(d.state.cohort(0).used(0), 32);
    let owner = d.submit(job("owner", 2, 8, "block"));
    let p = first_planning_cycle(&mut d);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, owner);
    assert_eq!(
        p[0].1,
        PreemptionCause::Reclaim {
            tenant: "owner".into(),
            flavor: FLAVOR.into(),
            quota_deficit: 8
        }
    );
    assert_eq!(p[0].2.len(), 1, "{p:?}");
    assert!(b.contains(&p[0].2[0].job));
}

#[test]
fn an_owner_job_past_its_nominal_reclaims_nothing_even_where_borrowers_could_free_it() {
    // Given: the pool lends its last 16 to the borrower (40 of 40 drawn).
    // When: the owner asks for 24, past its nominal 16. Then: no reclaim:
    // past nominal it would borrow like anyone else, though the borrower's
    // 40 GPUs could free it all.
    let (mut d, _) = borrower_holds_24_of_40();
    for _ in 0..2 {
        d.submit(job("borrower", 1, 8, "node"));
    }
    d.settle();
    assert_eq!(d.state.cohort(0).used(0), 40);
    d.advance(1000);
    let too_big = d.submit(job("owner", 3, 8, "block"));
    let ev = d.run_until_quiet();
    assert!(plans(&ev).is_empty(), "{:?}", plans(&ev));
    assert_eq!(d.phase(too_big), Phase::Queued);
    // Within its nominal, the same owner does reclaim.
    d.apply(Event::JobCancelled {
        job: too_big,
        at: d.now,
    });
    let within = d.submit(job("owner", 2, 8, "block"));
    let p = first_planning_cycle(&mut d);
    assert_eq!(p[0].0, within);
    assert_eq!(p[0].2.len(), 2, "{p:?}");
}

#[test]
fn reclaim_never_takes_from_a_tenant_within_its_nominal_quota() {
    // `within` uses exactly its nominal 16 with freshly checkpointed (cheap)
    // jobs; `borrower` borrows 16 with expensive ones. The owner's 2×8 job
    // must take the expensive ones.
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 16));
    d.tenant(tenant("within").cohort("c").best_effort().quota(FLAVOR, 16));
    d.tenant(
        tenant("borrower")
            .cohort("c")
            .best_effort()
            .quota(FLAVOR, 0),
    );
    let w: Vec<JobId> = (0..2)
        .map(|_| d.submit(ckpt_job("within", 1, 8, "node", 600, 60)))
        .collect();
    let b: Vec<JobId> = (0..2)
        .map(|_| d.submit(ckpt_job("borrower", 1, 8, "node", 600, 60)))
        .collect();
    d.settle();
    assert_eq!(d.state.gpus_in_use(), 32);
    d.advance(1000);
    for &j in &w {
        d.checkpoint(j, 999_000);
    }

    // A job of the owner that would borrow (3×8 > nominal 16) reclaims nothing.
    let too_big = d.submit(job("owner", 3, 8, "block"));
    let ev = d.run_until_quiet();
    assert!(plans(&ev).is_empty(), "{:?}", plans(&ev));
    d.apply(Event::JobCancelled {
        job: too_big,
        at: d.now,
    });

    let owner = d.submit(job("owner", 2, 8, "block"));
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].0, owner);
    assert_eq!(victim_set(&p[0].2), b.iter().copied().collect());
    d.advance(600);
    d.settle();
    assert_eq!(d.phase(owner), Phase::Running);
    for &j in &w {
        assert_eq!(
            d.phase(j),
            Phase::Running,
            "a job within nominal was touched"
        );
        assert_eq!(d.job(j).preemptions, 0);
    }
    // The borrower is now at its nominal (0) and the owner at its own: a
    // second owner job that does not fit its nominal reclaims nothing more.
    let more = d.submit(job("owner", 1, 8, "node"));
    d.advance(600);
    let ev = d.run_until_quiet();
    assert!(plans(&ev).is_empty());
    assert_eq!(d.phase(more), Phase::Queued);
}

#[test]
fn a_reclaim_hold_ends_once_its_tenants_other_job_takes_the_nominal_room() {
    // Given 4 nodes × 8 GPUs, `owner` 8 nominal and `borrower` 24 in one
    // cohort, the borrower running four 1×8 jobs (8 GPUs borrowed), and a
    // reclaim planned for the owner's 1×4 job (its victim still stopping,
    // its hold keeping the quota the victim frees for it),
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 8));
    d.tenant(
        tenant("borrower")
            .cohort("c")
            .best_effort()
            .quota(FLAVOR, 24),
    );
    let b: Vec<JobId> = (0..4)
        .map(|_| d.submit(ckpt_job("borrower", 1, 8, "node", 600, 60)))
        .collect();
    d.settle();
    assert_eq!(d.state.gpus_in_use(), 32);
    d.advance(1000);
    let held = d.submit(job("owner", 1, 4, "node"));
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, held);
    assert_eq!(d.state.reclaim_holders().collect::<Vec<_>>(), vec![held]);
    // when a higher-priority 1×8 job of the owner is admitted first, into
    // all of the owner's nominal quota, once the victim has stopped,
    let first = d.submit(JobSpec {
        priority: 5,
        ..job("owner", 1, 8, "node")
    });
    d.advance(600);
    d.run_until_quiet();
    assert_ne!(d.phase(first), Phase::Queued);
    assert_eq!(d.phase(held), Phase::Queued);
    // then the held job would borrow like anyone else: its hold has ended,
    // and nothing more is taken from the borrower (now at its nominal).
    assert_eq!(d.state.reclaim_holders().count(), 0);
    assert_eq!(d.state.plans().count(), 0);
    let running = b.iter().filter(|j| d.phase(**j) == Phase::Running).count();
    assert_eq!(running, 3);
}

#[test]
fn non_preemptible_borrowers_are_never_chosen() {
    let mut d = Driver::default();
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
                preemptible: false,
                ..ckpt_job("borrower", 1, 8, "node", 600, 60)
            })
        })
        .collect();
    d.settle();
    let owner = d.submit(job("owner", 1, 8, "node"));
    let mut all = Vec::new();
    for _ in 0..10 {
        d.advance(600);
        all.extend(d.run_until_quiet());
    }
    assert!(plans(&all).is_empty(), "{:?}", plans(&all));
    assert!(b.iter().all(|&j| d.phase(j) == Phase::Running));
    assert_eq!(d.phase(owner), Phase::Queued);
    assert!(matches!(
        d.job(owner).last_reason,
        Some(PendingReason::CohortExhausted { .. })
    ));
    // It runs as soon as a borrower's job ends.
    d.finish(b[3]);
    d.run_until_quiet();
    assert_eq!(d.phase(owner), Phase::Bound);
}

#[test]
fn young_jobs_are_not_victims_until_min_runtime() {
    let (mut d, b) = borrowed_cluster();
    // t = 301: b3 started just now; everything else ran ≥ 100 s. With a
    // minimum runtime of 250 s only b0 (300 s) may be chosen.
    d.cfg.preemption.min_runtime_ms = 250_000;
    let owner = d.submit(job("owner", 1, 8, "node"));
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1);
    assert_eq!(victim_set(&p[0].2), BTreeSet::from([b[0]]));
    assert_eq!(p[0].0, owner);
}

// ---------------------------------------------------------------- priority

/// Tenant `t` (nominal 16, no cohort) on 2 nodes × 8 runs two low-priority
/// 1×8 jobs for 300 s; then a priority-5 job arrives.
fn priority_setup(priority_preemption: bool) -> (Driver, [JobId; 2], JobId) {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    let mut t = tenant("t").best_effort().quota(FLAVOR, 16);
    t.0.priority_preemption = priority_preemption;
    d.tenant(t);
    let lo0 = d.submit(ckpt_job("t", 1, 8, "node", 600, 60));
    d.advance(100);
    let lo1 = d.submit(ckpt_job("t", 1, 8, "node", 600, 60));
    d.settle();
    d.advance(200);
    // lo0 saved all but 10 s; lo1 saved nothing (200 s unsaved).
    d.checkpoint(lo0, 290_000);
    let high = d.submit(JobSpec {
        priority: 5,
        ..job("t", 1, 8, "node")
    });
    (d, [lo0, lo1], high)
}

#[test]
fn higher_priority_job_evicts_a_lower_one_of_its_tenant() {
    let (mut d, [lo0, lo1], high) = priority_setup(true);
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, high);
    assert_eq!(
        p[0].1,
        PreemptionCause::Priority {
            tenant: "t".into(),
            flavor: FLAVOR.into()
        }
    );
    assert_eq!(victim_set(&p[0].2), BTreeSet::from([lo0]));
    assert_eq!(d.phase(lo1), Phase::Running);
    d.advance_to(p[0].2[0].deadline);
    let ev = d.settle();
    assert_eq!(
        preempted(&ev)[&lo0].1,
        Some(ckref(290_000, lo0)),
        "resumes from its last complete checkpoint"
    );
    assert_eq!(d.phase(high), Phase::Running);
    assert_eq!(d.phase(lo0), Phase::Queued);
    // An equal-priority job is no victim: lo0 waits, nothing is planned for it.
    d.advance(600);
    let ev = d.run_until_quiet();
    assert!(plans(&ev).is_empty());
    assert_eq!(d.phase(lo1), Phase::Running);
}

/// Submits a priority 1×8 job for t and runs until quiet; the victims of
/// the one plan made, for that job.
fn the_one_plan_for_a_priority_job(d: &mut Driver) -> Vec<Victim> {
    let high = d.submit(JobSpec {
        priority: 5,
        ..job("t", 1, 8, "node")
    });
    let p = plans(&d.run_until_quiet());
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, high);
    p[0].2.clone()
}

#[test]
fn a_borrowing_tenants_priority_job_takes_only_what_passes_its_limit() {
    // t: 8 GPUs nominal, may borrow 8 more (limit 16), from l. Three of
    // its low-priority 1×4 jobs hold 12. A priority 1×8 job would bring it
    // to 20: 4 past the limit, so one 1×4 job goes, not two.
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    let mut t = tenant("t").cohort("c").quota(FLAVOR, 8).borrowing(8);
    t.0.priority_preemption = true;
    d.tenant(t);
    d.tenant(tenant("l").cohort("c").quota(FLAVOR, 24));
    for _ in 0..3 {
        d.submit(ckpt_job("t", 1, 4, "node", 600, 60));
    }
    d.settle();
    d.advance(600);
    let victims = the_one_plan_for_a_priority_job(&mut d);
    assert_eq!(victims.len(), 1, "4 GPUs past the limit: {victims:?}");
}

#[test]
fn a_priority_job_past_a_lowered_limit_frees_the_overage_in_one_plan() {
    // t holds 16 GPUs in two low-priority 1×8 jobs; its quota is lowered
    // to 8. A priority 1×8 job needs 16 freed (8 over, 8 its own): both
    // go in one plan, not one now and one later.
    let mut d = Driver::default();
    d.cluster(1, 1, 3, 8, FLAVOR);
    let mut t = tenant("t").quota(FLAVOR, 16);
    t.0.priority_preemption = true;
    d.tenant(t);
    let low = [
        d.submit(ckpt_job("t", 1, 8, "node", 600, 60)),
        d.submit(ckpt_job("t", 1, 8, "node", 600, 60)),
    ];
    d.settle();
    d.advance(600);
    let mut lowered = tenant("t").quota(FLAVOR, 8);
    lowered.0.priority_preemption = true;
    d.tenant(lowered);
    let victims = the_one_plan_for_a_priority_job(&mut d);
    assert_eq!(victim_set(&victims), BTreeSet::from(low));
}

#[test]
fn priority_preemption_switched_off_evicts_nothing() {
    let (mut d, [lo0, lo1], high) = priority_setup(false);
    let mut all = Vec::new();
    for _ in 0..5 {
        all.extend(d.run_until_quiet());
        d.advance(600);
    }
    assert!(plans(&all).is_empty());
    assert_eq!(d.phase(lo0), Phase::Running);
    assert_eq!(d.phase(lo1), Phase::Running);
    assert_eq!(d.phase(high), Phase::Queued);
    assert!(matches!(
        d.job(high).last_reason,
        Some(PendingReason::QuotaExceeded { .. })
    ));
}

#[test]
fn higher_priority_gang_blocked_for_room_evicts_lower_ones_of_its_tenant() {
    // Quota is ample; the block is full. A 2×8 priority job is admitted but
    // no domain fits (NoDomainFits): it evicts the cheapest two of three
    // low-priority jobs, never the non-preemptible one.
    // Reservations are on (the default): the gang's own reservation must
    // not hide its nodes from the victim search.
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("t").best_effort().quota(FLAVOR, 64));
    let keep = d.submit(JobSpec {
        preemptible: false,
        ..job("t", 1, 8, "node")
    });
    let lo: Vec<JobId> = (0..3)
        .map(|_| d.submit(ckpt_job("t", 1, 8, "node", 600, 60)))
        .collect();
    d.settle();
    d.advance(500);
    d.checkpoint(lo[0], 480_000);
    d.checkpoint(lo[2], 490_000);
    let high = d.submit(JobSpec {
        priority: 5,
        ..job("t", 2, 8, "block")
    });
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(victim_set(&p[0].2), BTreeSet::from([lo[0], lo[2]]));
    d.advance(300);
    d.settle();
    assert_eq!(d.phase(high), Phase::Running);
    assert_eq!(d.phase(keep), Phase::Running);
    assert_eq!(d.phase(lo[1]), Phase::Running);
}

#[test]
fn a_reserved_gang_preempts_for_the_rest_of_its_reserved_nodes() {
    // The gang's reservation already holds a node freed by a job that ended;
    // the other is taken by a lower-priority preemptible job.
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("t").best_effort().quota(FLAVOR, 64));
    let fixed = d.submit(JobSpec {
        preemptible: false,
        ..job("t", 1, 8, "node")
    });
    let lo = d.submit(ckpt_job("t", 1, 8, "node", 600, 60));
    d.settle();
    d.advance(100);
    let high = d.submit(JobSpec {
        priority: 5,
        ..job("t", 2, 8, "block")
    });
    let ev = d.run_until_quiet();
    assert!(plans(&ev).is_empty(), "the non-preemptible job stays");
    assert!(d.state.reservations().contains_key(&high));
    d.finish(fixed);
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(victim_set(&p[0].2), BTreeSet::from([lo]));
    d.advance_to(p[0].2[0].deadline);
    d.settle();
    assert_eq!(d.phase(high), Phase::Running);
}

// ---------------------------------------------------------------- reservations

/// One block of 2 nodes × 8 GPUs: r1 (1×8 on n0, max 1000 s) and r2 (1×4 on
/// n1, max 600 s) run; a 2×8 block gang is blocked.
fn reservation_setup() -> (Driver, [JobId; 2], JobId) {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("t").best_effort().quota(FLAVOR, 64));
    let r1 = d.submit(JobSpec {
        max_runtime_s: Some(1000),
        preemptible: false,
        ..job("t", 1, 8, "node")
    });
    let r2 = d.submit(JobSpec {
        max_runtime_s: Some(600),
        preemptible: false,
        ..job("t", 1, 4, "node")
    });
    d.settle();
    let gang = d.submit(job("t", 2, 8, "block"));
    (d, [r1, r2], gang)
}

fn reservation_start(events: &[Event], id: JobId) -> Option<Option<Timestamp>> {
    events.iter().rev().find_map(|e| match e {
        Event::ReservationMade { job, start, .. } if *job == id => Some(*start),
        _ => None,
    })
}

#[test]
fn backfill_never_delays_a_reservation() {
    let (mut d, [r1, r2], gang) = reservation_setup();
    let t0 = d.now;
    let ev = d.run_until_quiet();
    let start = reservation_start(&ev, gang)
        .expect("the blocked gang gets a reservation")
        .expect("max runtimes guarantee a start");
    assert_eq!(start, t0.plus_secs(1000));
    assert_eq!(d.phase(gang), Phase::Admitted);

    // Non-preemptible small jobs: one ends after the start, one before.
    let late = d.submit(JobSpec {
        max_runtime_s: Some(2000),
        preemptible: false,
        ..job("t", 1, 4, "node")
    });
    let early = d.submit(JobSpec {
        max_runtime_s: Some(500),
        preemptible: false,
        ..job("t", 1, 4, "node")
    });
    let ev = d.settle();
    assert_eq!(d.phase(early), Phase::Running);
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::JobBound { job, backfill_for: Some(o), .. } if *job == early && *o == gang
    )));
    assert_eq!(d.phase(late), Phase::Admitted, "it would delay the gang");
    // Explain names the reservation ahead of it, and gives the gang (only)
    // its guaranteed start.
    assert_eq!(
        gpusched_core::explain::reservation_ahead(&d.state, late),
        Some(gang)
    );
    assert_eq!(
        gpusched_core::explain::reservation_ahead(&d.state, gang),
        None
    );
    let now = gpusched_core::explain::history(&d.log, &d.state, late);
    let last = now.last().unwrap();
    assert!(
        last.contains(&format!("reserved for job {gang} ahead of it")),
        "{last}"
    );
    assert!(last.contains("no start time"), "{last}");
    let gang_now = gpusched_core::explain::history(&d.log, &d.state, gang);
    assert!(
        gang_now
            .last()
            .unwrap()
            .contains("a reservation guarantees a start"),
        "{gang_now:?}"
    );

    // Jobs end at (or before) their max runtimes; the gang starts no later
    // than its reservation's start, and before `late`.
    d.advance(500);
    d.finish(early);
    d.settle();
    assert_eq!(d.phase(late), Phase::Admitted);
    d.advance(100);
    d.finish(r2);
    d.settle();
    assert_eq!(d.phase(late), Phase::Admitted);
    assert_eq!(d.phase(gang), Phase::Admitted);
    d.advance_to(start);
    d.finish(r1);
    d.settle();
    assert_eq!(d.phase(gang), Phase::Running);
    assert!(d.job(gang).started_at.unwrap() <= start);
    assert_eq!(d.phase(late), Phase::Admitted);
    assert!(d.state.reservations().get(&gang).is_none());
}

#[test]
fn preemptible_backfill_leaves_when_the_reservation_could_start() {
    let (mut d, [r1, r2], gang) = reservation_setup();
    let ev = d.run_until_quiet();
    assert!(reservation_start(&ev, gang).is_some());
    // Preemptible, no max runtime: may backfill, and must leave.
    let pre = d.submit(ckpt_job("t", 1, 4, "node", 600, 60));
    d.settle();
    assert_eq!(d.phase(pre), Phase::Running);
    assert_eq!(d.job(pre).backfill_for, Some(gang));
    d.advance(200);
    d.checkpoint(pre, 150_000);
    d.advance(400);
    d.finish(r2);
    d.finish(r1);
    let first = d.cycle();
    assert_eq!(first.stats.preemption.planned, 1, "the plan is counted");
    let mut ev = first.events;
    ev.extend(d.run_until_quiet());
    let p = plans(&ev);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, gang);
    assert_eq!(p[0].1, PreemptionCause::Reservation);
    assert_eq!(victim_set(&p[0].2), BTreeSet::from([pre]));
    assert_eq!(p[0].2[0].deadline, d.now, "backfill gets no grace");
    let stopped = preempted(&ev);
    assert_eq!(stopped[&pre], (4 * 450_000, Some(ckref(150_000, pre))));
    assert_eq!(d.phase(gang), Phase::Bound);
}

#[test]
fn no_backfill_leaves_for_a_reservation_whose_owners_queue_stops() {
    // As above, but the backfill is another tenant's, and the gang's queue
    // stops as the reserved nodes free up: the gang goes back to its queue
    // and the backfill runs on.
    let (mut d, [r1, r2], gang) = reservation_setup();
    d.tenant(tenant("u").best_effort().quota(FLAVOR, 8));
    let ev = d.run_until_quiet();
    assert!(reservation_start(&ev, gang).is_some());
    let pre = d.submit(ckpt_job("u", 1, 4, "node", 600, 60));
    d.settle();
    assert_eq!(d.job(pre).backfill_for, Some(gang));
    d.advance(600);
    d.finish(r2);
    d.finish(r1);
    d.set_queue("t", QueueState::Stopped);
    let ev = d.run_until_quiet();
    assert!(plans(&ev).is_empty(), "{:?}", plans(&ev));
    assert_eq!(d.phase(gang), Phase::Queued);
    assert_eq!(d.phase(pre), Phase::Running);
}

/// A stream of 1-GPU jobs (one every 3 s, each running 270 s: 90 at once)
/// on 2 blocks × 8 nodes × 8 GPUs; at 300 s an 8×8 block gang arrives.
/// Returns when the gang started, if it did before the stream ended (1800 s).
fn stream(reservations: usize, preemptible: bool) -> Option<u64> {
    let mut d = Driver::new(CycleConfig {
        reservations,
        ..CycleConfig::default()
    });
    d.cluster(1, 2, 8, 8, FLAVOR);
    d.tenant(tenant("small").best_effort().quota(FLAVOR, 1024));
    d.tenant(tenant("big").quota(FLAVOR, 1024));
    let mut gang = None;
    // End time → (job, start of the run that ends then).
    let mut ends: BTreeMap<u64, Vec<(JobId, Timestamp)>> = BTreeMap::new();
    let t0 = d.now;
    for step in 0..600u64 {
        let t = step * 3;
        d.advance_to(t0.plus_secs(t));
        for (j, run) in ends.remove(&t).unwrap_or_default() {
            if d.phase(j) == Phase::Running && d.job(j).started_at == Some(run) {
                d.finish(j);
            }
        }
        if t == 300 {
            gang = Some(d.submit(job("big", 8, 8, "block")));
        }
        d.submit(JobSpec {
            preemptible,
            ..job("small", 1, 1, "block")
        });
        d.settle();
        for &j in &d.jobs {
            let job = d.job(j);
            // A (re)start schedules the end of that run.
            if job.phase == Phase::Running && job.started_at == Some(d.now) && Some(j) != gang {
                ends.entry(t + 270).or_default().push((j, d.now));
            }
        }
        if let Some(g) = gang {
            if d.phase(g) == Phase::Running {
                return Some(t - 300);
            }
        }
    }
    None
}

#[test]
fn a_big_gang_is_not_starved_by_a_stream_of_small_jobs() {
    for preemptible in [false, true] {
        let with = stream(4, preemptible);
        let without = stream(0, preemptible);
        let waited = with.expect("with reservations the gang starts during the stream");
        assert!(
            waited <= 300,
            "preemptible {preemptible}: waited {waited} s"
        );
        // Without reservations the 90 small jobs always leave both blocks
        // partly used: the gang never starts while the stream lasts.
        assert_eq!(without, None, "preemptible {preemptible}");
    }
}

// ---------------------------------------------------------------- node loss

#[test]
fn node_loss_requeues_from_the_last_complete_checkpoint_on_its_flavor() {
    let mut d = Driver::default();
    let n = d.cluster(1, 1, 2, 8, FLAVOR);
    let other = d.add_node("r0", "b1", 8, "a100");
    d.tenant(tenant("t").quota(FLAVOR, 16).quota("a100", 8));
    let j = d.submit(ckpt_job("t", 1, 8, "node", 300, 30));
    d.settle();
    assert_eq!(d.job(j).flavor, d.state.flavor(FLAVOR));
    let on = d.job(j).assignments[0].node;
    let started = d.job(j).started_at.unwrap();
    d.advance(330);
    d.checkpoint(j, 300_000);
    d.advance(170);
    // Unsaved: 500 s ran − 300 s saved.
    d.apply(Event::NodeLost {
        node: on,
        at: d.now,
    });
    let requeues = gpusched_core::recovery::decide(&d.state, d.now);
    assert_eq!(
        requeues,
        vec![Event::JobRequeued {
            job: j,
            reason: RequeueReason::NodeLost { node: on },
            lost_gpu_ms: 8 * 200_000,
            at: d.now
        }]
    );
    assert_eq!(d.now.millis_since(started), 500_000);
    for e in requeues {
        d.apply(e);
    }
    assert_eq!(d.phase(j), Phase::Queued);
    assert_eq!(d.job(j).resume_progress_ms, 300_000);
    // It may not resume on another flavor than its checkpoint's.
    let refused = d.try_apply(Event::JobAdmitted {
        job: j,
        flavor: "a100".into(),
        borrowed: 0,
        at: d.now,
    });
    assert!(
        matches!(
            refused,
            Err(ApplyError::IncompatibleResume { .. } | ApplyError::BadFlavor(_))
        ),
        "{refused:?}"
    );
    d.settle();
    assert_eq!(d.phase(j), Phase::Running);
    assert_eq!(d.job(j).flavor, d.state.flavor(FLAVOR));
    let now_on = d.job(j).assignments[0].node;
    assert_ne!(now_on, on);
    assert_ne!(now_on, other);
    assert!(n.contains(&now_on));
    assert_eq!(d.job(j).resume_progress_ms, 300_000);
    assert_eq!(d.job(j).lost_gpu_ms, 8 * 200_000);
}

#[test]
fn node_loss_through_a_cycle_counts_only_unsaved_work() {
    let mut d = Driver::default();
    let n = d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("t").quota(FLAVOR, 16));
    let j = d.submit(ckpt_job("t", 1, 8, "node", 100, 10));
    d.settle();
    d.advance(110);
    d.checkpoint(j, 100_000);
    d.advance(40);
    let on = d.job(j).assignments[0].node;
    d.apply(Event::NodeLost {
        node: on,
        at: d.now,
    });
    let ev = d.settle();
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::JobRequeued { job, lost_gpu_ms, .. } if *job == j && *lost_gpu_ms == 8 * 50_000
    )));
    assert_eq!(d.phase(j), Phase::Running);
    assert_eq!(d.job(j).resume_progress_ms, 100_000);
    assert!(n.contains(&d.job(j).assignments[0].node));
}

// ---------------------------------------------------------------- apply

#[test]
fn apply_refuses_illegal_preemption_events_and_changes_nothing() {
    let mut d = Driver::default();
    let n = d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("t").best_effort().quota(FLAVOR, 64));
    let fixed = d.place_manually(
        JobSpec {
            preemptible: false,
            ..job("t", 1, 8, "node")
        },
        &[(n[0], 8)],
    );
    let soft = d.place_manually(ckpt_job("t", 1, 8, "node", 60, 5), &[(n[1], 8)]);
    let waiting = d.submit(JobSpec {
        priority: 9,
        ..job("t", 1, 8, "node")
    });
    d.apply(Event::JobAccepted { job: waiting });
    d.advance(100);
    d.checkpoint(soft, 60_000);

    let victim = |job: JobId, at: Timestamp| Victim {
        job,
        deadline: at.plus_secs(30),
        expected_lost_gpu_ms: 0,
        cost: 0,
    };
    let cause = PreemptionCause::Priority {
        tenant: "t".into(),
        flavor: FLAVOR.into(),
    };
    let hash = d.state.state_hash();

    // A non-preemptible victim.
    let r = d.try_apply(Event::PreemptionPlanned {
        beneficiary: waiting,
        cause: cause.clone(),
        victims: vec![victim(fixed, d.now)],
        reserve: vec![],
        at: d.now,
    });
    assert!(matches!(r, Err(ApplyError::BadPreemption { job, .. }) if job == fixed));
    assert_eq!(d.state.state_hash(), hash);
    assert_eq!(d.phase(fixed), Phase::Running);

    // Nor mixed into a set with a legal one.
    let r = d.try_apply(Event::PreemptionPlanned {
        beneficiary: waiting,
        cause: cause.clone(),
        victims: vec![victim(soft, d.now), victim(fixed, d.now)],
        reserve: vec![Assignment {
            node: n[1],
            gpus: 8,
        }],
        at: d.now,
    });
    assert!(r.is_err());
    assert_eq!(d.state.state_hash(), hash);
    assert_eq!(d.phase(soft), Phase::Running);

    // A checkpoint whose progress goes back.
    let r = d.try_apply(Event::JobCheckpointed {
        job: soft,
        progress_ms: 59_000,
        uri: "ckpt://older".into(),
        at: d.now,
    });
    assert!(matches!(r, Err(ApplyError::Invalid(f)) if f.field == "progress_ms"));
    assert_eq!(d.state.state_hash(), hash);

    // A legal plan, then stops that do not resume from the last complete
    // checkpoint.
    d.apply(Event::PreemptionPlanned {
        beneficiary: waiting,
        cause,
        victims: vec![victim(soft, d.now)],
        reserve: vec![],
        at: d.now,
    });
    assert_eq!(d.phase(soft), Phase::Preempting);
    let hash = d.state.state_hash();
    for resume_from in [
        None,
        Some(ckref(30_000, soft)),
        Some(CheckpointRef {
            progress_ms: 60_000,
            uri: "ckpt://elsewhere".into(),
        }),
    ] {
        let r = d.try_apply(Event::JobPreempted {
            job: soft,
            lost_gpu_ms: 0,
            resume_from,
            at: d.now,
        });
        assert!(
            matches!(r, Err(ApplyError::IncompatibleResume { .. })),
            "{r:?}"
        );
        assert_eq!(d.state.state_hash(), hash);
        assert_eq!(d.phase(soft), Phase::Preempting);
    }
    d.apply(Event::JobPreempted {
        job: soft,
        lost_gpu_ms: 8 * 40_000,
        resume_from: Some(ckref(60_000, soft)),
        at: d.now,
    });
    assert_eq!(d.phase(soft), Phase::Queued);
    assert_eq!(d.job(soft).resume_progress_ms, 60_000);
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn a_cancelled_running_job_holds_its_gpus_until_its_agent_stops_it() {
    let mut d = Driver::default();
    d.cluster(1, 1, 1, 8, FLAVOR);
    d.tenant(tenant("t").quota(FLAVOR, 8));
    let j = d.submit(ckpt_job("t", 1, 8, "node", 600, 60));
    d.settle();
    assert_eq!(d.phase(j), Phase::Running);
    d.advance(100);
    d.apply(Event::JobCancelRequested { job: j, at: d.now });
    // Asked twice: refused, nothing changes.
    let again = d.try_apply(Event::JobCancelRequested { job: j, at: d.now });
    assert!(matches!(again, Err(ApplyError::Invalid(_))), "{again:?}");
    assert_eq!(d.phase(j), Phase::Running);
    assert_eq!(d.state.gpus_in_use(), 8, "GPUs stay held until it stops");
    // Its final checkpoint, then the agent's stop.
    d.checkpoint(j, 100_000);
    d.apply(Event::JobFinished {
        job: j,
        outcome: Outcome::Cancelled,
        at: d.now,
        exits: Vec::new(),
        reason: None,
    });
    assert_eq!(d.phase(j), Phase::Cancelled);
    assert_eq!(d.state.gpus_in_use(), 0);
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

#[test]
fn a_cancelled_victim_leaves_instead_of_requeueing() {
    let (mut d, _) = borrowed_cluster();
    let owner = d.submit(job("owner", 2, 8, "block"));
    let ev = d.run_until_quiet();
    let p = plans(&ev);
    assert_eq!(p.len(), 1);
    let v = p[0].2[0].job;
    assert_eq!(d.phase(v), Phase::Preempting);
    d.apply(Event::JobCancelRequested { job: v, at: d.now });
    d.advance(3600);
    d.settle();
    assert_eq!(
        d.phase(v),
        Phase::Cancelled,
        "a cancelled job never runs again"
    );
    assert!(d.job(v).ended_at.is_some());
    assert_eq!(d.phase(owner), Phase::Running);
    d.state.check_invariants().unwrap();
    assert_eq!(d.replay().state_hash(), d.state.state_hash());
}

/// Lender `b` (24 GPUs) runs four 8-GPU jobs on 32 GPUs, borrowing 8 of
/// `a`'s; `run_s` later, `a` (8 GPUs, best-effort) asks for 16 (`head`:
/// it must borrow 8).
fn a_head_that_must_borrow(run_s: u64) -> (Driver, JobId, Vec<JobId>) {
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("a").cohort("c").best_effort().quota(FLAVOR, 8));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 24));
    let lent: Vec<JobId> = (0..4).map(|_| d.submit(job("b", 1, 8, "any"))).collect();
    d.run_until_quiet();
    d.start_bound();
    d.advance(run_s);
    let head = d.submit(job("a", 2, 8, "any"));
    d.run_until_quiet();
    assert_eq!(d.phase(head), Phase::Queued);
    (d, head, lent)
}

#[test]
fn no_room_is_made_for_a_job_behind_a_head_that_holds_its_queue() {
    // b's jobs have just started: none may be stopped yet.
    let (mut d, head, _) = a_head_that_must_borrow(0);
    // A small job within a's nominal quota waits for lent quota...
    let small = d.submit(job("a", 1, 8, "any"));
    d.run_until_quiet();
    assert_eq!(d.phase(small), Phase::Queued);
    // ...until the head waits past the starvation window and holds a's
    // queue: quota will not reach the small job before the head.
    d.advance(2 * 3_600);
    let events = d.run_until_quiet();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::PreemptionPlanned { .. })),
        "room made for job {small}, which waits behind head {head}: {events:?}"
    );
    assert_eq!(d.phase(small), Phase::Queued);
}

#[test]
fn a_reclaim_held_for_a_job_behind_a_starved_head_does_not_hold_the_head_forever() {
    let (mut d, head, lent) = a_head_that_must_borrow(600);
    // Before the head starves, the small job reclaims a's lent 8 GPUs.
    let small = d.submit(job("a", 1, 8, "any"));
    let events = d.run_until_quiet();
    assert!(
        events.iter().any(
            |e| matches!(e, Event::PreemptionPlanned { beneficiary, .. } if *beneficiary == small)
        ),
        "{events:?}"
    );
    d.settle();
    // The head starves and holds the queue; b's jobs all end.
    d.advance(2 * 3_600);
    for j in lent {
        if d.phase(j).holds_gpus() {
            d.finish(j);
        }
    }
    d.run_until_quiet();
    // The quota the reclaim freed is a's: its head takes it (before, the
    // small job's hold kept the head from borrowing, and the head kept the
    // small job from being looked at: neither ever ran).
    assert_ne!(d.phase(head), Phase::Queued, "the head still waits");
    d.start_bound();
    d.finish(head);
    d.run_until_quiet();
    assert_ne!(d.phase(small), Phase::Queued, "the small job still waits");
}

/// One 8-GPU node lent by `owner` to `borrower`, whose 1×8 job checkpoints
/// every `interval_s` for `duration_s` (none reported complete) and has
/// run `ran_ms` when the owner asks for its 8 GPUs back. The one victim,
/// with the time of the plan.
fn victim_after(interval_s: u64, duration_s: u64, ran_ms: u64) -> (Victim, Timestamp) {
    victim_under(CycleConfig::default(), interval_s, duration_s, ran_ms)
}

/// `victim_after` under `cfg`.
fn victim_under(
    cfg: CycleConfig,
    interval_s: u64,
    duration_s: u64,
    ran_ms: u64,
) -> (Victim, Timestamp) {
    let mut d = Driver::new(cfg);
    d.cluster(1, 1, 1, 8, FLAVOR);
    d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 8));
    d.tenant(tenant("borrower").cohort("c").quota(FLAVOR, 0));
    let b = d.submit(ckpt_job("borrower", 1, 8, "node", interval_s, duration_s));
    d.settle();
    let started = d.job(b).started_at.expect("running");
    d.advance_to(Timestamp(started.0 + ran_ms));
    d.submit(job("owner", 1, 8, "node"));
    let p = plans(&d.run_until_quiet());
    assert_eq!(p.len(), 1, "{p:?}");
    let (_, _, victims, at) = p[0].clone();
    assert_eq!(victims.len(), 1);
    assert_eq!(at, d.now);
    (victims[0].clone(), at)
}

// Worked examples of a victim's cost (docs/architecture.md,
// "Preemption"), with the default settings: grace 30 s, a checkpoint
// of at most 300 s is waited for (its duration + 5 s), restart 60 s per
// GPU, a periodic checkpoint completing within 30 s is waited for. Cost =
// GPU-ms lost + 8 × 60 s restart.

#[test]
fn a_victim_that_can_checkpoint_in_time_loses_only_the_checkpoint_and_gets_its_duration_plus_5_s() {
    // Ran 100 s, never saved. Stopped after the grace it loses
    // 8 × (100 + 30) s; asked to checkpoint (60 s) it loses 8 × 60 s and
    // gets 65 s.
    let (v, at) = victim_after(600, 60, 100_000);
    assert_eq!(v.expected_lost_gpu_ms, 8 * 60_000);
    assert_eq!(v.cost, 8 * 60_000 + 8 * 60_000);
    assert_eq!(v.deadline.millis_since(at), 65_000);
}

#[test]
fn a_checkpoint_that_would_lose_as_much_as_stopping_is_not_waited_for() {
    // Ran 100 s; its checkpoint takes 130 s: either way it loses
    // 8 × 130 s, so it is stopped after the grace.
    let (v, at) = victim_after(600, 130, 100_000);
    assert_eq!(v.expected_lost_gpu_ms, 8 * 130_000);
    assert_eq!(v.deadline.millis_since(at), 30_000);
}

#[test]
fn a_victim_whose_periodic_checkpoint_ends_soon_is_stopped_just_after_it() {
    // A 400 s checkpoint is too long to ask for; but the periodic one that
    // began at 600 s completes at 1000 s. At 970 s that is 30 s away,
    // within the window: it is stopped 1 s after, at 1001 s, losing only
    // the 400 s the checkpoint ran, not 8 × (970 + 30) s.
    let (v, at) = victim_after(600, 400, 970_000);
    assert_eq!(v.expected_lost_gpu_ms, 8 * 400_000);
    assert_eq!(v.deadline.millis_since(at), 31_000);
}

#[test]
fn with_a_longer_window_the_next_periodic_checkpoint_may_be_waited_for() {
    // Checkpoints of 350 s every 400 s; at 790 s the one that began at
    // 400 s is done, the next begins at 800 s and completes at 1150 s. With
    // a window of 15 minutes that is near enough: it is stopped at 1151 s,
    // losing 8 × 350 s rather than 8 × (790 + 30) s.
    let mut cfg = CycleConfig::default();
    cfg.preemption.wait_window_ms = 900_000;
    let (v, at) = victim_under(cfg, 400, 350, 790_000);
    assert_eq!(v.expected_lost_gpu_ms, 8 * 350_000);
    assert_eq!(v.deadline.millis_since(at), 361_000);
}

#[test]
fn a_periodic_checkpoint_that_would_lose_as_much_as_asking_for_one_is_not_waited_for() {
    // A 60 s checkpoint, asked for, loses 8 × 60 s; the periodic one that
    // completes at 660 s (20 s after 640 s) loses the same: the victim is
    // asked, and gets 65 s, not stopped at 661 s.
    let (v, at) = victim_after(600, 60, 640_000);
    assert_eq!(v.expected_lost_gpu_ms, 8 * 60_000);
    assert_eq!(v.deadline.millis_since(at), 65_000);
}

#[test]
fn a_reclaim_in_flight_holds_back_borrowers_not_a_tenant_within_what_it_keeps() {
    // Given owner o lends its 8 GPUs to borrower b, and t keeps its own 8
    // (it lends none), when o returns and b's job is chosen as the victim,
    // then while b stops, t's job within its own quota is admitted and
    // bound at once: the hold on freed quota is for borrowers only.
    let mut d = Driver::default();
    d.cluster(1, 1, 3, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 8));
    d.tenant(tenant("t").cohort("c").quota(FLAVOR, 8).lending(0));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    let borrowed = d.submit(job("b", 1, 8, "node"));
    d.settle();
    assert_eq!(d.job(borrowed).borrowed, 8);
    d.advance(120);
    let owner = d.submit(job("o", 1, 8, "node"));
    let p = plans(&d.run_until_quiet());
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, owner);
    assert_eq!(d.phase(borrowed), Phase::Preempting);
    let own = d.submit(job("t", 1, 8, "node"));
    d.run_until_quiet();
    assert_eq!(d.phase(own), Phase::Bound);
    assert_eq!(d.job(own).borrowed, 0);
    assert_eq!(d.phase(owner), Phase::Queued);
}

#[test]
fn a_victim_preempted_within_the_hour_costs_its_thrash_penalty_whichever_way_it_stops() {
    // The borrower's job was preempted once and runs again; within the
    // hour it is chosen again. Asked for its 60 s checkpoint, or waited for
    // its 400 s periodic one, its cost is what it loses + 8 × 60 s restart
    // + 8 × 600 s thrash penalty.
    for (interval_s, duration_s, ran_ms, lost) in [
        (600, 60, 100_000, 8 * 60_000),
        (600, 400, 970_000, 8 * 400_000),
    ] {
        let mut d = Driver::default();
        d.cluster(1, 1, 1, 8, FLAVOR);
        d.tenant(tenant("owner").cohort("c").quota(FLAVOR, 8));
        d.tenant(tenant("borrower").cohort("c").quota(FLAVOR, 0));
        let b = d.submit(ckpt_job("borrower", 1, 8, "node", interval_s, duration_s));
        d.settle();
        d.advance(120);
        let first = d.submit(job("owner", 1, 8, "node"));
        assert_eq!(plans(&d.run_until_quiet()).len(), 1);
        let at = d.now;
        d.apply(Event::JobPreempted {
            job: b,
            lost_gpu_ms: 0,
            resume_from: None,
            at,
        });
        d.settle();
        d.finish(first);
        d.settle();
        let started = d.job(b).started_at.expect("running again");
        d.advance_to(Timestamp(started.0 + ran_ms));
        d.submit(job("owner", 1, 8, "node"));
        let p = plans(&d.run_until_quiet());
        assert_eq!(p.len(), 1, "{p:?}");
        let v = &p[0].2[0];
        assert_eq!(v.expected_lost_gpu_ms, lost);
        assert_eq!(v.cost, lost + 8 * 60_000 + 8 * 600_000, "{v:?}");
    }
}

/// Owner `o` lends its 16 GPUs (two 8-GPU nodes) to borrower `b`, whose
/// two 1×8 jobs (preemptible or not) have run 2 minutes when returned.
fn lent_twice(preemptible: bool) -> (Driver, [JobId; 2]) {
    let mut d = Driver::default();
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 16));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    let mut spec = job("b", 1, 8, "node");
    spec.preemptible = preemptible;
    let b = [d.submit(spec.clone()), d.submit(spec)];
    d.settle();
    (d, b)
}

#[test]
fn a_cycle_counts_what_its_preemption_stage_did() {
    // One beneficiary, both borrowed jobs looked at, one plan; at the
    // victims' deadline (30 s grace, no checkpoints) both stop.
    let (mut d, _) = lent_twice(true);
    d.advance(120);
    d.submit(job("o", 2, 8, "any"));
    d.cycle(); // accepted; waits for quota
    let s = d.cycle().stats;
    assert_eq!(
        (
            s.preemption.beneficiaries,
            s.preemption.candidates,
            s.preemption.planned,
            s.preemption.preempted
        ),
        (1, 2, 1, 0)
    );
    d.advance(30);
    assert_eq!(d.cycle().stats.preemption.preempted, 2);
}

#[test]
fn a_search_that_failed_is_not_run_again_until_something_it_read_changes() {
    // b's jobs may not be preempted: o's search fails, and the next cycle
    // does not search again; once one of b's jobs ends it does (and needs
    // no victim then).
    let (mut d, b) = lent_twice(false);
    d.advance(120);
    let o = d.submit(job("o", 1, 8, "node"));
    d.cycle(); // accepted; waits for quota
    let s = d.cycle().stats;
    assert_eq!((s.preemption.beneficiaries, s.preemption.planned), (1, 0));
    assert_eq!(d.cycle().stats.preemption.beneficiaries, 0);
    d.finish(b[0]);
    d.run_until_quiet();
    assert_eq!(d.phase(o), Phase::Bound);
}

#[test]
fn a_search_that_failed_for_want_of_old_enough_victims_runs_again_once_they_are() {
    // b's jobs have run 10 s of the 60 s a victim must have run: no plan,
    // and nothing else changes; 60 s later the same search finds them.
    let (mut d, _) = lent_twice(true);
    d.advance(10);
    d.submit(job("o", 1, 8, "node"));
    d.cycle(); // accepted; waits for quota
    let s = d.cycle().stats;
    assert_eq!((s.preemption.beneficiaries, s.preemption.planned), (1, 0));
    d.advance(60);
    let s = d.cycle().stats;
    assert_eq!((s.preemption.beneficiaries, s.preemption.planned), (1, 1));
}

#[test]
fn a_cycle_examines_at_most_max_beneficiaries() {
    let mut cfg = CycleConfig::default();
    cfg.preemption.max_beneficiaries = 1;
    let mut d = Driver::new(cfg);
    d.cluster(1, 1, 2, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 16).best_effort());
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    for _ in 0..2 {
        d.submit(job("b", 1, 8, "node"));
    }
    d.settle();
    d.advance(120);
    for _ in 0..2 {
        d.submit(job("o", 1, 8, "node"));
    }
    d.cycle(); // accepted; they wait for quota
    let s = d.cycle().stats;
    assert_eq!((s.preemption.beneficiaries, s.preemption.planned), (1, 1));
    let s = d.cycle().stats;
    assert_eq!((s.preemption.beneficiaries, s.preemption.planned), (1, 1));
}

#[test]
fn a_held_queue_makes_no_room_for_its_jobs_until_released() {
    // o's job waits for b's jobs to be old enough to be victims; meanwhile
    // o's queue is held: once they are, no room is made for it until the
    // queue is released.
    let (mut d, _) = lent_twice(true);
    d.advance(10);
    d.submit(job("o", 1, 8, "node"));
    assert!(plans(&d.run_until_quiet()).is_empty());
    d.set_queue("o", QueueState::Held);
    d.advance(120);
    assert!(plans(&d.run_until_quiet()).is_empty());
    d.set_queue("o", QueueState::Open);
    assert_eq!(plans(&d.run_until_quiet()).len(), 1);
}

#[test]
fn the_search_report_is_the_search_the_plan_came_from() {
    // What incident review shows: replayed to just before the plan, the
    // report's chosen set is the plan's victims, for o's deficit of 8.
    let (mut d, b) = lent_twice(true);
    d.advance(120);
    let o = d.submit(job("o", 1, 8, "node"));
    d.run_until_quiet();
    let at = d
        .log
        .iter()
        .position(|e| matches!(e, Event::PreemptionPlanned { .. }))
        .expect("a plan");
    let Event::PreemptionPlanned {
        victims, at: when, ..
    } = &d.log[at]
    else {
        unreachable!()
    };
    let mut before = gpusched_core::State::new();
    for e in &d.log[..at] {
        before.apply(e).expect("replays");
    }
    let r = gpusched_core::preemption::search_report(&before, &CycleConfig::default(), o, *when)
        .expect("o waits for room");
    assert_eq!(r.quota_deficit, 8);
    assert_eq!(
        r.candidates.iter().map(|c| c.job).collect::<BTreeSet<_>>(),
        BTreeSet::from(b)
    );
    let chosen = &r.sets[r.chosen.expect("a set chosen")];
    assert!(chosen.suffices);
    assert_eq!(victim_set(&chosen.victims), victim_set(victims));
    // Room on one node is what o needs: the set is named by its node.
    let node = d.job(victims[0].job).assignments[0].node;
    let name = d.state.nodes()[node.index()].spec.name.clone();
    assert_eq!(chosen.domain.as_deref(), Some(name.as_str()));
}

/// One 8-GPU node; o keeps 8 GPUs of nominal quota (it lends none), l
/// lends its 8 and b borrows them, on the only node, in a job old enough
/// to be a victim (returned).
fn quotas_outnumber_the_node() -> (Driver, JobId) {
    let mut d = Driver::default();
    d.cluster(1, 1, 1, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 8).lending(0));
    d.tenant(tenant("l").cohort("c").quota(FLAVOR, 8));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    let borrowed = d.submit(job("b", 1, 8, "node"));
    d.settle();
    d.advance(120);
    (d, borrowed)
}

#[test]
fn an_owner_within_its_nominal_quota_reclaims_room_when_quotas_outnumber_the_nodes() {
    // o's job is within its quota: admitted, it waits for room, and b's
    // job is preempted.
    let (mut d, borrowed) = quotas_outnumber_the_node();
    let own = d.submit(job("o", 1, 8, "node"));
    let p = plans(&d.run_until_quiet());
    assert_eq!(d.phase(own), Phase::Admitted);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, own);
    assert_eq!(victim_set(&p[0].2), BTreeSet::from([borrowed]));
    assert!(matches!(
        p[0].1,
        PreemptionCause::Reclaim {
            quota_deficit: 0,
            ..
        }
    ));
}

#[test]
fn no_room_is_made_for_an_admitted_job_whose_queue_stops() {
    // As above, o's job is admitted and waits for room on b's node; o's
    // queue is stopped before the search: the job goes back to its queue
    // and b's job runs on, no plan made for a job being sent back.
    let (mut d, borrowed) = quotas_outnumber_the_node();
    let own = d.submit(job("o", 1, 8, "node"));
    d.cycle();
    assert_eq!(d.phase(own), Phase::Admitted);
    d.set_queue("o", QueueState::Stopped);
    let events = d.run_until_quiet();
    assert!(plans(&events).is_empty(), "{:?}", plans(&events));
    assert!(events.iter().any(|e| matches!(
        e,
        Event::JobRequeued { job, reason: gpusched_events::RequeueReason::QueueStopped { .. }, .. } if *job == own
    )));
    assert_eq!(d.phase(own), Phase::Queued);
    assert_eq!(d.phase(borrowed), Phase::Running);
}

#[test]
fn a_reclaim_takes_from_each_borrower_no_more_than_it_borrows() {
    // o lends its 16; b keeps its own 8 (lends none) and borrows 8 more in
    // two cheap jobs; c borrows 8 in one dear job (it has run longer,
    // unsaved). o wants all 16 back: one of b's jobs and c's go, not both
    // of b's, cheaper as they are: b would drop below its own quota.
    let mut d = Driver::default();
    d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 16));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 8).lending(0));
    d.tenant(tenant("c").cohort("c").quota(FLAVOR, 0));
    let dear = d.submit(job("c", 1, 8, "node"));
    d.settle();
    d.advance(600);
    let cheap = [
        d.submit(job("b", 1, 8, "node")),
        d.submit(job("b", 1, 8, "node")),
    ];
    d.settle();
    assert_eq!(d.job(cheap[0]).borrowed + d.job(cheap[1]).borrowed, 8);
    d.advance(120);
    d.submit(job("o", 2, 8, "any"));
    let p = plans(&d.run_until_quiet());
    assert_eq!(p.len(), 1, "{p:?}");
    let victims = victim_set(&p[0].2);
    assert_eq!(victims.len(), 2, "{victims:?}");
    assert!(victims.contains(&dear), "{victims:?}");
}

#[test]
fn candidates_are_shared_among_the_borrowers() {
    // max_candidates 5 over two borrowers: 2 of each looked at (5 / 2),
    // not 5 or 10 of each.
    let mut cfg = CycleConfig::default();
    cfg.preemption.max_candidates = 5;
    let mut d = Driver::new(cfg);
    d.cluster(1, 1, 6, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 48));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    d.tenant(tenant("e").cohort("c").quota(FLAVOR, 0));
    for t in ["b", "e"] {
        for _ in 0..3 {
            d.submit(job(t, 1, 8, "node"));
        }
    }
    d.settle();
    d.advance(120);
    d.submit(job("o", 1, 8, "node"));
    d.cycle(); // accepted; waits for quota
    assert_eq!(d.cycle().stats.preemption.candidates, 4);
}

#[test]
fn a_gang_needing_a_whole_block_searches_the_block_of_its_cheapest_candidate_whole() {
    // Two blocks of two 8-GPU nodes, all lent by o to b: b1 (block A, ran
    // longest), b2 and b3 (block B), b4 (block A, ran least). o wants a
    // whole block. With max_candidates 2 only b4 and b3, the two cheapest,
    // are candidates; with max_sets 1 only the domain of the cheapest, b4's
    // block A, is searched whole, which finds b1 beside it: b1 and b4 go.
    let mut cfg = CycleConfig::default();
    cfg.preemption.max_candidates = 2;
    cfg.preemption.max_sets = 1;
    let mut d = Driver::new(cfg);
    let n = d.cluster(1, 2, 2, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 32));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    let mut b = Vec::new();
    for node in [n[0], n[2], n[3], n[1]] {
        b.push(d.place_manually(job("b", 1, 8, "node"), &[(node, 8)]));
        d.advance(100);
    }
    assert_eq!(d.block_of(n[0]), d.block_of(n[1]));
    d.advance(100);
    d.submit(job("o", 2, 8, "block"));
    let p = plans(&d.run_until_quiet());
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(victim_set(&p[0].2), BTreeSet::from([b[0], b[3]]));
}

#[test]
fn of_two_blocks_the_cheaper_set_goes_not_the_block_of_the_cheapest_job() {
    // o wants a whole block. Block A holds the cheapest job (run 100 s)
    // beside the dearest (run 1000 s); block B two that ran 400 s each.
    // A costs 8 × (100 + 1000 + 2 × 30) s, B 8 × (800 + 2 × 30) s: B goes.
    let mut d = Driver::default();
    let n = d.cluster(1, 2, 2, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 32));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    let dear = d.place_manually(job("b", 1, 8, "node"), &[(n[0], 8)]);
    d.advance(600);
    let b_block = [
        d.place_manually(job("b", 1, 8, "node"), &[(n[2], 8)]),
        d.place_manually(job("b", 1, 8, "node"), &[(n[3], 8)]),
    ];
    d.advance(300);
    let cheapest = d.place_manually(job("b", 1, 8, "node"), &[(n[1], 8)]);
    d.advance(100);
    assert_eq!(d.job(dear).unsaved_ms(d.now), 1_000_000);
    assert_eq!(d.job(cheapest).unsaved_ms(d.now), 100_000);
    d.submit(job("o", 2, 8, "block"));
    let p = plans(&d.run_until_quiet());
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(victim_set(&p[0].2), BTreeSet::from(b_block));
}

#[test]
fn a_small_deficit_takes_the_job_that_fills_it_cheapest_not_the_cheapest_per_gpu() {
    // o needs 8 GPUs of quota back (a node is free). b borrows in a 2×8
    // job that ran 400 s and a 1×8 job that ran 600 s. Lost work plus
    // restart: 16 × (430 + 60) s for the big one, 8 × (630 + 60) s for the
    // small. Per GPU the big one is cheaper (490 s < 690 s); per GPU of
    // the 8 o needs it is not (980 s > 690 s): the small one goes.
    let mut d = Driver::default();
    let n = d.cluster(1, 1, 4, 8, FLAVOR);
    d.tenant(tenant("o").cohort("c").quota(FLAVOR, 24));
    d.tenant(tenant("b").cohort("c").quota(FLAVOR, 0));
    let small = d.place_manually(job("b", 1, 8, "node"), &[(n[0], 8)]);
    d.advance(200);
    let big = d.place_manually(job("b", 2, 8, "any"), &[(n[1], 8), (n[2], 8)]);
    d.advance(400);
    d.submit(job("o", 1, 8, "node"));
    let p = plans(&d.run_until_quiet());
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(victim_set(&p[0].2), BTreeSet::from([small]), "not {big}");
}
