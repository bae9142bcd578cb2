//! Relief: what preemption is doing, or could do, for a waiting job.
//!
//! Owns: telling a waiting job whether victims are stopping for it now
//! (which, and by when), whether the quota its victims freed is held for
//! it, and for a job a reclaim could help but none is planned: which
//! borrowers could be taken, which are protected by the minimum runtime and
//! until when, or why no borrower can be preempted.
//!
//! Must never: plan a preemption, promise one (the preemption stage
//! decides), or estimate a wait. Looks only at nodes of the job's flavor:
//! costs O(nodes of that flavor + their jobs).

use super::words::{jobs, relative};
use super::Context;
use crate::capacity::FlavorIdx;
use crate::state::{Phase, State, TenantIdx};
use gpusched_events::PendingReason;
use gpusched_model::{Gpus, JobId, Timestamp};
use std::collections::BTreeSet;

/// What preemption does or could do for a waiting job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Relief {
    /// Victims are stopping for it: each with the time it stops at the
    /// latest (earlier on a complete checkpoint).
    InProgress {
        /// Victims still stopping, by job id, with their deadlines.
        victims: Vec<(JobId, Timestamp)>,
    },
    /// Its victims have stopped; what they freed (quota, or room) is held
    /// for it until it is admitted.
    Held {
        /// The flavor held.
        flavor: String,
    },
    /// A reclaim would help it and no plan exists yet.
    Reclaim {
        /// The flavor.
        flavor: String,
        /// The cohort.
        cohort: String,
        /// The borrowers' jobs in the flavor, by what keeps each from
        /// being preempted now.
        borrowers: BorrowerJobs,
    },
    /// A reclaim cannot help: the job would take its tenant above its nominal quota.
    AboveNominal {
        /// The flavor.
        flavor: String,
        /// GPUs its tenant uses there.
        used: Gpus,
        /// Its tenant's nominal quota there.
        nominal: Gpus,
        /// GPUs the job needs.
        need: Gpus,
    },
    /// A reclaim would help but no tenant of the cohort borrows the flavor.
    NoBorrowers {
        /// The flavor.
        flavor: String,
        /// The cohort.
        cohort: String,
    },
}

/// Borrowers' jobs holding a flavor, sorted by whether a reclaim may
/// preempt them now, and if not, why not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BorrowerJobs {
    /// Running jobs that may be preempted now.
    pub eligible: Vec<JobId>,
    /// Jobs protected by the minimum runtime, with the time each becomes
    /// eligible, soonest first.
    pub protected: Vec<(JobId, Timestamp)>,
    /// Jobs bound but not started: protected for the minimum runtime once
    /// they start.
    pub not_started: Vec<JobId>,
    /// Jobs already stopping for another job.
    pub stopping: Vec<JobId>,
    /// Jobs that are not preemptible.
    pub not_preemptible: Vec<JobId>,
}

/// What preemption does or could do for `id`, if it waits and preemption
/// is part of why. `None` for a job that is not waiting, or whose wait no
/// preemption concerns (it waits for GPUs to free up on their own).
pub fn relief(state: &State, id: JobId, ctx: &Context) -> Option<Relief> {
    let job = state.job(id)?;
    if !matches!(job.phase, Phase::Queued | Phase::Admitted) {
        return None;
    }
    if let Some(plan) = state.plan(id) {
        let victims = plan
            .iter()
            .filter_map(|v| {
                let (deadline, _) = state.job(*v)?.preempt?;
                Some((*v, deadline))
            })
            .collect();
        return Some(Relief::InProgress { victims });
    }
    let t = job.tenant?;
    let tenant = state.tenant(t);
    let c = tenant.cohort?;
    if job.phase == Phase::Queued {
        if let Some(f) = state.planned_flavor(id) {
            return Some(Relief::Held {
                flavor: state.flavor_name(f).to_string(),
            });
        }
    }
    let (f, quota_missing) = match (job.phase, super::pending_reason(state, id)?) {
        (Phase::Queued, PendingReason::CohortExhausted { flavor, .. }) => {
            (state.flavor(&flavor)?, true)
        }
        (Phase::Admitted, PendingReason::NoDomainFits { .. }) => (job.flavor?, false),
        _ => return None,
    };
    let nominal = tenant.nominal(f);
    let used = tenant.used(f);
    let need = job.quota_gpus();
    let flavor = state.flavor_name(f).to_string();
    let cohort = state.cohort(c).name.clone();
    if quota_missing && used + need > nominal {
        return Some(Relief::AboveNominal {
            flavor,
            used: used.get(),
            nominal: nominal.get(),
            need: need.get(),
        });
    }
    if !quota_missing && used > nominal {
        return None;
    }
    let borrowers: Vec<TenantIdx> = state.borrowers(c, f, t);
    if borrowers.is_empty() {
        // Admitted and blocked for room only: GPUs free up on their own.
        return quota_missing.then_some(Relief::NoBorrowers { flavor, cohort });
    }
    Some(Relief::Reclaim {
        flavor,
        cohort,
        borrowers: BorrowerJobs::sort(state, borrower_jobs(state, f, &borrowers), ctx),
    })
}

