//! The node agent's process supervisor: the part of the agent that deals
//! with the operating system. It starts real worker processes, signals them
//! to checkpoint, stops them by a deadline, reports what happened, and
//! cleans up workers left behind by an agent that died.
//!
//! Owns: worker processes on this node (one process group each), their log
//! files, the worker records under the state dir, and watching a job's
//! checkpoint dir for completion markers. It is driven through
//! [`Supervisor`]'s plain Rust API and reports facts ([`WorkerReport`])
//! through a tokio mpsc channel.
//!
//! Must never: talk to NATS or Postgres, decide whether or where a job runs,
//! signal a process it cannot prove is its own worker (a reused pid with
//! another start time is never touched), or report a checkpoint that has no
//! completion marker.
//!
//! # Workers
//! Each worker is its own process group (`setpgid(0, 0)` at spawn), so a
//! signal to the worker reaches the processes it forked too. Its
//! environment is the agent's, then the spec's `env`, then the variables the
//! supervisor sets, which win over the spec's: `CUDA_VISIBLE_DEVICES`
//! (comma-joined GPU indices), `WORLD_SIZE`, `RANK`, `LOCAL_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT`, `GPUSCHED_JOB_ID`, `GPUSCHED_RUN`,
//! `GPUSCHED_CHECKPOINT_DIR`, and `GPUSCHED_RESUME_FROM` only when resuming
//! (it is removed otherwise). Standard input is `/dev/null`.
//!
//! When a worker's main process exits, the supervisor reaps it, sends
//! SIGKILL to what is left of its process group (a worker's leftovers die
//! with it), removes its record, scans the checkpoint dir one last time and
//! reports [`WorkerFact::Exited`].
//!
//! # Logs
//! stdout and stderr go straight to files (the child holds them open in
//! append mode, so a worker keeps logging when the agent restarts):
//! `<log_dir>/<job>/<run>-<rank>.out` and `.err` ([`log_paths`]). Every
//! `checkpoint_poll`, and once after exit, a file longer than
//! `log_cap_bytes` is rotated: its last `log_cap_bytes` go to `<file>.1`
//! (replacing the previous one) and the file is truncated. At rest a
//! stream therefore takes at most 2 × cap on disk; while a worker runs, the
//! live file can exceed the cap by what it writes in one poll interval, and
//! what it writes during a rotation's copy may be lost. A reader shows
//! `<file>.1` then `<file>`.
//!
//! # Checkpoints
//! The contract with a job: it writes a checkpoint under
//! `$GPUSCHED_CHECKPOINT_DIR/<name>/` and, last, a marker file
//! `<name>/COMPLETE` holding its progress as a decimal integer (e.g. the
//! step count), ideally by writing `COMPLETE.tmp` and renaming it. The
//! supervisor watches the dir of each job's rank-0 worker (ranks on other
//! nodes are reported by their own agents' rank 0 only) every
//! `checkpoint_poll` and right after the worker exits, and reports
//! [`WorkerFact::CheckpointComplete`] once per marked checkpoint name and
//! (job, run), whether requested or made on the job's own schedule.
//! Checkpoints already complete when the run started (the one it resumes
//! from) are not reported again. A marker whose content is not an integer
//! yet is looked at again at the next poll. A job must install its
//! checkpoint-signal handler early: a signal that arrives before has the
//! signal's default action (for SIGUSR1: the process ends).
//!
//! # Stopping
//! [`Supervisor::stop_by`] sends SIGTERM to the worker's process group at
//! the deadline and SIGKILL `kill_grace` later if the worker is still
//! there; [`Supervisor::kill`] is a stop with the deadline now. A worker that
//! already exited is not signalled. Several stops for one run: the earliest
//! deadline wins.
//!
//! # Orphans
//! At each start the supervisor writes
//! `<state_dir>/workers/<job>-<run>-<rank>.json` with the pid, the process
//! group and the process start time (`/proc/<pid>/stat` field 22, so this
//! part is Linux only), and removes it once the worker is reaped.
//! A restarted agent calls [`Supervisor::kill_orphans`], which kills the
//! recorded groups whose (job, run) are no longer wanted and whose leader is
//! still the very recorded process, and removes the records of dead ones.
//! Dropping a [`Supervisor`] leaves its workers running, as an agent that
//! dies would; the tasks that wait for them keep running while the tokio
//! runtime does.

