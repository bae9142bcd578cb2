//! Explain: why a job waits, computed from the state on demand.
//!
//! Owns: the current pending reason of any waiting job, its position in
//! its queue, and a job's history read from the log with the reason at each
//! step. Stages record a `JobPending` event only for the heads they
//! examine and only when the reason changes; this answers for every job.
//!
//! It speaks the user's words: topology levels as places ("anywhere in
//! the cluster", "in one block"), times relative to now or to the job's
//! submission, never raw epoch numbers. One clock: every time it measures
//! comes from the log (log time, the clock the caller's `now` is in); a
//! duration the job's specification declares (checkpoint interval, max
//! runtime) is stated as a declaration and never set beside a log time, since
//! a simulated agent may play declared durations faster than the log's clock.
//! A waiting job is told what preemption is doing for it: victims stopping
//! and by when, or which borrowers could be taken, which are protected by
//! the minimum runtime and until when, or why none can (`relief`).
//!
//! Must never: estimate a wait time (docs/architecture.md, "Pending reasons, not predictions") or state a start time no
//! reservation guarantees, read a clock (`now` is passed in), or change
//! anything.

mod gantt;
mod log_line;
mod relief;
mod words;

pub use gantt::{gantt, Bar, Gantt, Lane, Mark};
pub use log_line::{log_line, nodes_touched, tenant_touched};
pub use relief::{relief, BorrowerJobs, Relief};

use crate::capacity::CapacityOverlay;
use crate::limits::{CycleConfig, PreemptionConfig};
use crate::quota::{self, QuotaOverlay};
use crate::state::{Phase, State};
use gpusched_events::{
    Assignment, CheckpointRef, Event, EvictionCause, Outcome, PendingReason, PreemptionCause,
    RequeueReason, Victim,
};
use gpusched_model::{Gpus, JobId, Place, QueueingMode, Timestamp, LEVEL_ANY, LEVEL_NODE};
use words::{declared, duration, gpu_hours, offset, ordinal, relative};

/// What explain is told: the moment it speaks at and the rule that decides
/// when a running job may be preempted. Passed in; explain reads no clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// Now, on the log's clock (the one its events' `at` use).
    pub now: Timestamp,
    /// A job runs at least this long before it may be preempted, ms (the
    /// cycle's `PreemptionConfig::min_runtime_ms`).
    pub min_runtime_ms: u64,
}

impl Context {
    /// Now, under the cycle's limits.
    pub fn new(now: Timestamp, cfg: &CycleConfig) -> Self {
        Context {
            now,
            min_runtime_ms: cfg.preemption.min_runtime_ms,
        }
    }

    /// For a caller without a clock: now is the latest time in `events`
    /// or the state knows of the job (the log's own now), under the default
    /// preemption limits.
    pub fn from_log<'a>(
        events: impl IntoIterator<Item = &'a Event>,
        state: &State,
        id: JobId,
    ) -> Self {
        let logged = events.into_iter().filter_map(Event::at).max();
        let known = state.job(id).map(|j| {
            [
                Some(j.submitted_at),
                j.started_at,
                j.ended_at,
                j.preempted_at,
                j.cancel_requested,
                j.last_checkpoint.as_ref().map(|c| c.at),
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or_default()
        });
        Context {
            now: logged.max(known).unwrap_or_default(),
            min_runtime_ms: PreemptionConfig::default().min_runtime_ms,
        }
    }
}

