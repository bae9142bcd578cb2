//! The node relay's decisions: what each node should run, derived from the
//! log, and which facts an agent's status proves, checked against the log.
//!
//! Owns: the registration rule (one live registration per node name, newer
//! `boot` wins; an older one is refused), the worker table built from the
//! accepted statuses, the rules that turn it into `NodeAdded`,
//! `NodeRejoined`, `JobStarted`, `JobCheckpointed`, `JobFinished` and
//! `NodeLost`, and the orders of every node. Pure: no I/O, no clock (`now`
//! is passed in), so the relay service, replay and tests run the same code.
//!
//! Must never: append a report for a job not bound to the reporting node,
//! for an earlier run of the job, or from a stale registration (those are
//! refused and counted); release a preempted job's GPUs before its
//! processes exited (its final checkpoint is held until they did).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpusched_core::{worker_nodes, Job, NodeStatus as NodeHealth, Phase, State};
use gpusched_events::{Event, Outcome, WorkerExit};
use gpusched_model::{JobId, NodeId, Timestamp};

use crate::protocol::{
    Action, CheckpointSeen, Launch, NodeOrders, NodeStatus, WorkerKey, WorkerOrder, WorkerState,
    PROTOCOL_VERSION,
};

/// How the relay judges.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Silence after which a node is lost, ms.
    pub node_timeout_ms: u64,
    /// Rendezvous ports are `base + job id % span`.
    pub master_port_base: u16,
    /// How many rendezvous ports to cycle through.
    pub master_port_span: u16,
    /// How long a cancelled job gets to checkpoint and stop, ms.
    pub cancel_grace_ms: u64,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            node_timeout_ms: 30_000,
            master_port_base: 29_500,
            master_port_span: 1_000,
            cancel_grace_ms: 120_000,
        }
    }
}

/// Why a status, or one worker of it, was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The status speaks another protocol version.
    Version(u32),
    /// A newer registration of the node is live.
    StaleBoot {
        /// The node name.
        node: String,
    },
    /// The worker's job is not bound to the reporting node (or unknown).
    NotBound(WorkerKey),
    /// The worker belongs to another run than the job's current one.
    WrongRun(WorkerKey),
    /// The node's spec in the status does not match the log's.
    SpecChanged {
        /// The node name.
        node: String,
    },
}

#[derive(Clone, Debug)]
struct Registration {
    boot: u64,
    last_seen: Timestamp,
}

/// One worker as last reported, with the node that reported it.
#[derive(Clone, Debug, PartialEq)]
struct Reported {
    node: NodeId,
    state: WorkerState,
    checkpoint: Option<CheckpointSeen>,
}

/// The relay's memory between cycles: registrations and the worker table.
/// Nothing here is logged; a restarted relay relearns it from statuses.
#[derive(Debug, Default)]
pub struct Relay {
    cfg: RelayConfig,
    started: Option<Timestamp>,
    regs: HashMap<String, Registration>,
    table: BTreeMap<(JobId, u32), BTreeMap<u32, Reported>>,
    by_node: HashMap<NodeId, BTreeSet<(JobId, u32, u32)>>,
    /// Statuses refused so far.
    pub refused: u64,
    /// Nodes added in the cycle being decided (their ids follow the log's).
    added: u32,
}

/// The run a job is on: its n-th start (the next one while bound).
pub fn current_run(j: &Job) -> u32 {
    match j.phase {
        Phase::Bound => j.starts + 1,
        _ => j.starts,
    }
}

/// The ranks of `job` on `node`, in gang order, with each one's local rank.
pub fn ranks_on(j: &Job, node: NodeId) -> Vec<(u32, u32)> {
    let mut local = 0;
    let mut out = Vec::new();
    for (rank, n) in worker_nodes(&j.assignments, j.spec.gpus_per_worker)
        .into_iter()
        .enumerate()
    {
        if n == node {
            out.push((u32::try_from(rank).unwrap_or(u32::MAX), local));
            local += 1;
        }
    }
    out
}

impl Relay {
    /// A relay that started at `now` (nodes it never heard from are lost
    /// `node_timeout` after that).
    pub fn new(cfg: RelayConfig, now: Timestamp) -> Self {
        Relay {
            cfg,
            started: Some(now),
            ..Relay::default()
        }
    }

    /// Starts a cycle: statuses judged from here on are appended together.
    pub fn begin_cycle(&mut self) {
        self.added = 0;
    }

