//! A simulated node agent: registers its nodes and plays the jobs bound to
//! them in real time, scaled.
//!
//! Owns: the agent's timers (starts, checkpoints, completions). A job runs
//! for its declared `max_runtime_s` (or a default) divided by the time
//! scale; a checkpointable job completes a checkpoint every `interval_s`
//! (scaled), and a victim asked to stop checkpoints at once when it can
//! finish before its deadline. Timers are only hints: each one is checked
//! against the state when it falls due, so a restart that rebuilds them
//! from the log, or one made stale by a preemption, does no harm.
//!
//! Must never: report anything for a job not running on its nodes, or
//! emit any event but the agent's own kinds.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use gpusched_core::{Phase, State};
use gpusched_events::{Event, Outcome, Producer};
use gpusched_model::{JobId, NodeId, NodeSpec, Timestamp};

use gpusched_runtime::{wall_clock, Decider};

/// What the simulated agent runs.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Nodes to register (those the log does not have yet).
    pub nodes: Vec<NodeSpec>,
    /// Simulated time runs this many times faster than wall time.
    pub time_scale: f64,
    /// Runtime of a job that declares none, seconds.
    pub default_runtime_s: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The run with this start count ends.
    Finish(JobId, u32),
    /// A checkpoint of the run with this start count completes, capturing
    /// this much progress (ms).
    Checkpoint(JobId, u32, u64),
    /// The run with this start count stops because its user cancelled it
    /// (ordered after a checkpoint due at the same time).
    Stop(JobId, u32),
}

/// The simulated agent as a [`Decider`].
#[derive(Debug)]
pub struct SimulatedAgent {
    cfg: AgentConfig,
    registered: bool,
    to_start: Vec<JobId>,
    timers: BinaryHeap<Reverse<(Timestamp, Timer)>>,
}

impl SimulatedAgent {
    /// An agent for these nodes.
    pub fn new(cfg: AgentConfig) -> Self {
        SimulatedAgent {
            cfg,
            registered: false,
            to_start: Vec::new(),
            timers: BinaryHeap::new(),
        }
    }

    fn scaled(&self, ms: u64) -> u64 {
        let scale = if self.cfg.time_scale > 0.0 {
            self.cfg.time_scale
        } else {
            1.0
        };
        (ms as f64 / scale).round() as u64
    }

    /// Wall milliseconds the whole job runs.
    fn run_ms(&self, state: &State, job: JobId) -> u64 {
        let declared = state
            .job(job)
            .and_then(|j| j.spec.max_runtime_s)
            .unwrap_or(self.cfg.default_runtime_s);
        self.scaled(declared.saturating_mul(1000)).max(1)
    }

    fn on_started(&mut self, state: &State, job: JobId, at: Timestamp) {
        let Some(j) = state.job(job) else { return };
        let total = self.run_ms(state, job);
        let end = at.0 + total.saturating_sub(j.resume_progress_ms);
        self.timers
            .push(Reverse((Timestamp(end), Timer::Finish(job, j.starts))));
        if let Some(c) = j.spec.checkpoint {
            let interval = self.scaled(c.interval_s * 1000).max(1);
            let done = at.0 + interval + self.scaled(c.duration_s * 1000);
            if done < end {
                self.timers.push(Reverse((
                    Timestamp(done),
                    Timer::Checkpoint(job, j.starts, j.resume_progress_ms + interval),
                )));
            }
        }
    }

    fn on_victims(&mut self, state: &State, victims: &[gpusched_events::Victim], now: Timestamp) {
        for v in victims {
            self.on_victim(state, v.job, v.deadline, now);
        }
    }

    /// A victim checkpoints at once when it can finish before its deadline.
    fn on_victim(&mut self, state: &State, job: JobId, deadline: Timestamp, now: Timestamp) {
        let Some(j) = state.job(job) else { return };
        let (Some(c), Some(started)) = (j.spec.checkpoint, j.started_at) else {
            return;
        };
        let done = now.0 + self.scaled(c.duration_s * 1000);
        if done <= deadline.0 {
            let progress = j.resume_progress_ms + now.millis_since(started);
            self.timers.push(Reverse((
                Timestamp(done),
                Timer::Checkpoint(job, j.starts, progress),
            )));
        }
    }

