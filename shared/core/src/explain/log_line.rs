//! One logged event as a line of an incident timeline, and what it touches.
//!
//! Owns: how any event reads on its own, beside events of other jobs and
//! nodes (node names, not ids; GPU-hours, not GPU-milliseconds), and which
//! jobs, nodes and tenant an event concerns, read against the state just
//! before it. A job's own story, with the reason at each step, is
//! `explain::history`'s.
//!
//! Must never: read a clock, or change anything.

use super::words::{duration, gpu_hours};
use super::{cause_text, eviction_text, node_list};
use crate::state::State;
use gpusched_events::{Event, EvictionCause, Outcome, RequeueReason};
use gpusched_model::NodeId;

/// The event in one line, with names from `before` (the state just before
/// it was folded).
pub fn log_line(before: &State, ev: &Event) -> String {
    let line = match ev {
        Event::TopologyConfigured { .. }
        | Event::TenantConfigured { .. }
        | Event::CohortConfigured { .. }
        | Event::QueueStateSet { .. }
        | Event::BudgetSpent { .. }
        | Event::BudgetRenewed { .. } => settings_line(before, ev),
        Event::NodeAdded { .. }
        | Event::NodeCordoned { .. }
        | Event::NodeUncordoned { .. }
        | Event::NodeDrained { .. }
        | Event::NodeLost { .. }
        | Event::NodeRejoined { .. }
        | Event::NodeEvicted { .. } => node_line(before, ev),
        Event::PreemptionPlanned { .. }
        | Event::EvictionPlanned { .. }
        | Event::JobPreempted { .. }
        | Event::JobCheckpointed { .. }
        | Event::ReservationMade { .. } => decision_line(before, ev),
        Event::JobSubmitted { .. }
        | Event::JobAccepted { .. }
        | Event::JobRejected { .. }
        | Event::JobAdmitted { .. }
        | Event::JobPending { .. }
        | Event::JobBound { .. }
        | Event::JobStarted { .. }
        | Event::JobFinished { .. }
        | Event::JobCancelled { .. }
        | Event::JobCancelRequested { .. }
        | Event::JobRequeued { .. }
        | Event::JobDependencyFailed { .. } => job_line(before, ev),
    };
    line.unwrap_or_default()
}

/// A node's name in `before`, or its id where it has none there.
fn node(before: &State, n: &NodeId) -> String {
    before
        .nodes()
        .get(n.index())
        .map_or_else(|| n.to_string(), |x| x.spec.name.clone())
}

/// A settings event (topology, tenant, cohort, queue, budget) in one line.
fn settings_line(before: &State, ev: &Event) -> Option<String> {
    let line = match ev {
        Event::TopologyConfigured { levels } => format!("topology levels {}", levels.join(" > ")),
        Event::TenantConfigured { spec } => {
            let quotas: Vec<String> = spec
                .quotas
                .iter()
                .map(|q| format!("{} {}", q.flavor, q.nominal))
                .collect();
            format!(
                "tenant {} configured: nominal {}",
                spec.name,
                if quotas.is_empty() {
                    "none".to_string()
                } else {
                    quotas.join(", ")
                }
            )
        }
        Event::CohortConfigured { spec, .. } => match spec.usage_half_life_s {
            0 => format!(
                "cohort {} configured: borrowers served by the share they borrow now",
                spec.name
            ),
            h => format!(
                "cohort {} configured: borrowers served by use decayed with a half-life of {}",
                spec.name,
                crate::explain::words::declared(h)
            ),
        },
        Event::QueueStateSet { tenant, state, .. } => format!("queue {tenant} set {state}"),
        Event::BudgetSpent { tenant, flavor, .. } => {
            let b = budget_of(before, tenant, flavor);
            format!("{tenant} spent its GPU-hour budget in {flavor}{b}")
        }
        Event::BudgetRenewed { tenant, flavor, .. } => {
            let b = budget_of(before, tenant, flavor);
            format!("{tenant}'s GPU-hour budget in {flavor} renewed{b}")
        }
        _ => return None,
    };
    Some(line)
}

