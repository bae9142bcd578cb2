//! Admission: validates submissions against policy and cluster shape.
//!
//! Owns: the rules that accept or reject a submitted job, each naming the
//! field at fault (a dependency must be an earlier job of the same tenant,
//! and one named in `after_ok` must not have failed already), and the
//! cancellation of a queued job whose `after_ok` dependency failed. A gang that could never fit (no domain of its level is
//! large enough even when idle, or more GPUs than its tenant may ever use)
//! is rejected at once rather than left to wait forever.
//!
//! Must never: charge quota or allocate GPUs.

use crate::capacity::FlavorIdx;
use crate::quota_gpus::QuotaGpus;
use crate::state::{Dependency, State};
use gpusched_events::{Event, RejectReason};
use gpusched_model::{Gpus, JobId, JobSpec, Timestamp};

/// Checks a job specification against the current state, as the gateway
/// does before it writes a submission (the job has no id yet).
pub fn validate(state: &State, spec: &JobSpec) -> Result<(), RejectReason> {
    validate_job(state, None, spec)
}

/// Checks a submitted job: its spec, and that each dependency was
/// submitted before it (`job`: its id, once it has one), so no cycle can
/// form.
pub fn validate_job(state: &State, job: Option<JobId>, spec: &JobSpec) -> Result<(), RejectReason> {
    check_spec(state, spec)?;
    check_dependencies(state, job, spec)
}

/// Each dependency is a job of the same tenant submitted earlier, and none
/// named in `after_ok` has already ended without succeeding.
fn check_dependencies(
    state: &State,
    job: Option<JobId>,
    spec: &JobSpec,
) -> Result<(), RejectReason> {
    let order = job.and_then(|j| state.job(j)).map(|j| j.order);
    for (dep, kind) in spec.dependencies() {
        let rule = match state.dependency(&spec.tenant, order, dep, kind) {
            Dependency::Pending | Dependency::Met => continue,
            Dependency::NotOfTenant => format!("job {dep} is not a job of tenant {}", spec.tenant),
            Dependency::NotEarlier => format!(
                "job {dep} was submitted after this job; a job may only wait on earlier ones"
            ),
            Dependency::Failed(phase) => format!(
                "job {dep} already ended {} and can never succeed",
                phase.name()
            ),
        };
        return Err(RejectReason::InvalidField {
            field: kind.field().into(),
            rule,
        });
    }
    Ok(())
}

/// The spec's own rules and its fit to the cluster.
fn check_spec(state: &State, spec: &JobSpec) -> Result<(), RejectReason> {
    spec.check_fields()
        .map_err(|e| RejectReason::InvalidField {
            field: e.field,
            rule: e.rule,
        })?;
    let t = state
        .tenant_idx(&spec.tenant)
        .ok_or_else(|| RejectReason::UnknownTenant {
            tenant: spec.tenant.clone(),
        })?;
    let level = state
        .level_number(&spec.topology)
        .ok_or_else(|| RejectReason::UnknownLevel {
            level: spec.topology.clone(),
        })?;
    let tenant = state.tenant(t);
    if !tenant.queue.accepts() {
        return Err(RejectReason::QueueClosed {
            tenant: spec.tenant.clone(),
            state: tenant.queue,
        });
    }
    let flavors: Vec<FlavorIdx> = if spec.flavors.is_empty() {
        tenant.flavor_order.clone()
    } else {
        let mut v = Vec::new();
        for name in &spec.flavors {
            let f = state
                .flavor(name)
                .ok_or_else(|| RejectReason::UnknownFlavor {
                    flavor: name.clone(),
                })?;
            if tenant.quota(f).is_none() {
                return Err(RejectReason::InvalidField {
                    field: "flavors".into(),
                    rule: format!("tenant {} has no quota in flavor {name}", spec.tenant),
                });
            }
            v.push(f);
        }
        v
    };
    if flavors.is_empty() {
        return Err(RejectReason::InvalidField {
            field: "flavors".into(),
            rule: format!("tenant {} has no quota in any flavor", spec.tenant),
        });
    }
    let need = spec.total_gpus();
    let limit = flavors
        .iter()
        .map(|&f| quota_limit(state, t, f).get())
        .max()
        .unwrap_or(0);
    if need > limit {
        return Err(RejectReason::ExceedsQuotaLimit { need, limit });
    }
    let with_nodes: Vec<FlavorIdx> = flavors
        .iter()
        .copied()
        .filter(|&f| state.capacity().has_nodes(f))
        .collect();
    if with_nodes.len() == flavors.len() {
        let g = spec.gpus_per_worker;
        let best = with_nodes
            .iter()
            .map(|&f| state.capacity().max_domain_slots(f, level, spec.workers, g))
            .max()
            .unwrap_or(0);
        if best < spec.workers as u64 {
            return Err(RejectReason::GangTooLarge {
                level: spec.topology.clone(),
                need,
                largest_domain: (best * g as u64).min(Gpus::MAX as u64) as Gpus,
            });
        }
    }
    Ok(())
}

/// The most GPUs a tenant may ever hold in a flavor.
pub fn quota_limit(state: &State, t: crate::state::TenantIdx, f: FlavorIdx) -> QuotaGpus {
    let tenant = state.tenant(t);
    let Some(q) = tenant.quota(f) else {
        return QuotaGpus::ZERO;
    };
    let limit = tenant.limit(f);
    match tenant.cohort {
        None => limit,
        // In a cohort, also no more than it keeps plus all the pool holds.
        Some(c) => limit.min(q.guaranteed() + state.cohort(c).capacity(f)),
    }
}

/// Validates submitted jobs, oldest first, then cancels queued jobs whose
/// `after_ok` dependency ended without succeeding: `max` decisions in all.
pub fn decide(state: &State, max: usize, now: Timestamp) -> Vec<Event> {
    let mut out: Vec<Event> = state
        .awaiting_validation()
        .take(max)
        .filter_map(|id| {
            let job = state.job(id)?;
            Some(match validate_job(state, Some(id), &job.spec) {
                Ok(()) => Event::JobAccepted { job: id },
                Err(reason) => Event::JobRejected { job: id, reason },
            })
        })
        .collect();
    let left = max.saturating_sub(out.len());
    out.extend(state.dependency_failed().take(left).filter_map(|id| {
        Some(Event::JobDependencyFailed {
            job: id,
            dependency: state.job(id)?.failed_dependency?,
            at: now,
        })
    }));
    out
}