    /// A cancelled run checkpoints once more when it checkpoints, then stops.
    fn on_cancel(&mut self, state: &State, job: JobId, now: Timestamp) {
        let Some(j) = state.job(job) else { return };
        let stop = match (j.spec.checkpoint, j.started_at) {
            (Some(c), Some(started)) => {
                let done = now.0 + self.scaled(c.duration_s * 1000);
                let progress = j.resume_progress_ms + now.millis_since(started);
                self.timers.push(Reverse((
                    Timestamp(done),
                    Timer::Checkpoint(job, j.starts, progress),
                )));
                Timestamp(done)
            }
            _ => now,
        };
        self.timers
            .push(Reverse((stop, Timer::Stop(job, j.starts))));
    }

    fn fire(&mut self, state: &State, timer: Timer, now: Timestamp, out: &mut Vec<Event>) {
        match timer {
            Timer::Finish(job, starts) | Timer::Stop(job, starts) => {
                let live = state.job(job).is_some_and(|j| {
                    matches!(j.phase, Phase::Running | Phase::Preempting) && j.starts == starts
                });
                if live {
                    let outcome = match timer {
                        Timer::Stop(..) => Outcome::Cancelled,
                        _ => Outcome::Succeeded,
                    };
                    out.push(Event::JobFinished {
                        job,
                        outcome,
                        at: now,
                        exits: Vec::new(),
                        reason: None,
                    });
                }
            }
            Timer::Checkpoint(job, starts, progress) => {
                let Some(j) = state.job(job).filter(|j| {
                    matches!(j.phase, Phase::Running | Phase::Preempting) && j.starts == starts
                }) else {
                    return;
                };
                if j.last_checkpoint
                    .as_ref()
                    .is_some_and(|c| c.progress_ms >= progress)
                {
                    return;
                }
                out.push(Event::JobCheckpointed {
                    job,
                    progress_ms: progress,
                    uri: format!("ckpt://job-{}/{}", job.0, progress),
                    at: now,
                });
                // The next periodic checkpoint of this run.
                if let (Phase::Running, Some(c), Some(started)) =
                    (j.phase, j.spec.checkpoint, j.started_at)
                {
                    let interval = self.scaled(c.interval_s * 1000).max(1);
                    let ran = progress.saturating_sub(j.resume_progress_ms);
                    let next_ran = (ran / interval + 1) * interval;
                    let done = started.0 + next_ran + self.scaled(c.duration_s * 1000);
                    let end =
                        started.0 + self.run_ms(state, job).saturating_sub(j.resume_progress_ms);
                    if done < end {
                        self.timers.push(Reverse((
                            Timestamp(done),
                            Timer::Checkpoint(job, starts, j.resume_progress_ms + next_ran),
                        )));
                    }
                }
            }
        }
    }
}

impl Decider for SimulatedAgent {
    fn producer(&self) -> Producer {
        Producer::Agent
    }

    fn observe(&mut self, state: &State, event: &Event) {
        match event {
            Event::JobBound { job, .. } => self.to_start.push(*job),
            Event::JobStarted { job, at } => self.on_started(state, *job, *at),
            Event::PreemptionPlanned { victims, .. } => {
                self.on_victims(state, victims, wall_clock())
            }
            Event::JobCancelRequested { job, .. } => self.on_cancel(state, *job, wall_clock()),
            _ => {}
        }
    }