/// A node's event in one line.
fn node_line(before: &State, ev: &Event) -> Option<String> {
    let line = match ev {
        Event::NodeAdded { spec, .. } => format!(
            "node {} added: {} × {} at {}",
            spec.name,
            spec.gpus,
            spec.flavor,
            spec.path.join("/")
        ),
        Event::NodeCordoned { node: n } => format!("node {} cordoned", node(before, n)),
        Event::NodeUncordoned { node: n } => format!("node {} uncordoned", node(before, n)),
        Event::NodeDrained { node: n } => format!("node {} drained", node(before, n)),
        Event::NodeLost { node: n, .. } => {
            let jobs = before.nodes().get(n.index()).map_or(0, |x| x.jobs.len());
            format!("node {} lost ({jobs} jobs on it)", node(before, n))
        }
        Event::NodeRejoined { node: n, .. } => format!("node {} rejoined, empty", node(before, n)),
        Event::NodeEvicted { node: n, .. } => {
            let jobs = before.nodes().get(n.index()).map_or(0, |x| x.jobs.len());
            format!(
                "node {} evicted for maintenance ({jobs} jobs on it)",
                node(before, n)
            )
        }
        _ => return None,
    };
    Some(line)
}

/// A preemption, eviction or reservation decision, or what became of a
/// victim (its checkpoint, its preemption), in one line.
fn decision_line(before: &State, ev: &Event) -> Option<String> {
    let line = match ev {
        Event::EvictionPlanned { cause, victims, .. } => {
            let names: Vec<String> = victims.iter().map(|v| v.job.to_string()).collect();
            let lost: u64 = victims.iter().map(|v| v.expected_lost_gpu_ms).sum();
            format!(
                "eviction planned: {}; victims {} (expected loss {})",
                eviction_text(before, cause),
                names.join(", "),
                gpu_hours(lost)
            )
        }
        Event::JobCheckpointed {
            job, progress_ms, ..
        } => format!(
            "job {job} checkpointed ({} of work saved)",
            duration(*progress_ms)
        ),
        Event::PreemptionPlanned {
            beneficiary,
            cause,
            victims,
            ..
        } => {
            let names: Vec<String> = victims.iter().map(|v| v.job.to_string()).collect();
            let lost: u64 = victims.iter().map(|v| v.expected_lost_gpu_ms).sum();
            format!(
                "preemption planned for job {beneficiary}: {}; victims {} (expected loss {})",
                cause_text(cause),
                names.join(", "),
                gpu_hours(lost)
            )
        }
        Event::JobPreempted {
            job,
            lost_gpu_ms,
            resume_from,
            ..
        } => {
            let on = before
                .job(*job)
                .map(|j| node_list(before, &j.assignments))
                .unwrap_or_default();
            let resume = match resume_from {
                Some(c) => format!("resumes from {} of work", duration(c.progress_ms)),
                None => "restarts from the beginning".to_string(),
            };
            format!(
                "job {job} preempted on {on}: {} lost, {resume}",
                gpu_hours(*lost_gpu_ms)
            )
        }
        Event::ReservationMade {
            job,
            assignments,
            start,
            ..
        } => {
            let when = if start.is_some() {
                "with a guaranteed start"
            } else {
                "no start guaranteed"
            };
            format!(
                "nodes reserved for job {job}: {} ({when})",
                node_list(before, assignments)
            )
        }
        _ => return None,
    };
    Some(line)
}