    /// Judges one status: registration events, then the facts its workers
    /// prove. Refusals are returned (and counted); nothing refused changes
    /// the table.
    pub fn on_status(
        &mut self,
        state: &State,
        status: &NodeStatus,
        now: Timestamp,
    ) -> (Vec<Event>, Vec<Refusal>) {
        let mut events = Vec::new();
        let mut refusals = Vec::new();
        if status.version != PROTOCOL_VERSION {
            refusals.push(Refusal::Version(status.version));
            self.refused += 1;
            return (events, refusals);
        }
        let name = status.spec.name.clone();
        if let Some(r) = self.regs.get(&name) {
            if status.boot < r.boot {
                refusals.push(Refusal::StaleBoot { node: name });
                self.refused += 1;
                return (events, refusals);
            }
        }
        let Some(node) = state.node_id(&name) else {
            // A new node: registered by the event; its workers (none yet)
            // are judged once the log has it.
            if status.spec.check_fields(state.levels().len()).is_ok() {
                let next = u32::try_from(state.nodes().len()).unwrap_or(u32::MAX);
                let id = NodeId(next.saturating_add(self.added));
                self.added += 1;
                events.push(Event::NodeAdded {
                    node: id,
                    spec: status.spec.clone(),
                    at: now,
                });
                self.regs.insert(
                    name,
                    Registration {
                        boot: status.boot,
                        last_seen: now,
                    },
                );
            }
            return (events, refusals);
        };
        let n = &state.nodes()[node.index()];
        if n.spec.flavor != status.spec.flavor
            || n.spec.gpus != status.spec.gpus
            || n.spec.path != status.spec.path
        {
            refusals.push(Refusal::SpecChanged { node: name });
            self.refused += 1;
            return (events, refusals);
        }
        let reboot = self.regs.get(&name).is_some_and(|r| status.boot > r.boot);
        self.regs.insert(
            name,
            Registration {
                boot: status.boot,
                last_seen: now,
            },
        );
        if reboot && n.status != NodeHealth::Lost && !n.jobs.is_empty() {
            // A restarted agent lost track of its workers: the node's jobs
            // are requeued from their checkpoints, as for a lost node.
            events.push(Event::NodeLost { node, at: now });
            self.forget_node(node);
            return (events, refusals);
        }
        if n.status == NodeHealth::Lost {
            if n.jobs.is_empty() {
                events.push(Event::NodeRejoined { node, at: now });
            }
            self.forget_node(node);
            return (events, refusals);
        }
        self.take_workers(state, node, status, &mut refusals);
        (events, refusals)
    }

    /// Replaces what `node` reported before by this status's workers,
    /// keeping only those the log says run there in their current run.
    fn take_workers(
        &mut self,
        state: &State,
        node: NodeId,
        status: &NodeStatus,
        refusals: &mut Vec<Refusal>,
    ) {
        self.forget_node(node);
        for w in &status.workers {
            let key = w.key;
            let job = state.job(JobId(key.job));
            let bound_here = job.is_some_and(|j| {
                j.phase.holds_gpus() && ranks_on(j, node).iter().any(|(r, _)| *r == key.rank)
            });
            let current = job.is_some_and(|j| current_run(j) == key.run);
            let ended = matches!(
                w.state,
                WorkerState::Exited { .. } | WorkerState::StartFailed { .. }
            );
            if !bound_here || !current {
                // An ended worker of a past run is the agent's leftover until
                // the next orders: stale, not a claim.
                let past_run =
                    job.is_some_and(|j| key.run < current_run(j) || !j.phase.holds_gpus());
                if !(ended && past_run) {
                    refusals.push(if bound_here {
                        Refusal::WrongRun(key)
                    } else {
                        Refusal::NotBound(key)
                    });
                    self.refused += 1;
                }
                continue;
            }
            let id = JobId(key.job);
            self.table.entry((id, key.run)).or_default().insert(
                key.rank,
                Reported {
                    node,
                    state: w.state.clone(),
                    checkpoint: w.checkpoint.clone(),
                },
            );
            self.by_node
                .entry(node)
                .or_default()
                .insert((id, key.run, key.rank));
        }
    }

    fn forget_node(&mut self, node: NodeId) {
        for (job, run, rank) in self.by_node.remove(&node).unwrap_or_default() {
            if let Some(ranks) = self.table.get_mut(&(job, run)) {
                ranks.remove(&rank);
                if ranks.is_empty() {
                    self.table.remove(&(job, run));
                }
            }
        }
    }

