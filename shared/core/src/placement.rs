//! Placement: the only GPU allocator.
//!
//! Owns: binding admitted gangs all-or-nothing inside one domain of the
//! level they ask for, preferring the fullest domain that fits and, inside
//! it, the fullest nodes, so large holes stay whole. Jobs are taken per
//! flavor by priority then admission order; a job that does not fit waits
//! with `NoDomainFits` while smaller ones behind it may go.
//!
//! Must never: charge quota, or probe more than `max_heads` jobs a cycle. A
//! flavor whose last pass placed nothing more is skipped until its capacity
//! version changes (GPUs freed, nodes added, new jobs admitted).

use crate::capacity::{CapacityOverlay, FlavorIdx};
use crate::cycle::{CycleConfig, ScanMemo};
use crate::state::{QueueKey, State};
use gpusched_events::{Event, PendingReason};
use gpusched_model::Timestamp;

/// What a placement pass looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlacementStats {
    /// Admitted jobs examined.
    pub heads_examined: u64,
    /// Domains probed for room.
    pub domains_probed: u64,
    /// Jobs bound.
    pub bound: u64,
}

/// Binds up to `cfg.max_heads` admitted jobs, round-robin across flavors.
pub fn decide(
    state: &State,
    memo: &mut ScanMemo,
    cfg: &CycleConfig,
    now: Timestamp,
) -> (Vec<Event>, PlacementStats) {
    let mut ov = CapacityOverlay::default();
    let mut stats = PlacementStats::default();
    let mut events = Vec::new();
    // (flavor, cursor, jobs examined in this flavor that did not fit)
    let mut active: Vec<(FlavorIdx, Option<QueueKey>, usize)> = (0..state.flavors().len())
        .map(|f| f as FlavorIdx)
        .filter(|&f| state.unplaced_after(f, None).is_some())
        .filter(|&f| memo.flavor_blocked.get(&f) != Some(&state.capacity_version(f)))
        .map(|f| (f, None, 0))
        .collect();
    while !active.is_empty() && (stats.heads_examined as usize) < cfg.max_heads {
        let mut i = 0;
        while i < active.len() && (stats.heads_examined as usize) < cfg.max_heads {
            let (f, cursor, mut blocked) = active[i];
            let Some(key) = state.unplaced_after(f, cursor) else {
                memo.flavor_blocked.insert(f, state.capacity_version(f));
                active.swap_remove(i);
                continue;
            };
            stats.heads_examined += 1;
            if let Some(job) = state.job(key.job) {
                let (w, g) = (job.spec.workers, job.spec.gpus_per_worker);
                let cap = state.capacity();
                let found = cap
                    .find_domain(&ov, f, job.level, w, g, &mut stats.domains_probed)
                    .and_then(|d| cap.choose_nodes(&ov, d, w, g));
                match found {
                    Some(assignments) => {
                        cap.take(&mut ov, &assignments);
                        stats.bound += 1;
                        events.push(Event::JobBound {
                            job: job.id,
                            assignments,
                            at: now,
                        });
                    }
                    None => {
                        blocked += 1;
                        let reason = PendingReason::NoDomainFits {
                            flavor: state.flavor_name(f).to_string(),
                            level: state.level_name(job.level).to_string(),
                            workers: w,
                            gpus_per_worker: g,
                            largest_free: cap.largest_free(&ov, f, job.level),
                        };
                        if job.last_reason.as_ref().map(|r| r.kind()) != Some(reason.kind()) {
                            events.push(Event::JobPending {
                                job: job.id,
                                reason,
                                at: now,
                            });
                        }
                    }
                }
            }
            // Nothing more fits once no node of the flavor has a free GPU.
            let exhausted = state.capacity().largest_free(&ov, f, 0) == 0;
            active[i] = (f, Some(key), blocked);
            if blocked >= cfg.max_heads_per_tenant || exhausted {
                memo.flavor_blocked.insert(f, state.capacity_version(f));
                active.swap_remove(i);
                continue;
            }
            i += 1;
        }
    }
    (events, stats)
}
