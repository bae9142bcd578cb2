//! What the log did, counted as it is folded: admissions and bindings per
//! tenant and flavor, victims stopped by cause, the work they and lost
//! nodes cost, and how long quota owners waited for quota they had lent
//! (`ReclaimClock`: from the moment the job was eligible to reclaim to its
//! start).
//!
//! Owns: those counts and the rule of each (which event counts, under
//! which cause). A folder calls `observe` once per event, after the fold,
//! so names come from the state the event made. Memory is bounded by the
//! jobs now in a preemption or waiting for lent quota, not by the log.
//!
//! Must never: read a clock (durations are the events' own `at`), count a
//! superseded decision, or change the state.

use std::collections::BTreeMap;

use gpusched_events::{Event, EvictionCause, PendingReason, PreemptionCause};
use gpusched_model::{JobId, Timestamp};
use rustc_hash::FxHashMap;

use crate::state::State;

/// Upper bounds of the reclaim latency buckets, seconds (the last bucket,
/// `+Inf`, is the count).
pub const RECLAIM_BUCKETS_S: [f64; 12] = [
    1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0,
];

/// A cause's label: `reclaim`, `priority`, `reservation`.
pub fn cause_label(c: &PreemptionCause) -> &'static str {
    match c {
        PreemptionCause::Reclaim { .. } => "reclaim",
        PreemptionCause::Priority { .. } => "priority",
        PreemptionCause::Reservation => "reservation",
    }
}

/// A short label for an eviction's cause.
pub fn eviction_label(c: &EvictionCause) -> &'static str {
    match c {
        EvictionCause::QueueStopped { .. } => "queue_stopped",
        EvictionCause::NodeEvicted { .. } => "node_evicted",
    }
}

/// When each job became eligible to reclaim, until it starts: the reclaim
/// latency that leaves out time a job spent behind its own tenant's jobs.
/// A job is eligible from the first of: a pending reason saying it waits
/// only for quota its tenant lent (with it the tenant stays within its
/// nominal quota, and the cohort's pool is lent out), or a plan naming it
/// the beneficiary of a reclaim (room held by borrowers).
#[derive(Clone, Debug, Default)]
pub struct ReclaimClock {
    eligible: FxHashMap<JobId, Timestamp>,
}

impl ReclaimClock {
    /// Observes an applied event; a job's start after it was eligible
    /// gives (job, eligible → start in ms).
    pub fn observe(&mut self, ev: &Event) -> Option<(JobId, u64)> {
        match ev {
            Event::JobPending {
                job,
                reason:
                    PendingReason::CohortExhausted {
                        used,
                        nominal,
                        need,
                        ..
                    },
                at,
            } if used.saturating_add(*need) <= *nominal => {
                self.eligible.entry(*job).or_insert(*at);
            }
            Event::PreemptionPlanned {
                beneficiary,
                cause: PreemptionCause::Reclaim { .. },
                at,
                ..
            } => {
                self.eligible.entry(*beneficiary).or_insert(*at);
            }
            Event::JobStarted { job, at } => {
                return self
                    .eligible
                    .remove(job)
                    .map(|from| (*job, at.millis_since(from)));
            }
            e if e.ends_job() => {
                if let Some(job) = e.job() {
                    self.eligible.remove(&job);
                }
            }
            _ => {}
        }
        None
    }

    /// Jobs eligible and not started yet.
    pub fn waiting(&self) -> usize {
        self.eligible.len()
    }
}

/// A latency histogram in milliseconds over [`RECLAIM_BUCKETS_S`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); one more for `+Inf`.
    pub counts: [u64; RECLAIM_BUCKETS_S.len() + 1],
    /// Sum of the observations, ms.
    pub sum_ms: u64,
}

impl Histogram {
    fn record(&mut self, ms: u64) {
        let s = ms as f64 / 1e3;
        let i = RECLAIM_BUCKETS_S
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(RECLAIM_BUCKETS_S.len());
        self.counts[i] += 1;
        self.sum_ms += ms;
    }

    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Counts of what the folded events did (module docs).
#[derive(Clone, Debug, Default)]
pub struct LogTally {
    /// Jobs admitted by (tenant, flavor, whether it borrowed).
    pub admissions: BTreeMap<(String, String, bool), u64>,
    /// Gangs bound by (tenant, flavor, whether as backfill).
    pub bindings: BTreeMap<(String, String, bool), u64>,
    /// Victims stopped by (cause, the victim's tenant).
    pub preemptions: BTreeMap<(&'static str, String), u64>,
    /// GPU-ms of work lost by cause: the preemption causes, and `node_lost`.
    pub lost_gpu_ms: BTreeMap<&'static str, u64>,
    /// Eligible to reclaim → started (`ReclaimClock`), by the events' times.
    pub reclaim_latency: Histogram,
    /// Victims planned and not stopped yet, with their plan's cause.
    victims: FxHashMap<JobId, &'static str>,
    /// Jobs eligible to reclaim, not started yet.
    reclaiming: ReclaimClock,
}

impl LogTally {
    /// Counts `ev`, which the fold just applied to `after` (`applied`
    /// false: superseded, not counted).
    pub fn observe(&mut self, after: &State, ev: &Event, applied: bool) {
        if !applied {
            return;
        }
        if let Some((_, ms)) = self.reclaiming.observe(ev) {
            self.reclaim_latency.record(ms);
        }
        let tenant = |j: &JobId| {
            after
                .job(*j)
                .map_or_else(String::new, |x| x.spec.tenant.clone())
        };
        let flavor = |j: &JobId| {
            after
                .job(*j)
                .and_then(|x| x.flavor)
                .map_or_else(String::new, |f| after.flavor_name(f).to_string())
        };
        match ev {
            Event::JobAdmitted {
                job,
                flavor: f,
                borrowed,
                ..
            } => {
                *self
                    .admissions
                    .entry((tenant(job), f.clone(), *borrowed > 0))
                    .or_default() += 1;
            }
            Event::JobBound {
                job, backfill_for, ..
            } => {
                *self
                    .bindings
                    .entry((tenant(job), flavor(job), backfill_for.is_some()))
                    .or_default() += 1;
            }
            Event::PreemptionPlanned { cause, victims, .. } => {
                let label = cause_label(cause);
                for v in victims {
                    self.victims.insert(v.job, label);
                }
            }
            Event::EvictionPlanned { cause, victims, .. } => {
                let label = eviction_label(cause);
                for v in victims {
                    self.victims.insert(v.job, label);
                }
            }
            Event::JobPreempted {
                job, lost_gpu_ms, ..
            } => {
                let label = self.victims.remove(job).unwrap_or("unplanned");
                *self.preemptions.entry((label, tenant(job))).or_default() += 1;
                *self.lost_gpu_ms.entry(label).or_default() += lost_gpu_ms;
            }
            Event::JobRequeued { lost_gpu_ms, .. } => {
                *self.lost_gpu_ms.entry("node_lost").or_default() += lost_gpu_ms;
            }
            e if e.ends_job() => {
                if let Some(job) = e.job() {
                    self.victims.remove(&job);
                }
            }
            _ => {}
        }
    }

    /// Jobs the tally remembers now (victims not stopped, owners not
    /// bound): what bounds its memory.
    pub fn in_flight(&self) -> usize {
        self.victims.len() + self.reclaiming.waiting()
    }
}
