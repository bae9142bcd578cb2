//! The reclaim scenario end to end: a borrower fills an idle cluster with
//! checkpointing jobs, the quota owner returns and reclaims. Run with the
//! checkpoint-aware victim order and with Kueue's order as a baseline.
#![allow(clippy::unwrap_used)]

use gpusched_core::{Phase, VictimOrder};
use gpusched_events::{Event, PreemptionCause};
use gpusched_model::{JobId, Timestamp};
use gpusched_sim::{replay, scenario, SimOptions, Simulator};
use std::collections::BTreeMap;

fn run(order: VictimOrder) -> Simulator {
    run_restoring(order, 0)
}

fn run_restoring(order: VictimOrder, restore_ms: u64) -> Simulator {
    let (mut cluster, workload) = scenario::reclaim(1);
    cluster.cycle.preemption.order = order;
    let opts = SimOptions {
        cycle: cluster.cycle,
        until: None,
        record_events: true,
        restore_ms,
    };
    let mut sim = Simulator::new(&cluster, workload, opts).unwrap();
    sim.run(&mut |_| {}).unwrap();
    sim
}

/// Every job finished, and the log replays to the live state.
fn check_complete(sim: &Simulator) {
    let s = sim.state();
    let submitted = sim.workload().items.len() as u64;
    assert_eq!(s.phase_counts().get(Phase::Succeeded), submitted);
    s.check_invariants().unwrap();
    assert_eq!(replay(sim.log()).unwrap().state_hash(), s.state_hash());
}

