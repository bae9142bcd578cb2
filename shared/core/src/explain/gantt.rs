//! A job's life as a Gantt chart: the spans of time it spent in each
//! state, with the reason it waited, and the moments that mark it.
//!
//! Owns: how a job's logged events become bars (pending with each reason,
//! admitted, bound, running, preempting) and marks (checkpoints, plans that
//! chose it, preemptions with the work lost, requeues, the end). The
//! dashboard draws what this returns; it infers nothing itself.
//!
//! Must never: read a clock (the last bar is left open, and the caller
//! draws it up to its own now), or change anything.

use super::log_line;
use super::words::{duration, gpu_hours};
use crate::state::State;
use gpusched_events::Event;
use gpusched_model::{JobId, NodeId, Timestamp};

/// What a job was doing during a bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Waiting: for admission (quota) or for GPUs after admission failed.
    Pending,
    /// Admitted (quota charged), waiting for placement.
    Admitted,
    /// Bound to nodes, not yet started.
    Bound,
    /// Running.
    Running,
    /// Running, told to stop for a preemption (checkpointing).
    Preempting,
}

impl Lane {
    /// Its name as the API shows it.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Pending => "pending",
            Lane::Admitted => "admitted",
            Lane::Bound => "bound",
            Lane::Running => "running",
            Lane::Preempting => "preempting",
        }
    }
}

/// A span of time in one lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bar {
    /// What the job was doing.
    pub lane: Lane,
    /// Why, in words (the pending reason, the flavor admitted to, ...).
    pub text: String,
    /// When it began.
    pub from: Timestamp,
    /// When it ended; `None` while it lasts.
    pub to: Option<Timestamp>,
    /// Nodes the job held during it.
    pub nodes: Vec<NodeId>,
}

/// A moment in the job's life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// When.
    pub at: Timestamp,
    /// The event's kind, e.g. `job_checkpointed`.
    pub kind: &'static str,
    /// The event in words.
    pub text: String,
}

/// A job's bars and marks, in time order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gantt {
    /// Consecutive, non-overlapping spans; the last may be open.
    pub bars: Vec<Bar>,
    /// Moments, in log order.
    pub marks: Vec<Mark>,
}

impl Gantt {
    fn close(&mut self, at: Timestamp) {
        if let Some(b) = self.bars.last_mut().filter(|b| b.to.is_none()) {
            b.to = Some(at.max(b.from));
        }
    }

    fn open(&mut self, lane: Lane, text: String, at: Timestamp, nodes: Vec<NodeId>) {
        self.close(at);
        self.bars.push(Bar {
            lane,
            text,
            from: at,
            to: None,
            nodes,
        });
    }

    fn held(&self) -> Vec<NodeId> {
        self.bars
            .last()
            .map(|b| b.nodes.clone())
            .unwrap_or_default()
    }

    fn is_open(&self, lane: Lane) -> bool {
        self.bars
            .last()
            .is_some_and(|b| b.to.is_none() && b.lane == lane)
    }
}

/// `job`'s Gantt from its logged events (its own, and the plans that chose
/// it as a victim), in log order; names from `state`. Events of other jobs
/// are ignored. Times are the log's: an event without one takes the time
/// of the events before it.
pub fn gantt(state: &State, events: &[Event], job: JobId) -> Gantt {
    let mut g = Gantt::default();
    let mut clock = Timestamp(0);
    for ev in events {
        if let Some(at) = ev.at() {
            clock = clock.max(at);
        }
        step(&mut g, state, ev, job, clock);
    }
    g
}

