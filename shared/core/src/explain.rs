//! Explain: why a job waits, computed from the state on demand.
//!
//! Owns: the current pending reason of any waiting job, its position in
//! its queue, and a job's history read from the log with the reason at each
//! step. Stages record a `JobPending` event only for the heads they
//! examine and only when the reason changes; this answers for every job.
//!
//! Must never: estimate a wait time (BRIEF §6), or change anything.

use crate::capacity::CapacityOverlay;
use crate::quota::{self, QuotaOverlay};
use crate::state::{Phase, State};
use gpusched_events::{Assignment, Event, Outcome, PendingReason, PreemptionCause, RequeueReason};
use gpusched_model::{JobId, QueueingMode, Timestamp};

/// Why a waiting job is not running now, if anything stops it; `None` for a
/// job that is not waiting, or that the next cycle would move on.
pub fn pending_reason(state: &State, id: JobId) -> Option<PendingReason> {
    let job = state.job(id)?;
    match job.phase {
        Phase::Queued => {
            let t = job.tenant?;
            let tenant = state.tenant(t);
            if tenant.spec.queueing == QueueingMode::StrictFifo {
                if let Some(head) = tenant.pending.first() {
                    if head.job != id {
                        let head_job = state.job(head.job)?;
                        if quota::choose_flavor(state, &QuotaOverlay::default(), head_job).is_err()
                        {
                            return Some(PendingReason::BehindHead { head: head.job });
                        }
                    }
                }
            }
            quota::choose_flavor(state, &QuotaOverlay::default(), job)
                .err()
                .map(|b| b.reason(state))
        }
        Phase::Admitted => {
            let f = job.flavor?;
            let cap = state.capacity();
            let none = CapacityOverlay::default();
            let mut probes = 0;
            let (w, g) = (job.spec.workers, job.spec.gpus_per_worker);
            if cap
                .find_domain(&none, f, job.level, w, g, &mut probes)
                .is_some()
            {
                return None;
            }
            Some(PendingReason::NoDomainFits {
                flavor: state.flavor_name(f).to_string(),
                level: state.level_name(job.level).to_string(),
                workers: w,
                gpus_per_worker: g,
                largest_free: cap.largest_free(&none, f, job.level),
            })
        }
        _ => None,
    }
}

/// Another job holding a reservation on nodes of this waiting job's flavor
/// (the earliest-made one): GPUs held ahead of it that backfill may not
/// take. Costs O(reservations).
pub fn reservation_ahead(state: &State, id: JobId) -> Option<JobId> {
    let job = state.job(id)?;
    if !matches!(job.phase, Phase::Queued | Phase::Admitted) {
        return None;
    }
    let flavors: Vec<_> = match job.flavor {
        Some(f) => vec![f],
        None => job.flavors.clone(),
    };
    state
        .reservations()
        .iter()
        .filter(|(other, _)| **other != id)
        .filter(|(_, r)| {
            r.assignments.iter().any(|a| {
                state
                    .nodes()
                    .get(a.node.index())
                    .is_some_and(|n| flavors.contains(&n.flavor))
            })
        })
        .min_by_key(|(other, r)| (r.made_at, **other))
        .map(|(other, _)| *other)
}

/// A queued job's 1-based position in its tenant's queue and the queue's
/// length. Costs O(position).
pub fn queue_position(state: &State, id: JobId) -> Option<(usize, usize)> {
    let job = state.job(id)?;
    if job.phase != Phase::Queued {
        return None;
    }
    let tenant = state.tenant(job.tenant?);
    let pos = tenant.pending.iter().position(|k| k.job == id)? + 1;
    Some((pos, tenant.pending.len()))
}

/// A time as an offset from the job's submission (`+12.5 s`).
fn secs(t: Timestamp, t0: Timestamp) -> String {
    let d = t.0 as f64 / 1000.0 - t0.0 as f64 / 1000.0;
    format!("{:>+10.1} s", d)
}

fn gpu_hours(gpu_ms: u64) -> String {
    format!("{:.2} GPU-hours", gpu_ms as f64 / 3_600_000.0)
}