/// For each reclaim: (beneficiary, planned at, latest victim deadline).
fn reclaims(log: &[Event]) -> Vec<(JobId, Timestamp, Timestamp)> {
    log.iter()
        .filter_map(|e| match e {
            Event::PreemptionPlanned {
                beneficiary,
                cause: PreemptionCause::Reclaim { .. },
                victims,
                at,
                ..
            } => Some((
                *beneficiary,
                *at,
                victims.iter().map(|v| v.deadline).max().unwrap_or(*at),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn owner_reclaims_promptly_and_checkpoint_order_loses_less_than_kueue() {
    let ckpt = run(VictimOrder::Checkpoint);
    let kueue = run(VictimOrder::Kueue);
    check_complete(&ckpt);
    check_complete(&kueue);

    let plans = reclaims(ckpt.log());
    assert!(!plans.is_empty(), "the owner reclaimed nothing");
    // First start of each job after a given time.
    let mut starts: BTreeMap<JobId, Vec<Timestamp>> = BTreeMap::new();
    for e in ckpt.log() {
        if let Event::JobStarted { job, at } = e {
            starts.entry(*job).or_default().push(*at);
        }
    }
    for (owner, at, deadline) in &plans {
        let tenant = &ckpt.state().job(*owner).unwrap().spec.tenant;
        assert_eq!(tenant, "research");
        let grace = deadline.millis_since(*at);
        let started = starts[owner]
            .iter()
            .find(|t| **t >= *at)
            .copied()
            .unwrap_or_else(|| panic!("reclaim beneficiary {owner} never started"));
        assert!(
            started.millis_since(*at) <= grace + 1_000,
            "job {owner} started {} ms after its reclaim was planned; victims' grace {grace} ms",
            started.millis_since(*at)
        );
    }

    // Measured from the moment each was eligible to reclaim, not from its
    // submission: within the grace its victims were given (their checkpoint
    // time included) and one more second.
    let latency: BTreeMap<JobId, u64> = ckpt
        .measurements
        .reclaim_latencies
        .iter()
        .copied()
        .collect();
    for (owner, at, deadline) in &plans {
        let grace = deadline.millis_since(*at);
        assert!(
            latency[owner] <= grace + 1_000,
            "job {owner} started {} ms after it was eligible to reclaim; victims' grace {grace} ms",
            latency[owner]
        );
    }

    let (lc, lk) = (
        ckpt.measurements.lost_gpu_ms,
        kueue.measurements.lost_gpu_ms,
    );
    assert!(kueue.measurements.preemptions > 0 && ckpt.measurements.preemptions > 0);
    assert!(
        2 * lc <= lk,
        "checkpoint order lost {:.1} GPU-hours, Kueue order {:.1}",
        lc as f64 / 3.6e6,
        lk as f64 / 3.6e6
    );
}

/// With a restore time, every resumed run starts that long after its
/// binding (a first run at once), and the goodput accounting counts
/// exactly that as restart: each resumed job's GPUs × the restore time.
#[test]
fn resumed_victims_restore_before_they_start_and_it_counts_as_restart() {
    let restore_ms = 60_000;
    let sim = run_restoring(VictimOrder::Checkpoint, restore_ms);
    check_complete(&sim);
    let mut bound_at: BTreeMap<JobId, Timestamp> = BTreeMap::new();
    let mut runs: BTreeMap<JobId, u32> = BTreeMap::new();
    let mut expected_restart_gpu_ms = 0;
    let mut resumed = 0;
    for e in sim.log() {
        match e {
            Event::JobBound { job, at, .. } => {
                bound_at.insert(*job, *at);
            }
            Event::JobStarted { job, at } => {
                let n = runs.entry(*job).or_default();
                let waited = at.millis_since(bound_at[job]);
                if *n == 0 {
                    assert_eq!(waited, 0, "job {job}'s first run waited {waited} ms");
                } else {
                    assert_eq!(waited, restore_ms, "job {job}'s resumed run");
                    let gpus = sim.state().job(*job).unwrap().spec.total_gpus();
                    expected_restart_gpu_ms += u64::from(gpus) * restore_ms;
                    resumed += 1;
                }
                *n += 1;
            }
            _ => {}
        }
    }
    assert!(resumed > 0, "no victim ran again");
    let g = sim.measurements.goodput.overall();
    assert_eq!(g.restart_gpu_ms, expected_restart_gpu_ms);
    assert_eq!(g.parts_gpu_ms(), g.allocated_gpu_ms);
    // Without one, restart is nothing.
    let instant = run(VictimOrder::Checkpoint);
    assert_eq!(instant.measurements.goodput.overall().restart_gpu_ms, 0);
}

/// A review's re-run of the victim search, on the state just before each
/// logged plan, chooses the victims the plan names, and they are the
/// cheapest of the sets it costed that suffice.
#[test]
fn the_search_run_again_before_a_plan_chooses_what_the_plan_logged() {
    let (cluster, _) = scenario::reclaim(1);
    let sim = run(VictimOrder::Checkpoint);
    let log = sim.log();
    let mut checked = 0;
    for (i, e) in log.iter().enumerate() {
        let Event::PreemptionPlanned {
            beneficiary,
            cause: cause @ PreemptionCause::Reclaim { .. },
            victims,
            at,
            ..
        } = e
        else {
            continue;
        };
        let before = replay(&log[..i]).unwrap();
        let report =
            gpusched_core::preemption::search_report(&before, &cluster.cycle, *beneficiary, *at)
                .unwrap();
        assert_eq!(&report.cause, cause);
        let chosen = &report.sets[report.chosen.unwrap()];
        assert_eq!(&chosen.victims, victims, "plan at event {i}");
        let cheapest = report
            .sets
            .iter()
            .filter(|s| s.suffices)
            .map(|s| s.key)
            .min();
        assert_eq!(Some(chosen.key), cheapest);
        assert_eq!(chosen.key, victims.iter().map(|v| v.cost).sum::<u64>());
        assert!(report.candidates.len() >= victims.len());
        // Every candidate is a 1×8 job on a node of its own: a one-node
        // beneficiary is best served by the cheapest of them, wherever it
        // runs (the search must not cost only some nodes' sets).
        let b = before.job(*beneficiary).unwrap();
        if b.spec.workers == 1 {
            let cheapest = report.candidates.iter().map(|c| c.cost).min();
            assert_eq!(Some(chosen.key), cheapest, "plan at event {i}");
        }
        checked += 1;
    }
    assert!(checked >= 2, "the scenario plans reclaims: {checked}");
}

/// The log's tally, folded beside the state, counts every victim stopped
/// under its plan's cause, the work they lost, and one reclaim latency
/// per owner job that a reclaim was planned for; nothing stays in flight.
#[test]
fn the_tally_counts_the_reclaims_by_cause() {
    let sim = run(VictimOrder::Checkpoint);
    let log = sim.log();
    let mut state = gpusched_core::State::new();
    let mut tally = gpusched_core::LogTally::default();
    for e in log {
        let applied = state.apply(e).is_ok();
        tally.observe(&state, e, applied);
    }
    let preempted: Vec<u64> = log
        .iter()
        .filter_map(|e| match e {
            Event::JobPreempted { lost_gpu_ms, .. } => Some(*lost_gpu_ms),
            _ => None,
        })
        .collect();
    assert_eq!(
        tally.preemptions.get(&("reclaim", "batch".to_string())),
        Some(&(preempted.len() as u64))
    );
    assert_eq!(tally.preemptions.len(), 1, "{:?}", tally.preemptions);
    assert_eq!(
        tally.lost_gpu_ms.get("reclaim"),
        Some(&preempted.iter().sum::<u64>())
    );
    // Every beneficiary of a reclaim plan was eligible to reclaim, and
    // started: each is timed once (others may be timed too: jobs that
    // waited for lent quota that came back without a preemption).
    let beneficiaries: std::collections::BTreeSet<JobId> =
        reclaims(log).iter().map(|r| r.0).collect();
    let mut clock = gpusched_core::ReclaimClock::default();
    let timed: Vec<JobId> = log
        .iter()
        .filter_map(|e| clock.observe(e))
        .map(|(j, _)| j)
        .collect();
    assert!(
        beneficiaries.iter().all(|b| timed.contains(b)),
        "{beneficiaries:?} {timed:?}"
    );
    assert_eq!(tally.reclaim_latency.count(), timed.len() as u64);
    let admitted = log
        .iter()
        .filter(|e| matches!(e, Event::JobAdmitted { .. }))
        .count() as u64;
    assert_eq!(tally.admissions.values().sum::<u64>(), admitted);
    assert_eq!(tally.in_flight(), 0);
}
