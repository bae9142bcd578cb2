//! One worker's life: checking that it can start, spawning it in its own
//! process group with its environment and log files, recording it, and the
//! task that waits for it (watching checkpoints and log sizes meanwhile),
//! reaps it and reports its exit.
//!
//! Must never: panic on a bad spec (a start that cannot happen is a
//! `StartFailed`), leave a child unreaped, or signal a group after its
//! leader's pid went to another process.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

use super::checkpoint::{CheckpointWatch, Found};
use super::logs::{self, LogPaths};
use super::orphans::{self, WorkerRecord};
use super::{SupervisorConfig, WorkerFact, WorkerKey, WorkerReport, WorkerSpec};

/// A worker that runs and has not been reaped yet.
#[derive(Debug)]
pub(crate) struct Live {
    /// Its process group (its pid).
    pub pgid: u32,
    /// The signal that asks it for a checkpoint.
    pub checkpoint_signal: Signal,
    /// Turns true once it has been reaped.
    pub exited: watch::Receiver<bool>,
}

/// The supervisor's running workers, shared with their tasks.
pub(crate) type LiveMap = Arc<Mutex<BTreeMap<WorkerKey, Live>>>;

/// Locks `live`; a poisoned lock still holds a consistent map (every change
/// is one insert or remove).
pub(crate) fn lock(live: &LiveMap) -> MutexGuard<'_, BTreeMap<WorkerKey, Live>> {
    live.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a worker did not start; the message is the reason reported.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error("command is empty")]
    EmptyCommand,
    #[error("command {0:?} not found on PATH")]
    NotOnPath(String),
    #[error("command {0:?} does not exist")]
    Missing(String),
    #[error("command {0:?} is a directory")]
    IsDir(String),
    #[error("command {0:?} is not executable")]
    NotExecutable(String),
    #[error("working_dir {0} does not exist")]
    NoWorkingDir(String),
    #[error("working_dir {0} is not a directory")]
    WorkingDirNotDir(String),
    #[error("checkpoint_signal {0} is not a signal")]
    BadSignal(i32),
    #[error("checkpoint_dir {path}: {source}")]
    CheckpointDir {
        path: String,
        source: std::io::Error,
    },
    #[error("log file {path}: {source}")]
    Logs {
        path: String,
        source: std::io::Error,
    },
    #[error("state dir {path}: {source}")]
    StateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("command {command:?} could not start: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
}

/// A worker just spawned and recorded.
pub(crate) struct Spawned {
    pub child: Child,
    pub pid: u32,
    pub record: WorkerRecord,
    pub signal: Signal,
    pub logs: LogPaths,
    pub watch: Option<CheckpointWatch>,
}

/// Checks `spec`, spawns its worker and writes its record.
pub(crate) fn spawn(cfg: &SupervisorConfig, spec: &WorkerSpec) -> Result<Spawned, StartError> {
    let program = spec.command.first().ok_or(StartError::EmptyCommand)?;
    let signal = Signal::try_from(spec.checkpoint_signal)
        .map_err(|_| StartError::BadSignal(spec.checkpoint_signal))?;
    if let Some(dir) = &spec.working_dir {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(StartError::WorkingDirNotDir(dir.display().to_string())),
            Err(_) => return Err(StartError::NoWorkingDir(dir.display().to_string())),
        }
    }
    let path_var: Option<OsString> = match spec.env.get("PATH") {
        Some(p) => Some(p.into()),
        None => std::env::var_os("PATH"),
    };
    let resolved = resolve(program, path_var.as_deref(), spec.working_dir.as_deref())?;

    std::fs::create_dir_all(&spec.checkpoint_dir).map_err(|source| StartError::CheckpointDir {
        path: spec.checkpoint_dir.display().to_string(),
        source,
    })?;
    let watch = (spec.rank == 0).then(|| CheckpointWatch::new(&spec.checkpoint_dir));
    let records = orphans::records_dir(&cfg.state_dir);
    std::fs::create_dir_all(&records).map_err(|source| StartError::StateDir {
        path: records.display().to_string(),
        source,
    })?;
    let log_paths = logs::log_paths(&cfg.log_dir, spec.job, spec.run, spec.rank);
    let (out, err) = logs::open(&log_paths).map_err(|source| StartError::Logs {
        path: log_paths.out.display().to_string(),
        source,
    })?;

    let mut cmd = Command::new(&resolved);
    cmd.arg0(program)
        .args(&spec.command[1..])
        .envs(&spec.env)
        .envs(worker_env(spec))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .process_group(0)
        .kill_on_drop(false);
    if spec.resume_from.is_none() {
        cmd.env_remove("GPUSCHED_RESUME_FROM");
    }
    if let Some(dir) = &spec.working_dir {
        cmd.current_dir(dir);
    }
    let spawn_err = |source| StartError::Spawn {
        command: program.clone(),
        source,
    };
    let child = cmd.spawn().map_err(spawn_err)?;
    let Some(pid) = child.id() else {
        // Only a child already waited for has no id; this one was not.
        return Err(spawn_err(std::io::Error::other("no pid after spawn")));
    };
    let record = match orphans::proc_stat(pid) {
        Ok(stat) => WorkerRecord {
            job: spec.job,
            run: spec.run,
            rank: spec.rank,
            pid,
            pgid: pid,
            start_time: stat.start_time,
            command: spec.command.clone(),
        },
        Err(source) => {
            abandon(child, pid);
            return Err(StartError::StateDir {
                path: format!("/proc/{pid}/stat"),
                source,
            });
        }
    };
    if let Err(source) = orphans::write_record(&cfg.state_dir, &record) {
        abandon(child, pid);
        return Err(StartError::StateDir {
            path: records.display().to_string(),
            source,
        });
    }
    Ok(Spawned {
        child,
        pid,
        record,
        signal,
        logs: log_paths,
        watch,
    })
}

