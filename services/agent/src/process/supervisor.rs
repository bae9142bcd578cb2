//! [`Supervisor`]: the API the agent drives (start, checkpoint, stop, kill,
//! orphan cleanup) over the workers of this node.
//!
//! Must never: start a (job, run, rank) twice, or signal a worker that has
//! been reaped.

use std::collections::BTreeSet;
use std::time::Instant;

use nix::sys::signal::Signal;
use tokio::sync::{mpsc, watch};

use super::orphans;
use super::worker::{self, lock, Live, LiveMap, Supervised};
use super::{SupervisorConfig, WorkerFact, WorkerKey, WorkerReport, WorkerSpec};

/// Starts, signals and stops the workers of this node, and reports what
/// happens to them on the channel given to [`Supervisor::new`].
#[derive(Debug)]
pub struct Supervisor {
    cfg: SupervisorConfig,
    reports: mpsc::Sender<WorkerReport>,
    /// Every worker ever asked for, started or not: later starts of them are
    /// ignored.
    asked: BTreeSet<WorkerKey>,
    live: LiveMap,
}

impl Supervisor {
    /// A supervisor with no workers yet. Facts go to `reports`; a closed
    /// channel only loses them.
    pub fn new(cfg: SupervisorConfig, reports: mpsc::Sender<WorkerReport>) -> Self {
        Self {
            cfg,
            reports,
            asked: BTreeSet::new(),
            live: LiveMap::default(),
        }
    }

    /// Starts the worker `spec` describes and reports `Started` (then its
    /// checkpoints and `Exited`), or `StartFailed`. A start for a worker
    /// already asked for (started, finished or failed) is ignored.
    pub async fn start(&mut self, spec: WorkerSpec) {
        let key = spec.key();
        if !self.asked.insert(key) {
            tracing::debug!(?key, "start ignored: worker already asked for");
            return;
        }
        let spawned = match worker::spawn(&self.cfg, &spec) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(?key, reason = %e, "worker did not start");
                let fact = WorkerFact::StartFailed {
                    reason: e.to_string(),
                };
                let _ = self.reports.send(WorkerReport { worker: key, fact }).await;
                return;
            }
        };
        let pid = spawned.pid;
        let (exited_tx, exited_rx) = watch::channel(false);
        lock(&self.live).insert(
            key,
            Live {
                pgid: pid,
                checkpoint_signal: spawned.signal,
                exited: exited_rx,
            },
        );
        tracing::info!(?key, pid, "worker started");
        let fact = WorkerFact::Started { pid };
        let _ = self.reports.send(WorkerReport { worker: key, fact }).await;
        tokio::spawn(worker::supervise(Supervised {
            key,
            spawned,
            exited: exited_tx,
            live: self.live.clone(),
            reports: self.reports.clone(),
            state_dir: self.cfg.state_dir.clone(),
            log_cap: self.cfg.log_cap_bytes,
            poll: self.cfg.checkpoint_poll,
        }));
    }

    /// Sends each running worker of (job, run) its checkpoint signal, to its
    /// whole process group. Returns how many workers were signalled.
    pub fn request_checkpoint(&mut self, job: u64, run: u32) -> usize {
        let live = lock(&self.live);
        run_range(&live, job, run)
            .filter(|(_, w)| orphans::signal_group(w.pgid, w.checkpoint_signal))
            .count()
    }

    /// At `deadline`, sends SIGTERM to the process group of each worker of
    /// (job, run) still running, and SIGKILL `kill_grace` later to those
    /// still there. With several stops for a run the earliest deadline wins.
    pub fn stop_by(&mut self, job: u64, run: u32, deadline: Instant) {
        let deadline = tokio::time::Instant::from_std(deadline);
        let grace = self.cfg.kill_grace;
        let workers: Vec<(WorkerKey, watch::Receiver<bool>)> =
            run_range(&lock(&self.live), job, run)
                .map(|(k, w)| (*k, w.exited.clone()))
                .collect();
        for (key, mut exited) in workers {
            let live = self.live.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = exited.wait_for(|e| *e) => return,
                }
                if !signal_live(&live, key, Signal::SIGTERM) {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(grace) => {}
                    _ = exited.wait_for(|e| *e) => return,
                }
                signal_live(&live, key, Signal::SIGKILL);
            });
        }
    }

    /// Stops the workers of (job, run) now: SIGTERM, then SIGKILL after
    /// `kill_grace`.
    pub fn kill(&mut self, job: u64, run: u32) {
        self.stop_by(job, run, Instant::now());
    }

    /// The workers that run (not reaped yet), in order.
    pub fn running(&self) -> Vec<WorkerKey> {
        lock(&self.live).keys().copied().collect()
    }

    /// For a restarted agent: kills the workers recorded in the state dir
    /// (by an earlier supervisor) whose (job, run) `keep` no longer wants
    /// and whose process is still the recorded one — SIGTERM to the group,
    /// SIGKILL after `kill_grace` — and removes the records of dead workers.
    /// This supervisor's own workers are left alone (use [`Self::kill`]).
    /// Returns the pids it killed.
    pub async fn kill_orphans(&mut self, keep: &(dyn Fn(u64, u32) -> bool + Sync)) -> Vec<u32> {
        let own: BTreeSet<u32> = lock(&self.live).values().map(|w| w.pgid).collect();
        orphans::kill_unwanted(
            &self.cfg.state_dir,
            self.cfg.kill_grace,
            self.cfg.checkpoint_poll,
            keep,
            &own,
        )
        .await
    }
}

/// The workers of (job, run).
fn run_range(
    live: &std::collections::BTreeMap<WorkerKey, Live>,
    job: u64,
    run: u32,
) -> impl Iterator<Item = (&WorkerKey, &Live)> {
    let lo = WorkerKey { job, run, rank: 0 };
    let hi = WorkerKey {
        job,
        run,
        rank: u32::MAX,
    };
    live.range(lo..=hi)
}

/// Signals the worker's group while it is in the live map (its task removes
/// it right after reaping it). Returns whether a signal was delivered.
fn signal_live(live: &LiveMap, key: WorkerKey, sig: Signal) -> bool {
    match lock(live).get(&key) {
        Some(w) => orphans::signal_group(w.pgid, sig),
        None => false,
    }
}