/// A job's own step in one line.
fn job_line(before: &State, ev: &Event) -> Option<String> {
    let line = match ev {
        Event::JobSubmitted { job, spec, .. } => format!(
            "job {job} submitted by {}: {}×{} GPUs, {}",
            spec.tenant, spec.workers, spec.gpus_per_worker, spec.topology
        ),
        Event::JobAccepted { job } => format!("job {job} accepted"),
        Event::JobRejected { job, reason } => format!("job {job} rejected: {reason}"),
        Event::JobAdmitted {
            job,
            flavor,
            borrowed,
            ..
        } => match borrowed {
            0 => format!("job {job} admitted in {flavor}"),
            b => format!("job {job} admitted in {flavor}, borrowing {b} GPUs"),
        },
        Event::JobPending { job, reason, .. } => format!("job {job} waits: {reason}"),
        Event::JobBound {
            job,
            assignments,
            backfill_for,
            ..
        } => match backfill_for {
            None => format!("job {job} bound to {}", node_list(before, assignments)),
            Some(r) => format!(
                "job {job} bound to {} as backfill for job {r}",
                node_list(before, assignments)
            ),
        },
        Event::JobStarted { job, .. } => format!("job {job} started"),
        Event::JobFinished { job, outcome, .. } => {
            let how = match outcome {
                Outcome::Succeeded => "succeeded",
                Outcome::Failed => "failed",
                Outcome::Cancelled => "stopped (cancelled)",
                Outcome::TimedOut => "stopped (past its max runtime)",
            };
            format!("job {job} {how}")
        }
        Event::JobCancelled { job, .. } => format!("job {job} cancelled"),
        Event::JobCancelRequested { job, .. } => format!("job {job}: cancel requested"),
        Event::JobRequeued {
            job,
            reason: RequeueReason::NodeLost { node: n },
            lost_gpu_ms,
            ..
        } => format!(
            "job {job} requeued: node {} lost, {} of work lost",
            node(before, n),
            gpu_hours(*lost_gpu_ms)
        ),
        Event::JobRequeued {
            job,
            reason: RequeueReason::QueueStopped { tenant },
            ..
        } => {
            format!("job {job} back in queue {tenant}: the queue was stopped before it was placed")
        }
        Event::JobDependencyFailed {
            job, dependency, ..
        } => format!(
            "job {job} cancelled: job {dependency}, which it runs after (after_ok), ended without succeeding"
        ),
        _ => return None,
    };
    Some(line)
}

/// A budget's terms, as `" (500 GPU-hours a month, then wait)"`, or
/// nothing where the tenant has none in the flavor.
fn budget_of(before: &State, tenant: &str, flavor: &str) -> String {
    let ledger = before
        .tenant_idx(tenant)
        .zip(before.flavor(flavor))
        .and_then(|(t, f)| before.tenant(t).budget(f));
    ledger.map_or_else(String::new, |l| {
        let b = l.budget;
        format!(
            " ({} GPU-hours a {}, then {})",
            b.gpu_hours,
            b.period.name(),
            b.when_spent.name()
        )
    })
}

/// The nodes an event concerns: those it names, and those its job held or
/// is given.
pub fn nodes_touched(before: &State, ev: &Event) -> Vec<NodeId> {
    let mut out: Vec<NodeId> = match ev {
        Event::NodeAdded { node, .. }
        | Event::NodeCordoned { node }
        | Event::NodeUncordoned { node }
        | Event::NodeDrained { node }
        | Event::NodeLost { node, .. }
        | Event::NodeRejoined { node, .. }
        | Event::NodeEvicted { node, .. } => vec![*node],
        Event::JobBound { assignments, .. } | Event::ReservationMade { assignments, .. } => {
            assignments.iter().map(|a| a.node).collect()
        }
        Event::EvictionPlanned { victims, .. } => victims
            .iter()
            .filter_map(|v| before.job(v.job))
            .flat_map(|j| j.assignments.iter().map(|a| a.node))
            .collect(),
        Event::PreemptionPlanned {
            victims, reserve, ..
        } => victims
            .iter()
            .filter_map(|v| before.job(v.job))
            .flat_map(|j| j.assignments.iter().map(|a| a.node))
            .chain(reserve.iter().map(|a| a.node))
            .collect(),
        _ => Vec::new(),
    };
    if let Some(j) = ev.job().and_then(|id| before.job(id)) {
        out.extend(j.assignments.iter().map(|a| a.node));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The tenant an event concerns, if one: a tenant's configuration, or the
/// tenant of its job (a victim's tenant is not the plan's).
pub fn tenant_touched<'a>(before: &'a State, ev: &'a Event) -> Option<&'a str> {
    match ev {
        Event::TenantConfigured { spec } => Some(&spec.name),
        Event::QueueStateSet { tenant, .. }
        | Event::BudgetSpent { tenant, .. }
        | Event::BudgetRenewed { tenant, .. }
        | Event::EvictionPlanned {
            cause: EvictionCause::QueueStopped { tenant },
            ..
        } => Some(tenant),
        Event::JobSubmitted { spec, .. } => Some(&spec.tenant),
        _ => ev
            .job()
            .and_then(|id| before.job(id))
            .map(|j| j.spec.tenant.as_str()),
    }
}