/// Kills a just-spawned worker that cannot be recorded and reaps it in the
/// background.
fn abandon(mut child: Child, pid: u32) {
    orphans::signal_group(pid, Signal::SIGKILL);
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
}

/// The variables the supervisor sets; they win over the spec's.
fn worker_env(spec: &WorkerSpec) -> BTreeMap<&'static str, OsString> {
    let gpus: Vec<String> = spec.gpus.iter().map(u32::to_string).collect();
    let mut env: BTreeMap<&'static str, OsString> = BTreeMap::new();
    env.insert("CUDA_VISIBLE_DEVICES", gpus.join(",").into());
    env.insert("WORLD_SIZE", spec.world_size.to_string().into());
    env.insert("RANK", spec.rank.to_string().into());
    env.insert("LOCAL_RANK", spec.local_rank.to_string().into());
    env.insert("MASTER_ADDR", spec.master_addr.clone().into());
    env.insert("MASTER_PORT", spec.master_port.to_string().into());
    env.insert("GPUSCHED_JOB_ID", spec.job.to_string().into());
    env.insert("GPUSCHED_RUN", spec.run.to_string().into());
    env.insert(
        "GPUSCHED_CHECKPOINT_DIR",
        spec.checkpoint_dir.clone().into(),
    );
    if let Some(resume) = &spec.resume_from {
        env.insert("GPUSCHED_RESUME_FROM", resume.clone().into());
    }
    env
}

/// Finds the executable `program` names: on `path_var` when it has no `/`,
/// else as a path (relative to `working_dir` when relative).
fn resolve(
    program: &str,
    path_var: Option<&OsStr>,
    working_dir: Option<&Path>,
) -> Result<PathBuf, StartError> {
    if program.is_empty() {
        return Err(StartError::EmptyCommand);
    }
    if program.contains('/') {
        let p = Path::new(program);
        let p = match working_dir {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p.to_path_buf(),
        };
        return match std::fs::metadata(&p) {
            Err(_) => Err(StartError::Missing(program.to_string())),
            Ok(m) if m.is_dir() => Err(StartError::IsDir(program.to_string())),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => {
                Err(StartError::NotExecutable(program.to_string()))
            }
            Ok(_) => Ok(p),
        };
    }
    let mut not_executable = false;
    for dir in std::env::split_paths(path_var.unwrap_or_default()) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let candidate = dir.join(program);
        match std::fs::metadata(&candidate) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(candidate),
            Ok(m) if m.is_file() => not_executable = true,
            _ => {}
        }
    }
    if not_executable {
        Err(StartError::NotExecutable(program.to_string()))
    } else {
        Err(StartError::NotOnPath(program.to_string()))
    }
}

/// Everything the waiting task needs.
pub(crate) struct Supervised {
    pub key: WorkerKey,
    pub spawned: Spawned,
    pub exited: watch::Sender<bool>,
    pub live: LiveMap,
    pub reports: mpsc::Sender<WorkerReport>,
    pub state_dir: PathBuf,
    pub log_cap: u64,
    pub poll: Duration,
}

/// Waits for the worker; meanwhile reports its checkpoints (rank 0) and
/// keeps its logs under the cap. Then reaps it, kills its leftovers,
/// removes its record, looks at its checkpoints a last time and reports its
/// exit.
pub(crate) async fn supervise(s: Supervised) {
    let Supervised {
        key,
        spawned,
        exited,
        live,
        reports,
        state_dir,
        log_cap,
        poll,
    } = s;
    let Spawned {
        mut child,
        pid,
        record,
        logs,
        mut watch,
        ..
    } = spawned;
    let report = |fact| WorkerReport { worker: key, fact };
    let mut ticker = tokio::time::interval(poll.max(Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = ticker.tick() => {
                let (w, found) = housekeeping(watch, logs.clone(), log_cap).await;
                watch = w;
                for f in found {
                    let _ = reports.send(report(checkpoint_fact(f))).await;
                }
            }
        }
    };
    lock(&live).remove(&key);
    let _ = exited.send(true);
    if orphans::group_is_recorded_one(&record) {
        orphans::signal_group(record.pgid, Signal::SIGKILL);
    }
    orphans::remove_record(&orphans::record_path(&state_dir, key));
    let (_, found) = housekeeping(watch, logs, log_cap).await;
    for f in found {
        let _ = reports.send(report(checkpoint_fact(f))).await;
    }
    let (code, signal) = match status {
        Ok(st) => (st.code(), st.signal()),
        Err(e) => {
            tracing::warn!(pid, error = %e, "cannot wait for worker");
            (None, None)
        }
    };
    let _ = reports
        .send(report(WorkerFact::Exited { code, signal }))
        .await;
}

fn checkpoint_fact(f: Found) -> WorkerFact {
    WorkerFact::CheckpointComplete {
        name: f.name,
        path: f.path,
        progress: f.progress,
    }
}

/// One poll's file work, off the async threads: new complete checkpoints,
/// and log rotation.
async fn housekeeping(
    watch: Option<CheckpointWatch>,
    logs: LogPaths,
    cap: u64,
) -> (Option<CheckpointWatch>, Vec<Found>) {
    let job = tokio::task::spawn_blocking(move || {
        let mut watch = watch;
        let found = watch
            .as_mut()
            .map(CheckpointWatch::scan)
            .unwrap_or_default();
        logs::enforce_cap(&logs, cap);
        (watch, found)
    });
    match job.await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "worker housekeeping failed");
            (None, Vec::new())
        }
    }
}