impl BorrowerJobs {
    /// Sorts `jobs` by whether a reclaim may preempt each now.
    fn sort(state: &State, jobs: BTreeSet<JobId>, ctx: &Context) -> BorrowerJobs {
        let mut out = BorrowerJobs::default();
        for j in jobs {
            let Some(v) = state.job(j) else { continue };
            match (v.phase, v.started_at) {
                (Phase::Preempting, _) => out.stopping.push(j),
                _ if !v.spec.preemptible => out.not_preemptible.push(j),
                (Phase::Running, Some(s)) => {
                    let at = Timestamp(s.0.saturating_add(ctx.min_runtime_ms));
                    if at <= ctx.now {
                        out.eligible.push(j);
                    } else {
                        out.protected.push((j, at));
                    }
                }
                _ => out.not_started.push(j),
            }
        }
        out.protected.sort_by_key(|&(j, at)| (at, j));
        out
    }

    /// Them in words, for a reclaim in `flavor` of `cohort`, times
    /// relative to `now`.
    fn describe(&self, flavor: &str, cohort: &str, now: Timestamp) -> String {
        let BorrowerJobs {
            eligible,
            protected,
            not_started,
            stopping,
            not_preemptible,
        } = self;
        let mut parts = Vec::new();
        let all_np = eligible.is_empty()
            && protected.is_empty()
            && not_started.is_empty()
            && stopping.is_empty();
        if !eligible.is_empty() {
            parts.push(format!(
                "no reclaim planned yet; borrowers' {} may be preempted for it",
                jobs(eligible)
            ));
        } else if all_np && not_preemptible.is_empty() {
            parts.push(format!(
                "no borrower can be preempted: the {flavor} quota borrowed in cohort {cohort} is charged to jobs not placed yet"
            ));
        } else if all_np {
            parts.push(format!(
                "no borrower can be preempted: every borrower's job in {flavor} ({}) is not preemptible",
                jobs(not_preemptible)
            ));
        } else {
            parts.push(format!(
                "no reclaim yet: no borrower in cohort {cohort} may be preempted now"
            ));
        }
        if !protected.is_empty() {
            let each: Vec<String> = protected
                .iter()
                .take(8)
                .map(|(j, at)| format!("job {j} {}", relative(*at, now)))
                .collect();
            let more = protected.len().saturating_sub(8);
            parts.push(format!(
                "protected by the minimum runtime, borrowers become eligible: {}{}",
                each.join(", "),
                if more > 0 {
                    format!(" and {more} more later")
                } else {
                    String::new()
                }
            ));
        }
        if !not_started.is_empty() {
            parts.push(format!(
                "{} not started yet (protected for the minimum runtime once started)",
                jobs(not_started)
            ));
        }
        if !stopping.is_empty() {
            parts.push(format!(
                "{} already stopping for another job",
                jobs(stopping)
            ));
        }
        if !not_preemptible.is_empty() && !all_np {
            parts.push(format!("{} not preemptible", jobs(not_preemptible)));
        }
        parts.join("; ")
    }
}

/// Jobs of `borrowers` holding GPUs of flavor `f`, by id.
fn borrower_jobs(state: &State, f: FlavorIdx, borrowers: &[TenantIdx]) -> BTreeSet<JobId> {
    state
        .nodes()
        .iter()
        .filter(|n| n.flavor == f)
        .flat_map(|n| n.jobs.iter().copied())
        .filter(|j| {
            state
                .job(*j)
                .is_some_and(|v| v.tenant.is_some_and(|t| borrowers.contains(&t)))
        })
        .collect()
}

impl Relief {
    /// The relief in words, times relative to `now`; `cause` names why a
    /// plan in progress was made, when the log says.
    pub fn describe(&self, now: Timestamp, cause: Option<&str>) -> String {
        match self {
            Relief::InProgress { victims } => {
                let what = match cause {
                    Some(c) => format!("a preemption for it is in progress ({c})"),
                    None => "a preemption for it is in progress".to_string(),
                };
                let each: Vec<String> = victims
                    .iter()
                    .map(|(j, d)| {
                        if *d > now {
                            format!("job {j} stops {} at the latest", relative(*d, now))
                        } else {
                            format!("job {j} is due to stop now")
                        }
                    })
                    .collect();
                format!(
                    "{what}: waiting for its victims to stop ({}; each stops earlier on a complete checkpoint)",
                    each.join(", ")
                )
            }
            Relief::Held { flavor } => format!(
                "its victims have stopped: what they freed in {flavor} is held for it until it is admitted"
            ),
            Relief::AboveNominal {
                flavor,
                used,
                nominal,
                need,
            } => format!(
                "no reclaim can help: its tenant uses {used} of its nominal {nominal} {flavor} GPUs and the job needs {need}, more than the nominal quota; only quota within nominal is reclaimed from borrowers"
            ),
            Relief::NoBorrowers { flavor, cohort } => format!(
                "no reclaim can help: no other tenant of cohort {cohort} borrows {flavor} GPUs"
            ),
            Relief::Reclaim {
                flavor,
                cohort,
                borrowers,
            } => borrowers.describe(flavor, cohort, now),
        }
    }
}
