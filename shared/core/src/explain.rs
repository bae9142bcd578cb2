//! Explain: why a job waits, computed from the state on demand.
//!
//! Owns: the current pending reason of any waiting job and its position in
//! its queue. Stages record a `JobPending` event only for the heads they
//! examine and only when the reason changes; this answers for every job.
//!
//! Must never: estimate a wait time (BRIEF §6), or change anything.

use crate::capacity::CapacityOverlay;
use crate::quota::{self, QuotaOverlay};
use crate::state::{Phase, State};
use gpusched_events::PendingReason;
use gpusched_model::{JobId, QueueingMode};

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