/// Why a waiting job is not running now, if anything stops it; `None` for a
/// job that is not waiting, or that the next cycle would move on.
pub fn pending_reason(state: &State, id: JobId) -> Option<PendingReason> {
    let job = state.job(id)?;
    match job.phase {
        Phase::Queued => {
            if let Some(gate) = gate_reason(job) {
                return Some(gate);
            }
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

/// What keeps a queued job out of its tenant's queue, if anything: a
/// dependency (waiting or failed) or its array's limit.
pub fn gate_reason(job: &crate::state::Job) -> Option<PendingReason> {
    if let Some(dependency) = job.failed_dependency {
        return Some(PendingReason::DependencyFailed { dependency });
    }
    if !job.waiting_on.is_empty() {
        let (after_ok, after) = job
            .waiting_on
            .iter()
            .partition(|d| job.spec.after_ok.contains(d));
        return Some(PendingReason::WaitingForJobs { after_ok, after });
    }
    match job.spec.array {
        Some(a) if !job.array_slot => a.max_running.map(|limit| PendingReason::ArrayLimit {
            array: a.array,
            limit,
        }),
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

/// [`queue_position`] of each of `ids` (`None` for a job not queued), in
/// one pass over the queue of each tenant among them: O(those queues'
/// lengths), however many ids.
pub fn queue_positions(state: &State, ids: &[JobId]) -> Vec<Option<(usize, usize)>> {
    let mut wanted: std::collections::HashMap<JobId, Vec<usize>> = std::collections::HashMap::new();
    let mut tenants: Vec<crate::state::TenantIdx> = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let Some(j) = state.job(*id).filter(|j| j.phase == Phase::Queued) else {
            continue;
        };
        let Some(t) = j.tenant else { continue };
        wanted.entry(*id).or_default().push(i);
        if !tenants.contains(&t) {
            tenants.push(t);
        }
    }
    let mut out = vec![None; ids.len()];
    for t in tenants {
        let pending = &state.tenant(t).pending;
        for (pos, k) in pending.iter().enumerate() {
            for i in wanted.get(&k.job).into_iter().flatten() {
                out[*i] = Some((pos + 1, pending.len()));
            }
        }
    }
    out
}

/// A time as an offset from the job's submission, right-aligned (`  +3 min 20 s`).
fn secs(t: Timestamp, t0: Timestamp) -> String {
    format!("{:>12}", offset(t, t0))
}

/// How a job ended, with its workers' exits when real agents ran it.
fn finished_line(
    at: &str,
    outcome: Outcome,
    exits: &[gpusched_events::WorkerExit],
    reason: Option<&str>,
) -> String {
    let how = match outcome {
        Outcome::Succeeded => "finished: succeeded".to_string(),
        Outcome::Failed => "finished: failed".to_string(),
        Outcome::Cancelled => "stopped by its agent: cancelled".to_string(),
        Outcome::TimedOut => {
            "stopped by its agent: timed out (ran past its declared max runtime)".to_string()
        }
    };
    let mut line = format!("{at} {how}");
    if let Some(r) = reason {
        line.push_str(&format!(" — {r}"));
    }
    // A stopped job's workers were ended on purpose: only a failure's
    // exits explain anything.
    let failed: Vec<String> = exits
        .iter()
        .filter(|e| outcome == Outcome::Failed && e.code != Some(0))
        .map(ToString::to_string)
        .collect();
    if !failed.is_empty() {
        line.push_str(&format!(" ({})", failed.join(", ")));
    }
    line
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

/// Why an eviction was planned, in words.
fn eviction_text(state: &State, c: &EvictionCause) -> String {
    match c {
        EvictionCause::QueueStopped { tenant } => format!("queue {tenant} was stopped"),
        EvictionCause::NodeEvicted { node } => format!(
            "node {} is being emptied for maintenance",
            state
                .nodes()
                .get(node.index())
                .map_or_else(|| node.to_string(), |n| n.spec.name.clone())
        ),
    }
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
/// and the state for names and the current reason. Without a clock of its
/// own it speaks relative to the latest time the log shows
/// (`Context::from_log`); a caller with a clock uses `history_at`.
pub fn history<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    state: &State,
    id: JobId,
) -> Vec<String> {
    let events: Vec<&Event> = events.into_iter().collect();
    let ctx = Context::from_log(events.iter().copied(), state, id);
    history_at(events, state, id, &ctx)
}

/// Where a gang was bound and why, for a `JobBound` line.
fn bound_why(state: &State, id: JobId, level: &str, assignments: &[Assignment]) -> String {
    let domain = assignments
        .first()
        .and_then(|a| {
            let j = state.job(id)?;
            let d = state.capacity().node_domain(a.node, j.level)?;
            Some(state.capacity().domain(d).name.clone())
        })
        .unwrap_or_default();
    match level {
        LEVEL_ANY => "room for the whole gang across the cluster, fullest nodes first".to_string(),
        LEVEL_NODE => "the fullest node with room for the whole gang".to_string(),
        l if domain.is_empty() => format!("the fullest {l} with room for the whole gang"),
        l => format!("the fullest {l} with room for the whole gang ({domain})"),
    }
}

/// A job's history from the log, as `history`, speaking at `ctx.now`.
pub fn history_at<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    state: &State,
    id: JobId,
    ctx: &Context,
) -> Vec<String> {
    let events: Vec<&Event> = events.into_iter().collect();
    let now_t = ctx.now;
    let t0 = events
        .iter()
        .find_map(|e| match e {
            Event::JobSubmitted { job, at, .. } if *job == id => Some(*at),
            _ => None,
        })
        .or_else(|| state.job(id).map(|j| j.submitted_at))
        .unwrap_or(now_t);
    let secs = |t: Timestamp| secs(t, t0);
    let mut out = Vec::new();
    let mut level = state
        .job(id)
        .map_or_else(String::new, |j| j.spec.topology.clone());
    // The cause of the latest preemption planned for this job.
    let mut cause: Option<String> = None;
    // Consecutive checkpoints are shown as one line: how many, and the last.
    let mut checkpoints: Option<(u32, Timestamp, u64, String)> = None;
    let flush = |out: &mut Vec<String>, c: &mut Option<(u32, Timestamp, u64, String)>| {
        if let Some((n, at, progress_ms, uri)) = c.take() {
            out.push(checkpoints_line(&secs(at), n, progress_ms, &uri));
        }
    };
    for e in events.iter().copied() {
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
        if e.job() == Some(id)
            || matches!(
                e,
                Event::PreemptionPlanned { .. } | Event::EvictionPlanned { .. }
            )
        {
            flush(&mut out, &mut checkpoints);
        }
        let line = match e {
            Event::JobSubmitted { job, spec, at } if *job == id => {
                level = spec.topology.clone();
                submitted_line(&secs(*at), spec)
            }
            Event::JobAccepted { job } if *job == id => accepted_line(state, id),
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
            } if *job == id => admitted_line(&secs(*at), flavor, *borrowed),
            Event::ReservationMade {
                job,
                assignments,
                start,
                at,
            } if *job == id => reserved_line(state, &secs(*at), assignments, *start, t0),
            Event::JobBound {
                job,
                assignments,
                backfill_for,
                at,
            } if *job == id => {
                bound_line(state, id, &level, &secs(*at), assignments, *backfill_for)
            }
            Event::JobStarted { job, at } if *job == id => format!("{} started", secs(*at)),
            Event::PreemptionPlanned {
                beneficiary,
                cause: c,
                victims,
                at,
                ..
            } => {
                if *beneficiary == id {
                    cause = Some(cause_text(c));
                }
                match plan_line(id, &secs(*at), *beneficiary, c, victims, t0) {
                    Some(line) => line,
                    None => continue,
                }
            }
            Event::EvictionPlanned { cause, victims, at } => {
                match evicted_line(state, id, &secs(*at), cause, victims, *at) {
                    Some(line) => line,
                    None => continue,
                }
            }
            Event::JobPreempted {
                job,
                lost_gpu_ms,
                resume_from,
                at,
            } if *job == id => preempted_line(&secs(*at), *lost_gpu_ms, resume_from.as_ref()),
            Event::JobRequeued {
                job,
                reason,
                lost_gpu_ms,
                at,
            } if *job == id => requeued_line(state, &secs(*at), reason, *lost_gpu_ms),
            Event::JobFinished {
                job,
                outcome,
                at,
                exits,
                reason,
            } if *job == id => finished_line(&secs(*at), *outcome, exits, reason.as_deref()),
            Event::JobCancelled { job, at } if *job == id => format!("{} cancelled", secs(*at)),
            Event::JobDependencyFailed {
                job,
                dependency,
                at,
            } if *job == id => dependency_failed_line(state, &secs(*at), *dependency),
            Event::JobCancelRequested { job, at } if *job == id => {
                cancel_requested_line(state, id, &secs(*at))
            }
            _ => continue,
        };
        out.push(line);
    }
    flush(&mut out, &mut checkpoints);
    out.extend(gpu_hours_lines(&events, id, ctx.now));
    out.push(now_line(state, id, ctx, cause.as_deref()));
    out
}

/// The history's admission line: where quota was charged, and whether
/// borrowed.
fn admitted_line(at: &str, flavor: &str, borrowed: Gpus) -> String {
    let how = if borrowed > 0 {
        format!(", {borrowed} GPUs borrowed from the cohort")
    } else {
        ", within nominal quota".to_string()
    };
    format!("{at} admitted: quota charged in {flavor}{how}")
}

/// The history's binding line: the nodes, and why there.
fn bound_line(
    state: &State,
    id: JobId,
    level: &str,
    at: &str,
    assignments: &[Assignment],
    backfill_for: Option<JobId>,
) -> String {
    let why = match backfill_for {
        Some(o) => format!("backfilled onto nodes reserved for job {o}: it ends before that reservation starts or leaves when it does"),
        None => bound_why(state, id, level, assignments),
    };
    format!("{at} bound to {}: {why}", node_list(state, assignments))
}

/// The history's line for an eviction plan that chose the job; `None`
/// where it did not.
fn evicted_line(
    state: &State,
    id: JobId,
    at: &str,
    cause: &EvictionCause,
    victims: &[Victim],
    planned_at: Timestamp,
) -> Option<String> {
    let v = victims.iter().find(|v| v.job == id)?;
    Some(format!(
        "{at} chosen to be evicted: {}; it is asked for a checkpoint and stops {} at the latest (expected loss {})",
        eviction_text(state, cause),
        relative(v.deadline, planned_at),
        gpu_hours(v.expected_lost_gpu_ms)
    ))
}

/// The history's line for a job cancelled because a job it runs after
/// (after_ok) ended without succeeding.
fn dependency_failed_line(state: &State, at: &str, dependency: JobId) -> String {
    format!(
        "{at} cancelled: job {dependency}, which it runs after (after_ok), ended {}",
        state
            .job(dependency)
            .map_or("without succeeding", |d| d.phase.name())
    )
}

/// The history's line for a cancellation asked of a running job.
fn cancel_requested_line(state: &State, id: JobId, at: &str) -> String {
    let how = match state.job(id).and_then(|j| j.spec.checkpoint) {
        Some(_) => " after a final checkpoint",
        None => " (no checkpoint policy: the work since its start is lost)",
    };
    format!("{at} cancel requested: its agent stops it{how}")
}

/// The history's acceptance line: into its tenant's queue, or first to
/// wait for its dependencies or its array's limit.
fn accepted_line(state: &State, id: JobId) -> String {
    let spec = state.job(id).map(|j| &j.spec);
    let deps: Vec<String> = spec
        .into_iter()
        .flat_map(|s| s.dependencies())
        .map(|(j, kind)| format!("job {j} ({})", kind.field()))
        .collect();
    let limit = spec.and_then(|s| s.array).and_then(|a| a.max_running);
    let mut waits = Vec::new();
    if !deps.is_empty() {
        waits.push(format!("for {}", deps.join(", ")));
    }
    if let Some(n) = limit {
        waits.push(format!("for one of its array's {n} slots"));
    }
    match waits.is_empty() {
        true => "             accepted into its tenant's queue".to_string(),
        false => format!(
            "             accepted; it joins its tenant's queue once it is through waiting {}",
            waits.join(" and ")
        ),
    }
}

/// Where the job's GPU-hours went so far and how long its GPUs waited
/// (`goodput`), when it has held or waited for any.
fn gpu_hours_lines(events: &[&Event], id: JobId, now: Timestamp) -> Vec<String> {
    let Some(acc) = crate::goodput::job_account(id, events.iter().copied(), Some(now)) else {
        return Vec::new();
    };
    if acc.allocated_gpu_ms == 0 && acc.wait_total_gpu_ms() == 0 {
        return Vec::new();
    }
    let [work, wait] = acc.summary().lines();
    vec![
        format!("GPU-hours so far: {work}"),
        format!("GPU-hours so far: {wait}"),
    ]
}

/// A `JobSubmitted` line: the shape, where, priority, what it declares.
fn submitted_line(at: &str, spec: &gpusched_model::JobSpec) -> String {
    let mut declares = Vec::new();
    if let Some(c) = spec.checkpoint {
        declares.push(format!(
            "a checkpoint every {} (each takes {})",
            declared(c.interval_s),
            declared(c.duration_s)
        ));
    }
    if let Some(m) = spec.max_runtime_s {
        declares.push(format!("a max runtime of {}", declared(m)));
    }
    let declares = if declares.is_empty() {
        String::new()
    } else {
        format!("; declares {}", declares.join(" and "))
    };
    let task = spec.array.map_or(String::new(), |a| {
        format!(" as task {} of array {}", a.index, a.array)
    });
    format!(
        "{} submitted{task} to {}: {}×{} GPUs {}, priority {}{}{}",
        at,
        spec.tenant,
        spec.workers,
        spec.gpus_per_worker,
        Place::of(&spec.topology).within(),
        spec.priority,
        if spec.preemptible {
            ", preemptible"
        } else {
            ", not preemptible"
        },
        declares
    )
}

/// Consecutive checkpoints as one line: how many, and the last.
fn checkpoints_line(at: &str, n: u32, progress_ms: u64, uri: &str) -> String {
    let many = if n > 1 {
        format!(" ({n} checkpoints since the last step)")
    } else {
        String::new()
    };
    format!(
        "{at} checkpoint complete: {} of work saved ({uri}){many}",
        duration(progress_ms)
    )
}

/// A `ReservationMade` line: the nodes, and a start only where guaranteed.
fn reserved_line(
    state: &State,
    at: &str,
    assignments: &[Assignment],
    start: Option<Timestamp>,
    t0: Timestamp,
) -> String {
    format!(
        "{at} reserved {} for it, {}",
        node_list(state, assignments),
        match start {
            Some(t) => format!(
                "guaranteed free at {} (by the running jobs' max runtimes)",
                offset(t, t0)
            ),
            None => "start unknown: a job in the way declares no max runtime".to_string(),
        }
    )
}

/// A `PreemptionPlanned` line for the job: its beneficiary's or a
/// victim's; `None` for a plan that does not name it.
fn plan_line(
    id: JobId,
    at: &str,
    beneficiary: JobId,
    c: &PreemptionCause,
    victims: &[gpusched_events::Victim],
    t0: Timestamp,
) -> Option<String> {
    if beneficiary == id {
        let names: Vec<String> = victims.iter().map(|v| v.job.to_string()).collect();
        return Some(format!(
            "{at} preemption planned for it ({}): victims {} (least work lost since their last checkpoints)",
            cause_text(c),
            names.join(", ")
        ));
    }
    let v = victims.iter().find(|v| v.job == id)?;
    Some(format!(
        "{at} chosen as a victim for job {beneficiary} ({}): expected loss {}, cost {}; stops by {} at the latest, or on its next complete checkpoint",
        cause_text(c),
        gpu_hours(v.expected_lost_gpu_ms),
        gpu_hours(v.cost),
        offset(v.deadline, t0)
    ))
}

/// A `JobPreempted` line: what it lost and where it resumes from.
fn preempted_line(at: &str, lost_gpu_ms: u64, resume_from: Option<&CheckpointRef>) -> String {
    format!(
        "{at} preempted: lost {} since its last complete checkpoint; resumes {}",
        gpu_hours(lost_gpu_ms),
        match resume_from {
            Some(c) => format!(
                "from {} at {} of work, on the same flavor and shape",
                c.uri,
                duration(c.progress_ms)
            ),
            None => "from scratch (no complete checkpoint)".to_string(),
        }
    )
}

/// A `JobRequeued` line: the node lost, and the work with it; or the
/// quota given back when its queue was stopped.
fn requeued_line(state: &State, at: &str, reason: &RequeueReason, lost_gpu_ms: u64) -> String {
    let node = match reason {
        RequeueReason::NodeLost { node } => node,
        RequeueReason::QueueStopped { tenant } => {
            return format!(
                "{at} back in its queue: queue {tenant} was stopped before it was placed; its quota is given back"
            )
        }
    };
    let name = state
        .nodes()
        .get(node.index())
        .map_or_else(|| node.to_string(), |n| n.spec.name.clone());
    format!(
        "{at} requeued: node {name} was lost; lost {}",
        gpu_hours(lost_gpu_ms)
    )
}

/// For a queued job waiting on quota (`reason`, its [`pending_reason`]) in
/// a cohort that keeps use with a half-life: its tenant's decayed use and
/// its place among the cohort's borrowers, the order in which borrowable
/// quota goes to them.
pub fn fair_share_standing(
    state: &State,
    id: JobId,
    reason: Option<&PendingReason>,
    now: Timestamp,
) -> Option<String> {
    let job = state.job(id)?;
    let waits_on_quota = matches!(
        reason,
        Some(PendingReason::QuotaExceeded { .. } | PendingReason::CohortExhausted { .. })
    );
    let t = job
        .tenant
        .filter(|_| job.phase == Phase::Queued && waits_on_quota)?;
    let c = state.tenant(t).cohort?;
    let cohort = state.cohort(c);
    let half_life = cohort.half_life_ms();
    if half_life == 0 {
        return None;
    }
    let order = quota::borrower_order(state, c, now);
    let place = order.iter().position(|(m, _)| *m == t)? + 1;
    let decayed = state.decayed_use(t, now);
    let tenant = state.tenant(t);
    let used: Vec<String> = tenant
        .flavor_order
        .iter()
        .map(|&f| {
            format!(
                "{:.1} {}",
                decayed.mean_gpus(f as usize, half_life),
                state.flavor_name(f)
            )
        })
        .collect();
    Some(format!(
        "cohort {} serves borrowers by use decayed with a half-life of {}: {} has used {} GPUs (mean, recent use counting more), weight {}, {} of {} in line",
        cohort.name,
        declared(cohort.usage_half_life_s),
        tenant.spec.name,
        used.join(", "),
        tenant.spec.weight,
        ordinal(place),
        order.len()
    ))
}

/// For a queued job, its tenant's GPU-hour budget in each flavor the job
/// may use: what is used and left this period, when the period renews,
/// and, once spent, what that means for the job.
pub fn budget_standing(state: &State, id: JobId, now: Timestamp) -> Option<String> {
    let job = state.job(id).filter(|j| j.phase == Phase::Queued)?;
    let tenant = state.tenant(job.tenant?);
    let lines: Vec<String> = job
        .flavors
        .iter()
        .filter_map(|&f| {
            let l = tenant.budget(f)?;
            let b = l.budget;
            let used = l.used_at(tenant.used(f).get(), now);
            let renews = relative(b.period.next_start(now.max(l.at)), now);
            let flavor = state.flavor_name(f);
            let standing = match (l.is_spent(), tenant.budget_holds(f)) {
                (false, _) => format!(
                    "{} of {} used this {}, {} left; renews {renews}",
                    gpu_hours(used),
                    b.gpu_hours,
                    b.period.name(),
                    gpu_hours(l.left_at(tenant.used(f).get(), now))
                ),
                (true, true) => format!(
                    "spent ({} GPU-hours this {}): its jobs wait until it renews {renews}",
                    b.gpu_hours,
                    b.period.name()
                ),
                (true, false) => format!(
                    "spent ({} GPU-hours this {}): until it renews {renews} its jobs run only on quota the cohort lends, and are the first a returning owner reclaims",
                    b.gpu_hours,
                    b.period.name()
                ),
            };
            Some(format!("{}'s budget in {flavor}: {standing}", tenant.spec.name))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// Where the job stands at `ctx.now`: its phase, why it waits, what
/// preemption does for it, and a start time only where a reservation
/// guarantees one.
fn now_line(state: &State, id: JobId, ctx: &Context, cause: Option<&str>) -> String {
    let Some(job) = state.job(id) else {
        return format!("no job {id}");
    };
    let mut now = format!("now: {:?}", job.phase);
    let reason = pending_reason(state, id);
    if let Some(r) = &reason {
        now.push_str(&format!("; waiting because {r}"));
    }
    if let Some(r) = relief(state, id, ctx) {
        now.push_str(&format!("; {}", r.describe(ctx.now, cause)));
    }
    if job.phase == Phase::Queued {
        let queue = job.tenant.map(|t| state.tenant(t).queue);
        if let Some(q) = queue.filter(|q| !q.admits()) {
            now.push_str(&format!(
                "; its queue is {q}: nothing is admitted until an admin releases it"
            ));
        }
    }
    if let Some((deadline, beneficiary)) = job.preempt {
        let when = if deadline > ctx.now {
            format!("{} at the latest", relative(deadline, ctx.now))
        } else {
            "now (its deadline has passed)".to_string()
        };
        let why = match beneficiary {
            Some(b) => format!("stopping for job {b}"),
            None => "being evicted".to_string(),
        };
        now.push_str(&format!(
            "; {why}: it stops {when}, or on its next complete checkpoint"
        ));
    }
    if let Some(other) = reservation_ahead(state, id) {
        now.push_str(&format!(
            "; GPUs of its flavor are reserved for job {other} ahead of it (backfill only where it ends in time)"
        ));
    }
    if let Some((pos, len)) = queue_position(state, id) {
        now.push_str(&format!("; position {pos} of {len} in its queue"));
    }
    if let Some(standing) = fair_share_standing(state, id, reason.as_ref(), ctx.now) {
        now.push_str(&format!("; {standing}"));
    }
    if let Some(budget) = budget_standing(state, id, ctx.now) {
        now.push_str(&format!("; {budget}"));
    }
    if matches!(job.phase, Phase::Queued | Phase::Admitted) {
        match state.reservations().get(&id).and_then(|r| r.start) {
            Some(t) if t > ctx.now => now.push_str(&format!(
                "; a reservation guarantees a start {}",
                relative(t, ctx.now)
            )),
            Some(t) => now.push_str(&format!(
                "; a reservation guarantees a start, due {}",
                relative(t, ctx.now)
            )),
            None => now.push_str("; no start time: no reservation guarantees one"),
        }
    }
    now
}