fn step(g: &mut Gantt, state: &State, ev: &Event, job: JobId, at: Timestamp) {
    let mark = |g: &mut Gantt| {
        g.marks.push(Mark {
            at,
            kind: ev.kind(),
            text: log_line(state, ev),
        })
    };
    match ev {
        Event::PreemptionPlanned {
            beneficiary,
            cause,
            victims,
            ..
        } if victims.iter().any(|v| v.job == job) => {
            // Only what concerns this job: never the other victims, who may
            // be another tenant's.
            let own = victims.iter().find(|v| v.job == job);
            let lost = own.map_or(0, |v| v.expected_lost_gpu_ms);
            g.marks.push(Mark {
                at,
                kind: ev.kind(),
                text: format!(
                    "chosen as a victim for job {beneficiary}: {}; expected loss {}",
                    super::cause_text(cause),
                    gpu_hours(lost)
                ),
            });
            let held = g.held();
            g.open(
                Lane::Preempting,
                "stopping for a preemption".into(),
                at,
                held,
            );
        }
        Event::EvictionPlanned { cause, victims, .. } if victims.iter().any(|v| v.job == job) => {
            let lost = victims
                .iter()
                .find(|v| v.job == job)
                .map_or(0, |v| v.expected_lost_gpu_ms);
            g.marks.push(Mark {
                at,
                kind: ev.kind(),
                text: format!(
                    "chosen to be evicted: {}; expected loss {}",
                    super::eviction_text(state, cause),
                    gpu_hours(lost)
                ),
            });
            let held = g.held();
            g.open(
                Lane::Preempting,
                "stopping for an eviction".into(),
                at,
                held,
            );
        }
        e if e.job() != Some(job) => {}
        Event::JobSubmitted { .. } => g.open(Lane::Pending, "submitted".into(), at, vec![]),
        Event::JobPending { reason, .. } => {
            let text = reason.to_string();
            let same = g
                .bars
                .last()
                .is_some_and(|b| b.to.is_none() && b.text == text);
            if !same {
                g.open(Lane::Pending, text, at, vec![]);
            }
        }
        Event::JobAdmitted {
            flavor, borrowed, ..
        } => {
            let text = match borrowed {
                0 => format!("admitted to {flavor}"),
                b => format!("admitted to {flavor}, borrowing {b} GPUs"),
            };
            g.open(Lane::Admitted, text, at, vec![]);
        }
        Event::JobBound { assignments, .. } => {
            let nodes = assignments.iter().map(|a| a.node).collect();
            g.open(Lane::Bound, log_line(state, ev), at, nodes);
        }
        Event::JobStarted { .. } => {
            let held = g.held();
            g.open(Lane::Running, "running".into(), at, held);
        }
        Event::JobPreempted {
            lost_gpu_ms,
            resume_from,
            ..
        } => {
            // Its nodes are those it held, not the state's now.
            let resume = match resume_from {
                Some(c) => format!("resumes from its checkpoint at {}", duration(c.progress_ms)),
                None => "restarts from the beginning".to_string(),
            };
            g.marks.push(Mark {
                at,
                kind: ev.kind(),
                text: format!("preempted, {} lost; {resume}", gpu_hours(*lost_gpu_ms)),
            });
            g.open(Lane::Pending, "requeued".into(), at, vec![]);
        }
        Event::JobRequeued { .. } => {
            mark(g);
            g.open(Lane::Pending, "requeued".into(), at, vec![]);
        }
        e if e.ends_job() => {
            mark(g);
            g.close(at);
        }
        Event::JobCheckpointed { .. }
        | Event::JobCancelRequested { .. }
        | Event::ReservationMade { .. } => mark(g),
        Event::JobAccepted { .. } if !g.is_open(Lane::Pending) => {
            g.open(Lane::Pending, "accepted".into(), at, vec![]);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_events::{Assignment, Outcome, PendingReason, Victim};

    fn t(ms: u64) -> Timestamp {
        Timestamp(ms)
    }

    fn spec() -> gpusched_model::JobSpec {
        gpusched_model::JobSpec {
            topology: "node".into(),
            ..gpusched_model::JobSpec::new("vision", 1, 8)
        }
    }

    #[test]
    fn a_preempted_job_waits_runs_stops_and_runs_again() {
        let job = JobId(7);
        let other = JobId(8);
        let spec = spec();
        let bound = |at| Event::JobBound {
            job,
            assignments: vec![Assignment {
                node: NodeId(0),
                gpus: 8,
            }],
            backfill_for: None,
            at: t(at),
        };
        let pending = |at| Event::JobPending {
            job,
            reason: PendingReason::BehindHead { head: other },
            at: t(at),
        };
        let events = vec![
            Event::JobSubmitted {
                job,
                spec,
                at: t(1_000),
            },
            Event::JobAccepted { job },
            pending(2_000),
            pending(2_500), // same reason: the bar goes on
            Event::JobAdmitted {
                job,
                flavor: "h100".into(),
                borrowed: 8,
                at: t(3_000),
            },
            bound(4_000),
            Event::JobStarted { job, at: t(5_000) },
            Event::JobStarted {
                job: other,
                at: t(5_500),
            }, // another job's: ignored
            Event::PreemptionPlanned {
                beneficiary: other,
                cause: gpusched_events::PreemptionCause::Priority {
                    tenant: "vision".into(),
                    flavor: "h100".into(),
                },
                victims: vec![
                    Victim {
                        job,
                        deadline: t(9_000),
                        expected_lost_gpu_ms: 1,
                        cost: 1,
                    },
                    Victim {
                        job: JobId(99),
                        deadline: t(9_000),
                        expected_lost_gpu_ms: 1,
                        cost: 1,
                    },
                ],
                reserve: vec![],
                at: t(6_000),
            },
            Event::JobPreempted {
                job,
                lost_gpu_ms: 8_000,
                resume_from: None,
                at: t(7_000),
            },
            bound(8_000),
            Event::JobStarted { job, at: t(9_000) },
            Event::JobFinished {
                job,
                outcome: Outcome::Succeeded,
                at: t(10_000),
                exits: vec![],
                reason: None,
            },
        ];
        let g = gantt(&State::default(), &events, job);
        let lanes: Vec<(&str, u64, Option<u64>)> = g
            .bars
            .iter()
            .map(|b| (b.lane.name(), b.from.0, b.to.map(|t| t.0)))
            .collect();
        assert_eq!(
            lanes,
            vec![
                ("pending", 1_000, Some(2_000)),
                ("pending", 2_000, Some(3_000)),
                ("admitted", 3_000, Some(4_000)),
                ("bound", 4_000, Some(5_000)),
                ("running", 5_000, Some(6_000)),
                ("preempting", 6_000, Some(7_000)),
                ("pending", 7_000, Some(8_000)),
                ("bound", 8_000, Some(9_000)),
                ("running", 9_000, Some(10_000)),
            ]
        );
        assert_eq!(g.bars[1].text, "strict FIFO: behind blocked head job 8");
        assert_eq!(g.bars[2].text, "admitted to h100, borrowing 8 GPUs");
        assert_eq!(g.bars[4].nodes, vec![NodeId(0)], "running keeps the nodes");
        assert_eq!(g.bars[5].nodes, vec![NodeId(0)]);
        assert!(
            g.marks[0].text.contains("victim for job 8") && !g.marks[0].text.contains("99"),
            "only this job's part of the plan: {}",
            g.marks[0].text
        );
        assert!(
            g.marks[1].text.starts_with("preempted"),
            "{}",
            g.marks[1].text
        );
        let marks: Vec<&str> = g.marks.iter().map(|m| m.kind).collect();
        assert_eq!(
            marks,
            vec!["preemption_planned", "job_preempted", "job_finished"]
        );
    }

    #[test]
    fn a_waiting_job_has_one_open_bar() {
        let job = JobId(1);
        let events = vec![Event::JobSubmitted {
            job,
            spec: spec(),
            at: t(5),
        }];
        let g = gantt(&State::default(), &events, job);
        assert_eq!(g.bars.len(), 1);
        assert_eq!(g.bars[0].to, None);
    }
}