mod checkpoint;
mod logs;
mod orphans;
mod supervisor;
mod worker;

pub use logs::{log_paths, LogPaths};
pub use orphans::WorkerRecord;
pub use supervisor::Supervisor;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// SIGUSR1: the default checkpoint signal.
pub const DEFAULT_CHECKPOINT_SIGNAL: i32 = nix::sys::signal::Signal::SIGUSR1 as i32;

pub use gpusched_bus::node::WorkerKey;

/// What to start: one worker of one run of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The job id.
    pub job: u64,
    /// Which run (start) of the job.
    pub run: u32,
    /// Global rank of this worker.
    pub rank: u32,
    /// Number of workers of the run.
    pub world_size: u32,
    /// Rank of this worker on its node.
    pub local_rank: u32,
    /// GPU indices on this node bound to this worker.
    pub gpus: Vec<u32>,
    /// argv; `argv[0]` is looked up on `PATH` (the spec's `PATH` if it sets
    /// one) unless it holds a `/`; a relative path is relative to
    /// `working_dir`.
    pub command: Vec<String>,
    /// Extra environment; cannot override the variables the supervisor sets.
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the agent's).
    pub working_dir: Option<PathBuf>,
    /// Signal sent by [`Supervisor::request_checkpoint`]
    /// (default [`DEFAULT_CHECKPOINT_SIGNAL`]).
    pub checkpoint_signal: i32,
    /// Shared storage dir for this job's checkpoints (created if missing).
    pub checkpoint_dir: PathBuf,
    /// The last complete checkpoint, when resuming.
    pub resume_from: Option<PathBuf>,
    /// Address of rank 0 for the job's collective setup.
    pub master_addr: String,
    /// Port of rank 0 for the job's collective setup.
    pub master_port: u16,
}

impl WorkerSpec {
    /// The worker this spec starts.
    pub fn key(&self) -> WorkerKey {
        WorkerKey {
            job: self.job,
            run: self.run,
            rank: self.rank,
        }
    }
}

/// A fact about one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerReport {
    /// The worker it is about.
    pub worker: WorkerKey,
    /// What happened.
    pub fact: WorkerFact,
}

/// What happened to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerFact {
    /// The worker's process runs.
    Started {
        /// Its pid (also its process group id).
        pid: u32,
    },
    /// The worker could not start; nothing runs.
    StartFailed {
        /// Why, in words (e.g. `command "trainr" not found on PATH`).
        reason: String,
    },
    /// A checkpoint with its completion marker appeared (reported once per
    /// name and run, by the rank-0 worker).
    CheckpointComplete {
        /// The checkpoint's directory name under the checkpoint dir.
        name: String,
        /// The checkpoint's directory.
        path: PathBuf,
        /// The progress written in its marker.
        progress: u64,
    },
    /// The worker's main process ended and was reaped.
    Exited {
        /// Its exit code, when it exited by itself.
        code: Option<i32>,
        /// The signal that ended it, when one did.
        signal: Option<i32>,
    },
}

/// How the supervisor works on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorConfig {
    /// Where worker records live (`<state_dir>/workers/`); must survive an
    /// agent restart.
    pub state_dir: PathBuf,
    /// Root of the worker log files.
    pub log_dir: PathBuf,
    /// Size above which a log file is rotated, bytes.
    pub log_cap_bytes: u64,
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How often checkpoint dirs and log sizes are looked at.
    pub checkpoint_poll: Duration,
}

impl SupervisorConfig {
    /// A configuration with the default limits: 64 MiB logs, 30 s grace,
    /// a 2 s poll.
    pub fn new(state_dir: PathBuf, log_dir: PathBuf) -> Self {
        Self {
            state_dir,
            log_dir,
            log_cap_bytes: 64 << 20,
            kill_grace: Duration::from_secs(30),
            checkpoint_poll: Duration::from_secs(2),
        }
    }
}
