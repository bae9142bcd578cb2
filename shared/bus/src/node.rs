//! The node protocol: what a node agent and the node relay say to each other
//! over NATS (core subjects, JSON), and nothing else. See docs/agent.md.
//!
//! Owns: the message types and their subjects. The protocol is
//! level-triggered, like a kubelet's: an agent sends its whole node's status
//! (every worker it knows, with its state and newest complete checkpoint) on
//! every change and every heartbeat; the relay answers with the node's whole
//! orders (every worker that should exist there and what it should do). A lost
//! message is repaired by the next one; a restarted relay re-derives the orders
//! from the log and a restarted agent's first status says what it runs.
//!
//! Must never: carry a decision the log does not hold (orders are derived
//! from the folded log), or change meaning for an old field: fields are only
//! added, with defaults.

use std::collections::BTreeMap;

use gpusched_model::NodeSpec;
use serde::{Deserialize, Serialize};

/// Bumped only for a change an older peer cannot read.
pub const PROTOCOL_VERSION: u32 = 1;

/// Agents publish their status here.
pub fn status_subject(root: &str) -> String {
    format!("{root}.node.status")
}

/// The relay publishes one node's orders here.
pub fn orders_subject(root: &str, node: &str) -> String {
    format!("{root}.node.{node}.orders")
}

/// One node's log reader answers requests here (`gpusched logs`).
pub fn logs_subject(root: &str, node: &str) -> String {
    format!("{root}.node.{node}.logs")
}

/// Identifies one worker: rank `rank` of run `run` of job `job` (run `n`
/// is the job's n-th start). Also the key of the node protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerKey {
    /// The job id.
    pub job: u64,
    /// Which run (start) of the job: a requeued job that starts again has
    /// the next run.
    pub run: u32,
    /// The worker's global rank.
    pub rank: u32,
}

/// An agent's whole status: sent on every change and every heartbeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The registration epoch: new at every agent start. A status from an
    /// older registration than the relay knows is refused.
    pub boot: u64,
    /// The node as configured on it (name, flavor, GPU count, topology path).
    pub spec: NodeSpec,
    /// Every worker the agent knows, running or ended, until the orders no
    /// longer name it.
    pub workers: Vec<WorkerStatus>,
}

/// One worker as its agent sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Which worker.
    pub key: WorkerKey,
    /// Its process.
    pub state: WorkerState,
    /// The newest complete checkpoint of this run, if any.
    #[serde(default)]
    pub checkpoint: Option<CheckpointSeen>,
}

/// A worker process's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum WorkerState {
    /// Started and not exited.
    Running {
        /// Its process id (also its process group).
        pid: u32,
        /// When it started, ms since the epoch (the agent's clock).
        started_ms: u64,
    },
    /// Could not be started; the reason in words.
    StartFailed {
        /// E.g. `command "trainr" not found on PATH`.
        reason: String,
    },
    /// Exited.
    Exited {
        /// Its exit code, if it exited.
        code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
        /// Stopped by the agent for running past its max runtime.
        #[serde(default)]
        timed_out: bool,
    },
}

/// A complete checkpoint (its completion marker was written).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSeen {
    /// Its directory name under the job's checkpoint directory.
    pub name: String,
    /// The progress the job wrote in the marker (e.g. its step).
    pub progress: u64,
    /// Where it is (the directory).
    pub uri: String,
    /// When the marker appeared, ms since the epoch (the agent's clock).
    pub completed_ms: u64,
}

/// The relay's whole orders for one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeOrders {
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The registration these orders are for; an agent ignores orders for
    /// another boot.
    pub boot: u64,
    /// Every worker that should exist on the node. A process of a worker not
    /// named here is stopped (an orphan) and its record forgotten.
    pub workers: Vec<WorkerOrder>,
}

/// What one worker should be doing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerOrder {
    /// Which worker.
    pub key: WorkerKey,
    /// How to start it (used only if it has not been started).
    pub launch: Launch,
    /// What it should do now.
    pub action: Action,
}

/// Everything needed to start one worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// argv.
    pub command: Vec<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory, if any.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// GPUs this worker gets on the node (the agent picks the indices).
    pub gpus: u32,
    /// Workers in the gang.
    pub world_size: u32,
    /// Rank among the workers on this node.
    pub local_rank: u32,
    /// Rank 0's node name (its address for the rendezvous).
    pub master_addr: String,
    /// The rendezvous port.
    pub master_port: u16,
    /// Signal number that asks for a checkpoint.
    pub checkpoint_signal: i32,
    /// Whether the job checkpoints (declares a checkpoint policy): only
    /// then is it sent the checkpoint signal before a stop.
    #[serde(default)]
    pub checkpoints: bool,
    /// The complete checkpoint to resume from, if any (a directory).
    #[serde(default)]
    pub resume_from: Option<String>,
    /// The run's declared maximum runtime; the agent stops it past that.
    #[serde(default)]
    pub max_runtime_s: Option<u64>,
}

/// What a worker should be doing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Action {
    /// Run (start it if it is not running).
    Run,
    /// Stop by `deadline_ms` (ms since the epoch): first ask for a
    /// checkpoint when `checkpoint_first`, stop as soon as one completes,
    /// and at the deadline stop it whatever it is doing (SIGTERM, then
    /// SIGKILL after the agent's kill grace, both before the deadline).
    Stop {
        /// Latest time the processes may still hold the GPUs.
        deadline_ms: u64,
        /// Ask for a checkpoint before stopping.
        checkpoint_first: bool,
    },
}

/// A request for a worker's log (`gpusched logs`), answered by its agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRequest {
    /// Which worker.
    pub key: WorkerKey,
    /// `out` or `err`.
    pub stream: String,
    /// Byte offset to read from (0: the start of what is kept).
    pub offset: u64,
    /// Most bytes to return.
    pub max_bytes: u64,
}

/// The answer to a [`LogRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    /// The bytes read (lossy UTF-8).
    pub text: String,
    /// Offset to ask for next.
    pub next_offset: u64,
    /// Whether the worker still runs (more may come).
    pub running: bool,
    /// Set when the log cannot be read.
    #[serde(default)]
    pub error: Option<String>,
}
