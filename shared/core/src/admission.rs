//! Admission: validates submissions against policy and cluster shape.
//!
//! Owns: the rules that accept or reject a submitted job, each naming the
//! field at fault. A gang that could never fit (no domain of its level is
//! large enough even when idle, or more GPUs than its tenant may ever use)
//! is rejected at once rather than left to wait forever.
//!
//! Must never: charge quota or allocate GPUs.

use crate::capacity::FlavorIdx;
use crate::state::State;
use gpusched_events::{Event, RejectReason};
use gpusched_model::{Gpus, JobSpec, Timestamp};

/// Checks a job specification against the current state.
pub fn validate(state: &State, spec: &JobSpec) -> Result<(), RejectReason> {
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
        .map(|&f| quota_limit(state, t, f))
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
pub fn quota_limit(state: &State, t: crate::state::TenantIdx, f: FlavorIdx) -> Gpus {
    let tenant = state.tenant(t);
    let Some(q) = tenant.quota(f) else { return 0 };
    match tenant.cohort {
        None => q.nominal,
        Some(c) => {
            let by_pool = q.guaranteed().saturating_add(state.cohort(c).capacity(f));
            let by_limit = q
                .borrowing_limit
                .map_or(Gpus::MAX, |b| q.nominal.saturating_add(b));
            by_pool.min(by_limit)
        }
    }
}

/// Validates up to `max` submitted jobs, oldest first.
pub fn decide(state: &State, max: usize, _now: Timestamp) -> Vec<Event> {
    state
        .awaiting_validation()
        .take(max)
        .filter_map(|id| {
            let job = state.job(id)?;
            Some(match validate(state, &job.spec) {
                Ok(()) => Event::JobAccepted { job: id },
                Err(reason) => Event::JobRejected { job: id, reason },
            })
        })
        .collect()
}