    /// The facts the worker table proves now, for every job it holds.
    pub fn job_facts(&self, state: &State, now: Timestamp) -> Vec<Event> {
        let mut out = Vec::new();
        for ((job, run), ranks) in &self.table {
            if let Some(j) = state.job(*job) {
                if current_run(j) == *run {
                    let stopping = state.preempt_ready().any(|r| r == *job);
                    facts_of(j, ranks, stopping, now, &mut out);
                }
            }
        }
        out
    }

    /// `NodeLost` for every node silent for longer than the node timeout
    /// (counted from the relay's start for a node it never heard from).
    pub fn timeouts(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        let mut out = Vec::new();
        let since_start = self.started.unwrap_or(now);
        for (i, n) in state.nodes().iter().enumerate() {
            if n.status == NodeHealth::Lost {
                continue;
            }
            let seen = self
                .regs
                .get(&n.spec.name)
                .map_or(since_start, |r| r.last_seen);
            if now.millis_since(seen) > self.cfg.node_timeout_ms {
                let node = NodeId(u32::try_from(i).unwrap_or(u32::MAX));
                out.push(Event::NodeLost { node, at: now });
                self.regs.remove(&n.spec.name);
                self.forget_node(node);
            }
        }
        out
    }

    /// The live registration of a node, if any.
    pub fn boot_of(&self, name: &str) -> Option<u64> {
        self.regs.get(name).map(|r| r.boot)
    }

    /// Everything `node` should run now, for its live registration.
    pub fn orders_for(&self, state: &State, node: NodeId) -> Option<NodeOrders> {
        let n = state.nodes().get(node.index())?;
        let boot = self.boot_of(&n.spec.name)?;
        let mut workers = Vec::new();
        for id in &n.jobs {
            let Some(j) = state.job(*id) else { continue };
            let Some(action) = action_of(j, self.cfg.cancel_grace_ms) else {
                continue;
            };
            let master = j
                .assignments
                .first()
                .and_then(|a| state.nodes().get(a.node.index()))
                .map_or_else(String::new, |m| m.spec.name.clone());
            for (rank, local_rank) in ranks_on(j, node) {
                workers.push(WorkerOrder {
                    key: WorkerKey {
                        job: id.0,
                        run: current_run(j),
                        rank,
                    },
                    launch: launch_of(j, local_rank, &master, &self.cfg),
                    action,
                });
            }
        }
        Some(NodeOrders {
            version: PROTOCOL_VERSION,
            boot,
            workers,
        })
    }
}

/// What a job's workers should be doing, if it holds GPUs.
fn action_of(j: &Job, cancel_grace_ms: u64) -> Option<Action> {
    let checkpoint_first = j.spec.checkpoint.is_some();
    match j.phase {
        Phase::Bound | Phase::Running => Some(match j.cancel_requested {
            Some(at) => Action::Stop {
                deadline_ms: at.0.saturating_add(cancel_grace_ms),
                checkpoint_first,
            },
            None => Action::Run,
        }),
        Phase::Preempting => Some(Action::Stop {
            deadline_ms: j.preempt.map_or(0, |(deadline, _)| deadline.0),
            checkpoint_first,
        }),
        _ => None,
    }
}

fn launch_of(j: &Job, local_rank: u32, master: &str, cfg: &RelayConfig) -> Launch {
    let span = u64::from(cfg.master_port_span.max(1));
    let port = u64::from(cfg.master_port_base) + j.id.0 % span;
    Launch {
        command: j.spec.command.clone(),
        env: env_of(&j.spec),
        working_dir: j.spec.working_dir.clone(),
        gpus: j.spec.gpus_per_worker,
        world_size: j.spec.workers,
        local_rank,
        master_addr: master.to_string(),
        master_port: u16::try_from(port).unwrap_or(cfg.master_port_base),
        checkpoint_signal: gpusched_model::checkpoint_signal_number(
            j.spec.checkpoint_signal.as_deref(),
        )
        .unwrap_or(10),
        checkpoints: j.spec.checkpoint.is_some(),
        resume_from: j.last_checkpoint.as_ref().map(|c| c.uri.clone()),
        max_runtime_s: j.spec.max_runtime_s,
    }
}

/// The spec's environment, with an array task's place in its array
/// (`GPUSCHED_ARRAY_ID`, `GPUSCHED_ARRAY_INDEX`) over any the spec sets.
fn env_of(spec: &gpusched_model::JobSpec) -> BTreeMap<String, String> {
    let mut env = spec.env.clone();
    if let Some(a) = spec.array {
        env.insert("GPUSCHED_ARRAY_ID".into(), a.array.to_string());
        env.insert("GPUSCHED_ARRAY_INDEX".into(), a.index.to_string());
    }
    env
}