fn node_list(state: &State, a: &[Assignment]) -> String {
    a.iter()
        .map(|x| {
            let name = state
                .nodes()
                .get(x.node.index())
                .map_or_else(|| x.node.to_string(), |n| n.spec.name.clone());
            format!("{name}:{}", x.gpus)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn cause_text(c: &PreemptionCause) -> String {
    match c {
        PreemptionCause::Reclaim {
            tenant,
            flavor,
            quota_deficit,
        } => format!("tenant {tenant} reclaims {quota_deficit} GPUs of its lent {flavor} quota"),
        PreemptionCause::Priority { tenant, flavor } => {
            format!("a higher-priority job of {tenant} needs {flavor} GPUs")
        }
        PreemptionCause::Reservation => "the reservation it backfilled is due".to_string(),
    }
}

/// A job's history from the log, one line per step, each with the reason
/// the scheduler had; then where it stands now. Reads `events` in order
/// and the state for names and the current reason.
pub fn history<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    state: &State,
    id: JobId,
) -> Vec<String> {
    let events: Vec<&Event> = events.into_iter().collect();
    let t0 = events
        .iter()
        .find_map(|e| match e {
            Event::JobSubmitted { job, at, .. } if *job == id => Some(*at),
            _ => None,
        })
        .unwrap_or(Timestamp(0));
    let secs = |t: Timestamp| secs(t, t0);
    let mut out = Vec::new();
    let mut level = String::new();
    // Consecutive checkpoints are shown as one line: how many, and the last.
    let mut checkpoints: Option<(u32, Timestamp, u64, String)> = None;
    let flush = |out: &mut Vec<String>, c: &mut Option<(u32, Timestamp, u64, String)>| {
        if let Some((n, at, progress_ms, uri)) = c.take() {
            let many = if n > 1 {
                format!(" ({n} checkpoints since the last step)")
            } else {
                String::new()
            };
            out.push(format!(
                "{} checkpoint complete: {:.0} s of work saved ({uri}){many}",
                secs(at),
                progress_ms as f64 / 1000.0
            ));
        }
    };
    for e in events {
        if let Event::JobCheckpointed {
            job,
            progress_ms,
            uri,
            at,
        } = e
        {
            if *job == id {
                let n = checkpoints.as_ref().map_or(0, |c| c.0);
                checkpoints = Some((n + 1, *at, *progress_ms, uri.clone()));
                continue;
            }
        }
        if e.job() == Some(id) || matches!(e, Event::PreemptionPlanned { .. }) {
            flush(&mut out, &mut checkpoints);
        }
        let line = match e {
            Event::JobSubmitted { job, spec, at } if *job == id => {
                level = spec.topology.clone();
                let ckpt = spec.checkpoint.map_or(String::new(), |c| {
                    format!(
                        ", checkpoints every {} s ({} s each)",
                        c.interval_s, c.duration_s
                    )
                });
                let max = spec
                    .max_runtime_s
                    .map_or(String::new(), |m| format!(", max runtime {m} s"));
                format!(
                    "{} submitted to {}: {}×{} GPUs in one {}, priority {}{}{}{}",
                    secs(*at),
                    spec.tenant,
                    spec.workers,
                    spec.gpus_per_worker,
                    spec.topology,
                    spec.priority,
                    if spec.preemptible {
                        ", preemptible"
                    } else {
                        ", not preemptible"
                    },
                    ckpt,
                    max
                )
            }
            Event::JobAccepted { job } if *job == id => {
                "             accepted into its tenant's queue".to_string()
            }
            Event::JobRejected { job, reason } if *job == id => {
                format!("             rejected: {reason}")
            }
            Event::JobPending { job, reason, at } if *job == id => {
                format!("{} waiting: {reason}", secs(*at))
            }
            Event::JobAdmitted {
                job,
                flavor,
                borrowed,
                at,
            } if *job == id => format!(
                "{} admitted: quota charged in {flavor}{}",
                secs(*at),
                if *borrowed > 0 {
                    format!(", {borrowed} GPUs borrowed from the cohort")
                } else {
                    ", within nominal quota".to_string()
                }
            ),
            Event::ReservationMade {
                job,
                assignments,
                start,
                at,
            } if *job == id => format!(
                "{} reserved {} for it, {}",
                secs(*at),
                node_list(state, assignments),
                match start {
                    Some(t) => format!(
                        "guaranteed free by {} s (running jobs' max runtimes)",
                        t.as_secs()
                    ),
                    None => "start unknown: a job in the way declares no max runtime".to_string(),
                }
            ),
            Event::JobBound {
                job,
                assignments,
                backfill_for,
                at,
            } if *job == id => {
                let domain = assignments
                    .first()
                    .and_then(|a| {
                        let j = state.job(id)?;
                        let d = state.capacity().node_domain(a.node, j.level)?;
                        Some(state.capacity().domain(d).name.clone())
                    })
                    .unwrap_or_default();
                let why = match backfill_for {
                    Some(o) => format!("backfilled onto nodes reserved for job {o}: it ends before that reservation starts or leaves when it does"),
                    None => format!("the fullest {level} with room for the whole gang ({domain})"),
                };
                format!(
                    "{} bound to {}: {why}",
                    secs(*at),
                    node_list(state, assignments)
                )
            }
            Event::JobStarted { job, at } if *job == id => format!("{} started", secs(*at)),
            Event::PreemptionPlanned {
                beneficiary,
                cause,
                victims,
                at,
                ..
            } => {
                if *beneficiary == id {
                    let names: Vec<String> = victims.iter().map(|v| v.job.to_string()).collect();
                    format!(
                        "{} preemption planned for it ({}): victims {} (least work lost since their last checkpoints)",
                        secs(*at),
                        cause_text(cause),
                        names.join(", ")
                    )
                } else if let Some(v) = victims.iter().find(|v| v.job == id) {
                    format!(
                        "{} chosen as a victim for job {beneficiary} ({}): cost {:.0} GPU·s, expected loss {}; stops at {:.0} s or on its next complete checkpoint",
                        secs(*at),
                        cause_text(cause),
                        v.cost as f64 / 1000.0,
                        gpu_hours(v.expected_lost_gpu_ms),
                        v.deadline.as_secs_f64()
                    )
                } else {
                    continue;
                }
            }
            Event::JobPreempted {
                job,
                lost_gpu_ms,
                resume_from,
                at,
            } if *job == id => format!(
                "{} preempted: lost {} since its last complete checkpoint; resumes {}",
                secs(*at),
                gpu_hours(*lost_gpu_ms),
                match resume_from {
                    Some(c) => format!(
                        "from {} at {:.0} s of work, on the same flavor and shape",
                        c.uri,
                        c.progress_ms as f64 / 1000.0
                    ),
                    None => "from scratch (no complete checkpoint)".to_string(),
                }
            ),
            Event::JobRequeued {
                job,
                reason,
                lost_gpu_ms,
                at,
            } if *job == id => {
                let RequeueReason::NodeLost { node } = reason;
                let name = state
                    .nodes()
                    .get(node.index())
                    .map_or_else(|| node.to_string(), |n| n.spec.name.clone());
                format!(
                    "{} requeued: node {name} was lost; lost {}",
                    secs(*at),
                    gpu_hours(*lost_gpu_ms)
                )
            }
            Event::JobFinished { job, outcome, at } if *job == id => match outcome {
                Outcome::Cancelled => format!("{} stopped by its agent: cancelled", secs(*at)),
                _ => format!("{} finished: {outcome:?}", secs(*at)),
            },
            Event::JobCancelled { job, at } if *job == id => format!("{} cancelled", secs(*at)),
            Event::JobCancelRequested { job, at } if *job == id => format!(
                "{} cancel requested: its agent stops it{}",
                secs(*at),
                match state.job(id).and_then(|j| j.spec.checkpoint) {
                    Some(_) => " after a final checkpoint",
                    None => " (no checkpoint policy: the work since its start is lost)",
                }
            ),
            _ => continue,
        };
        out.push(line);
    }
    flush(&mut out, &mut checkpoints);
    if let Some(job) = state.job(id) {
        let mut now = format!("now: {:?}", job.phase);
        if let Some(r) = pending_reason(state, id) {
            now.push_str(&format!("; waiting because {r}"));
        }
        if let Some(other) = reservation_ahead(state, id) {
            now.push_str(&format!(
                "; GPUs of its flavor are reserved for job {other} ahead of it (backfill only where it ends in time)"
            ));
        }
        if let Some((pos, len)) = queue_position(state, id) {
            now.push_str(&format!("; position {pos} of {len} in its queue"));
        }
        if matches!(job.phase, Phase::Queued | Phase::Admitted) {
            match state.reservations().get(&id).and_then(|r| r.start) {
                Some(t) => now.push_str(&format!(
                    "; a reservation guarantees a start by {} s",
                    t.as_secs()
                )),
                None => now.push_str("; no start time: no reservation guarantees one"),
            }
        }
        out.push(now);
    } else {
        out.push(format!("no job {id}"));
    }
    out
}