    /// The timers the events before a snapshot would have set: starts of
    /// bound jobs, ends and checkpoints of running ones, the checkpoint of
    /// each victim and the stop of each cancelled run.
    fn resume(&mut self, state: &State) {
        let now = wall_clock();
        for j in state.jobs() {
            match j.phase {
                Phase::Bound => self.to_start.push(j.id),
                Phase::Running | Phase::Preempting => {
                    if let Some(at) = j.started_at {
                        self.on_started(state, j.id, at);
                    }
                    if let Some((deadline, _)) = j.preempt {
                        self.on_victim(state, j.id, deadline, now);
                    }
                    if j.cancel_requested.is_some() {
                        self.on_cancel(state, j.id, now);
                    }
                }
                _ => {}
            }
        }
    }

    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        let mut out = Vec::new();
        if !self.registered {
            self.registered = true;
            let mut next = state.nodes().len();
            for spec in &self.cfg.nodes {
                if state.node_id(&spec.name).is_none() {
                    out.push(Event::NodeAdded {
                        node: NodeId(u32::try_from(next).unwrap_or(u32::MAX)),
                        spec: spec.clone(),
                        at: now,
                    });
                    next += 1;
                }
            }
        }
        let mut starting = std::mem::take(&mut self.to_start);
        starting.sort_unstable();
        starting.dedup();
        for job in starting {
            if state.job(job).is_some_and(|j| j.phase == Phase::Bound) {
                out.push(Event::JobStarted { job, at: now });
            }
        }
        while let Some(Reverse((due, timer))) = self.timers.peek().copied() {
            if due > now {
                break;
            }
            self.timers.pop();
            self.fire(state, timer, now, &mut out);
        }
        out
    }

    fn next_due(&self) -> Option<Timestamp> {
        if !self.to_start.is_empty() || !self.registered {
            return Some(Timestamp(0));
        }
        self.timers.peek().map(|Reverse((t, _))| *t)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpusched_core::{run_cycle, CycleConfig, ScanMemo};
    use gpusched_model::{CheckpointPolicy, JobSpec};

    /// Two nodes of 8 H100s in one block, and tenant `ml` with 16 of them.
    const TWO_NODES: &str = r#"
        [[node]]
        name = "n0"
        flavor = "h100"
        gpus = 8
        path = ["r0", "b0"]

        [[node]]
        name = "n1"
        flavor = "h100"
        gpus = 8
        path = ["r0", "b0"]

        [[tenant]]
        name = "ml"
        quotas = [{ flavor = "h100", nominal = 16 }]
    "#;

    /// The events of two bound jobs on two nodes, the first then started;
    /// with the state after each.
    pub(crate) fn bound_and_running() -> (Vec<Event>, State, Timestamp) {
        let cluster = gpusched_sim::Cluster::parse(TWO_NODES, "two nodes").expect("parses");
        let mut events = cluster.events;
        for j in 1..=2u64 {
            events.push(Event::JobSubmitted {
                job: JobId(j),
                spec: JobSpec {
                    topology: "node".into(),
                    checkpoint: Some(CheckpointPolicy {
                        interval_s: 10,
                        duration_s: 1,
                    }),
                    max_runtime_s: Some(60),
                    ..JobSpec::new("ml", 1, 8)
                },
                at: Timestamp(2_000),
            });
        }
        let mut state = State::new();
        for e in &events {
            state.apply(e).expect("applies");
        }
        let now = Timestamp(3_000);
        let mut memo = ScanMemo::default();
        for _ in 0..4 {
            let out = run_cycle(&mut state, &mut memo, &CycleConfig::default(), now)
                .expect("decisions apply");
            events.extend(out.events);
        }
        let started = Event::JobStarted {
            job: JobId(1),
            at: now,
        };
        state.apply(&started).expect("starts");
        events.push(started);
        (events, state, now)
    }

    fn agent() -> SimulatedAgent {
        SimulatedAgent::new(AgentConfig {
            nodes: vec![],
            time_scale: 1.0,
            default_runtime_s: 60,
        })
    }

    #[test]
    fn resuming_from_a_state_plays_what_observing_its_log_would() {
        let (events, state, now) = bound_and_running();
        assert_eq!(state.job(JobId(2)).map(|j| j.phase), Some(Phase::Bound));
        let mut observed = agent();
        let mut replay = State::new();
        for e in &events {
            if replay.apply(e).is_ok() {
                observed.observe(&replay, e);
            }
        }
        let mut resumed = agent();
        resumed.resume(&state);
        // The start of the bound job, a checkpoint, the end of the run.
        for at in [now.0 + 1, now.0 + 11_000, now.0 + 60_001] {
            let (a, b) = (
                observed.decide(&state, Timestamp(at)),
                resumed.decide(&state, Timestamp(at)),
            );
            assert!(!a.is_empty(), "something falls due at {at}");
            assert_eq!(a, b, "at {at}");
        }
    }
}