/// The newest complete checkpoint of this run the workers saw, as the log
/// records it (`JobCheckpointed`), if the log does not hold it yet:
/// progress is the work it holds (the resume point plus the run's time up
/// to the checkpoint).
fn newest_checkpoint(j: &Job, ranks: &BTreeMap<u32, Reported>) -> Option<Event> {
    let started = j.started_at?;
    let seen = ranks
        .values()
        .filter_map(|r| r.checkpoint.as_ref())
        .filter(|c| c.completed_ms >= started.0)
        .max_by_key(|c| c.completed_ms)?;
    let progress = j.resume_progress_ms + (seen.completed_ms - started.0);
    let newer = j
        .last_checkpoint
        .as_ref()
        .is_none_or(|c| seen.completed_ms > c.at.0 && progress >= c.progress_ms);
    newer.then(|| Event::JobCheckpointed {
        job: j.id,
        progress_ms: progress,
        uri: seen.uri.clone(),
        at: Timestamp(seen.completed_ms),
    })
}

fn exits_of(ranks: &BTreeMap<u32, Reported>) -> Vec<WorkerExit> {
    ranks
        .iter()
        .filter_map(|(rank, r)| match &r.state {
            WorkerState::Exited { code, signal, .. } => Some(WorkerExit {
                rank: *rank,
                code: *code,
                signal: *signal,
            }),
            _ => None,
        })
        .collect()
}

/// The facts one run's workers prove, appended to `out`.
/// `stopping`: a preempted job whose checkpoint is in; the preemption
/// service stops it next, so its exit is not an outcome.
fn facts_of(
    j: &Job,
    ranks: &BTreeMap<u32, Reported>,
    stopping: bool,
    now: Timestamp,
    out: &mut Vec<Event>,
) {
    let job = j.id;
    let all = j.spec.workers as usize;
    let start_failed = ranks.iter().find_map(|(rank, r)| match &r.state {
        WorkerState::StartFailed { reason } => Some(format!("worker {rank}: {reason}")),
        _ => None,
    });
    let exited = |r: &Reported| matches!(r.state, WorkerState::Exited { .. });
    let failed_exit = |r: &Reported| matches!(&r.state, WorkerState::Exited { code, timed_out: false, .. } if *code != Some(0));
    let timed_out = ranks.values().any(|r| {
        matches!(
            r.state,
            WorkerState::Exited {
                timed_out: true,
                ..
            }
        )
    });
    let all_exited = ranks.len() == all && ranks.values().all(exited);
    let finished = |outcome: Outcome, reason: Option<String>| Event::JobFinished {
        job,
        outcome,
        at: now,
        exits: exits_of(ranks),
        reason,
    };
    match j.phase {
        Phase::Bound => {
            if let Some(reason) = start_failed {
                out.push(finished(Outcome::Failed, Some(reason)));
            } else if ranks.values().any(failed_exit) {
                out.push(finished(Outcome::Failed, None));
            } else if ranks.len() == all
                && ranks
                    .values()
                    .all(|r| matches!(r.state, WorkerState::Running { .. }) || exited(r))
            {
                out.push(Event::JobStarted { job, at: now });
            }
        }
        Phase::Running => {
            out.extend(newest_checkpoint(j, ranks));
            if j.cancel_requested.is_some() {
                if all_exited {
                    out.push(finished(Outcome::Cancelled, None));
                }
            } else if timed_out {
                out.push(finished(Outcome::TimedOut, None));
            } else if let Some(reason) = start_failed {
                out.push(finished(Outcome::Failed, Some(reason)));
            } else if ranks.values().any(failed_exit) {
                out.push(finished(Outcome::Failed, None));
            } else if all_exited {
                out.push(finished(Outcome::Succeeded, None));
            }
        }
        Phase::Preempting => {
            // The GPUs are released only once every worker exited: the
            // checkpoint that ends the preemption is reported then.
            if !all_exited || stopping {
                return;
            }
            if let Some(checkpointed) = newest_checkpoint(j, ranks) {
                out.push(checkpointed);
            } else if ranks
                .values()
                .all(|r| matches!(r.state, WorkerState::Exited { code: Some(0), .. }))
            {
                out.push(finished(Outcome::Succeeded, None));
            }
        }
        _ => {}
    }
}
