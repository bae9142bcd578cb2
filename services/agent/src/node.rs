//! The real node agent: one per node, NATS only (never Postgres). It
//! registers by sending its status, carries out the relay's orders with the
//! [`Supervisor`], and reports what its workers did.
//!
//! Owns: this node's registration epoch (`boot`, new at every start and
//! never lower than the last one, kept in the state dir), which GPU indices
//! each worker got, the stops it is carrying out (after a checkpoint, by a
//! deadline, past a max runtime), and answering log requests for its
//! workers.
//!
//! Must never: start a worker the orders do not name, keep running a worker
//! they no longer name, or append anything: the relay judges every report.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use gpusched_model::NodeSpec;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::net::NodeNet;
use crate::node_health::NodeHealth;
use crate::process::{
    log_paths, Supervisor, SupervisorConfig, WorkerFact, WorkerKey, WorkerReport, WorkerSpec,
};
use crate::protocol::{
    logs_subject, orders_subject, status_subject, Action, CheckpointSeen, Launch, LogChunk,
    LogRequest, NodeOrders, NodeStatus, WorkerOrder, WorkerState, WorkerStatus, PROTOCOL_VERSION,
};

/// One node as its agent runs it.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Node name (unique in the cluster).
    pub name: String,
    /// GPU flavor.
    pub flavor: String,
    /// The GPU indices this agent hands out (`CUDA_VISIBLE_DEVICES`).
    pub gpu_indices: Vec<u32>,
    /// Topology path, outermost first (e.g. `rack-1`, `block-2`).
    pub path: Vec<String>,
    /// Worker records and the boot counter.
    pub state_dir: PathBuf,
    /// Worker logs.
    pub log_dir: PathBuf,
    /// Checkpoints: `<dir>/job-<id>`, on storage every node of the flavor
    /// shares (a job resumes on another node from there).
    pub checkpoint_dir: PathBuf,
    /// Status sent at least this often (the heartbeat).
    pub heartbeat: Duration,
    /// SIGTERM to SIGKILL.
    pub kill_grace: Duration,
    /// Time a job past its max runtime gets to checkpoint before it is stopped.
    pub timeout_grace: Duration,
    /// Log files are rotated past this size.
    pub log_cap_bytes: u64,
    /// How often checkpoint dirs and logs are looked at.
    pub poll: Duration,
    /// Stop every worker when the agent stops (`gpusched dev`); a node
    /// agent leaves them running, like a kubelet, and its next start kills
    /// them.
    pub stop_workers_on_exit: bool,
}

impl NodeConfig {
    /// The node as the cluster sees it.
    pub fn spec(&self) -> NodeSpec {
        NodeSpec {
            name: self.name.clone(),
            flavor: self.flavor.clone(),
            gpus: u32::try_from(self.gpu_indices.len()).unwrap_or(u32::MAX),
            path: self.path.clone(),
        }
    }
}

fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

/// A boot number above every earlier one of this node (kept in the state
/// dir, so a clock set back cannot make a restarted agent look stale).
fn next_boot(state_dir: &std::path::Path) -> anyhow::Result<u64> {
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("--state-dir {}", state_dir.display()))?;
    let file = state_dir.join("boot");
    let last = std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let boot = now_ms().max(last + 1);
    std::fs::write(&file, boot.to_string())
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(boot)
}

/// What the agent knows of one worker beyond its status.
#[derive(Debug)]
struct Held {
    status: WorkerStatus,
    gpus: Vec<u32>,
    started: Option<Instant>,
    max_runtime: Option<Duration>,
    checkpoints: bool,
}

struct Agent {
    cfg: NodeConfig,
    boot: u64,
    sup: Supervisor,
    workers: BTreeMap<WorkerKey, Held>,
    /// Runs to stop as soon as a checkpoint completes.
    stop_on_checkpoint: BTreeSet<(u64, u32)>,
    /// When the agent signalled each of those runs to checkpoint.
    checkpoint_asked: BTreeMap<(u64, u32), Instant>,
    /// What the probes and metrics read.
    health: Arc<NodeHealth>,
    /// Runs being stopped (so an order repeated is not carried out twice).
    stopping: BTreeSet<(u64, u32)>,
    timed_out: BTreeSet<(u64, u32)>,
}

/// Runs the agent until `shutdown`. Workers keep running when it returns
/// (like a kubelet's); the next start kills them as orphans, since a new
/// registration makes the relay requeue what ran here.
///
/// `health` gets what the probes and metrics read ([`NodeHealth`]).
pub async fn run_node(
    cfg: NodeConfig,
    net: NodeNet,
    root: String,
    shutdown: CancellationToken,
    health: Arc<NodeHealth>,
) -> anyhow::Result<()> {
    let boot = next_boot(&cfg.state_dir)?;
    health.boot.store(boot, Ordering::Relaxed);
    health
        .gpus
        .store(cfg.gpu_indices.len() as u64, Ordering::Relaxed);
    health
        .heartbeat_ms
        .store(cfg.heartbeat.as_millis() as u64, Ordering::Relaxed);
    let (tx, mut reports) = mpsc::channel(1024);
    let mut sc = SupervisorConfig::new(cfg.state_dir.clone(), cfg.log_dir.clone());
    sc.kill_grace = cfg.kill_grace;
    sc.log_cap_bytes = cfg.log_cap_bytes;
    sc.checkpoint_poll = cfg.poll;
    let mut agent = Agent {
        boot,
        sup: Supervisor::new(sc, tx),
        workers: BTreeMap::new(),
        stop_on_checkpoint: BTreeSet::new(),
        checkpoint_asked: BTreeMap::new(),
        health: health.clone(),
        stopping: BTreeSet::new(),
        timed_out: BTreeSet::new(),
        cfg,
    };
    let killed = agent.sup.kill_orphans(&|_, _| false).await;
    if !killed.is_empty() {
        tracing::warn!(pids = ?killed, "killed workers of an earlier registration");
    }
    let mut orders = net
        .subscribe(orders_subject(&root, &agent.cfg.name))
        .await
        .context("subscribing to this node's orders")?;
    let mut logs = net
        .subscribe(logs_subject(&root, &agent.cfg.name))
        .await
        .context("subscribing to log requests")?;
    let status_to = status_subject(&root);
    tracing::info!(node = %agent.cfg.name, boot, gpus = ?agent.cfg.gpu_indices, "node agent registering");
    let mut beat = tokio::time::interval(agent.cfg.heartbeat);
    loop {
        health.beat(net.connected());
        let changed = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = beat.tick() => { agent.enforce_max_runtime(); true }
            Some(msg) = orders.next() => match serde_json::from_slice::<NodeOrders>(&msg.payload) {
                Ok(o) => {
                    if o.boot == agent.boot {
                        health.orders.fetch_add(1, Ordering::Relaxed);
                    }
                    agent.carry_out(o).await
                }
                Err(e) => {
                    health.orders_malformed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "malformed orders ignored");
                    false
                }
            },
            Some(r) = reports.recv() => { agent.on_report(r); true }
            Some(msg) = logs.next() => {
                if let Some(reply) = msg.reply {
                    let chunk = agent.read_log(&msg.payload);
                    let body = serde_json::to_vec(&chunk).unwrap_or_default();
                    let _ = net.publish(reply, body).await;
                }
                false
            }
        };
        if changed {
            let status = agent.status();
            let body = serde_json::to_vec(&status).context("encoding the status")?;
            let sent = net.publish(status_to.clone(), body).await;
            if let Err(e) = &sent {
                tracing::warn!(error = %e, "status not sent; the next heartbeat retries");
            }
            health.sent(&status, agent.busy_gpus(), sent.is_ok());
        }
    }
    net.flush().await;
    if agent.cfg.stop_workers_on_exit {
        agent.stop_all(&mut reports).await;
    }
    Ok(())
}

impl Agent {
    /// Stops every running worker and waits (a kill grace and a second at
    /// most) until they exited.
    async fn stop_all(&mut self, reports: &mut mpsc::Receiver<WorkerReport>) {
        let runs: BTreeSet<(u64, u32)> = self
            .workers
            .iter()
            .filter(|(_, h)| matches!(h.status.state, WorkerState::Running { .. }))
            .map(|(k, _)| (k.job, k.run))
            .collect();
        for (job, run) in &runs {
            self.sup.kill(*job, *run);
        }
        let until = Instant::now() + self.cfg.kill_grace + Duration::from_secs(1);
        while !self.sup.running().is_empty() && Instant::now() < until {
            if let Ok(Some(r)) = tokio::time::timeout_at(until.into(), reports.recv()).await {
                self.on_report(r);
            }
        }
    }

    /// GPUs held by running workers.
    fn busy_gpus(&self) -> usize {
        self.workers
            .values()
            .filter(|h| matches!(h.status.state, WorkerState::Running { .. }))
            .map(|h| h.gpus.len())
            .sum()
    }

    fn status(&self) -> NodeStatus {
        NodeStatus {
            version: PROTOCOL_VERSION,
            boot: self.boot,
            spec: self.cfg.spec(),
            // A worker being started is reported once its process runs
            // (or failed to start), never before.
            workers: self
                .workers
                .values()
                .filter(|h| !matches!(h.status.state, WorkerState::Running { pid: 0, .. }))
                .map(|h| h.status.clone())
                .collect(),
        }
    }

    /// Makes the node match the orders; true if anything changed.
    async fn carry_out(&mut self, orders: NodeOrders) -> bool {
        if orders.boot != self.boot || orders.version != PROTOCOL_VERSION {
            return false;
        }
        let named: BTreeSet<WorkerKey> = orders.workers.iter().map(|w| w.key).collect();
        let mut changed = self.drop_unnamed(&named);
        for order in orders.workers {
            changed |= self.carry_out_one(order).await;
        }
        changed
    }

    /// Stops workers the orders no longer name and forgets ended ones.
    fn drop_unnamed(&mut self, named: &BTreeSet<WorkerKey>) -> bool {
        let gone: Vec<WorkerKey> = self
            .workers
            .keys()
            .filter(|k| !named.contains(k))
            .copied()
            .collect();
        for key in &gone {
            if let Some(h) = self.workers.get(key) {
                if matches!(h.status.state, WorkerState::Running { .. }) {
                    self.sup.kill(key.job, key.run);
                    continue;
                }
            }
            self.workers.remove(key);
        }
        !gone.is_empty()
    }

    async fn carry_out_one(&mut self, order: WorkerOrder) -> bool {
        let key = order.key;
        let run = (key.job, key.run);
        match order.action {
            Action::Run => {
                if self.workers.contains_key(&key) {
                    return false;
                }
                self.start(key, &order.launch).await
            }
            Action::Stop {
                deadline_ms,
                checkpoint_first,
            } => {
                let running = self
                    .workers
                    .get(&key)
                    .is_some_and(|h| matches!(h.status.state, WorkerState::Running { .. }));
                if !running || !self.stopping.insert(run) {
                    return false;
                }
                if checkpoint_first && order.launch.checkpoints {
                    self.ask_checkpoint(run);
                    let left = Duration::from_millis(deadline_ms.saturating_sub(now_ms()));
                    let stop_at = Instant::now() + left.saturating_sub(self.cfg.kill_grace);
                    self.sup.stop_by(key.job, key.run, stop_at);
                } else {
                    // Nothing to save: the GPUs are released at once.
                    self.sup.kill(key.job, key.run);
                }
                false
            }
        }
    }

    /// GPU indices not held by a live worker, lowest first.
    fn free_gpus(&self) -> Vec<u32> {
        let held: BTreeSet<u32> = self
            .workers
            .values()
            .filter(|h| matches!(h.status.state, WorkerState::Running { .. }))
            .flat_map(|h| h.gpus.iter().copied())
            .collect();
        self.cfg
            .gpu_indices
            .iter()
            .copied()
            .filter(|g| !held.contains(g))
            .collect()
    }

    async fn start(&mut self, key: WorkerKey, launch: &Launch) -> bool {
        let free = self.free_gpus();
        let want = launch.gpus as usize;
        let mut held = Held {
            status: WorkerStatus {
                key,
                state: WorkerState::StartFailed {
                    reason: String::new(),
                },
                checkpoint: None,
            },
            gpus: Vec::new(),
            started: None,
            max_runtime: launch.max_runtime_s.map(Duration::from_secs),
            checkpoints: launch.checkpoints,
        };
        if launch.command.is_empty() {
            held.status.state = WorkerState::StartFailed {
                reason: "the job has no command to run (set \"command\" in its spec)".into(),
            };
        } else if free.len() < want {
            held.status.state = WorkerState::StartFailed {
                reason: format!("node has {} free GPUs, the worker needs {want}", free.len()),
            };
        } else {
            held.gpus = free[..want].to_vec();
            let spec = WorkerSpec {
                job: key.job,
                run: key.run,
                rank: key.rank,
                world_size: launch.world_size,
                local_rank: launch.local_rank,
                gpus: held.gpus.clone(),
                command: launch.command.clone(),
                env: launch.env.clone(),
                working_dir: launch.working_dir.as_ref().map(PathBuf::from),
                checkpoint_signal: launch.checkpoint_signal,
                checkpoint_dir: self.cfg.checkpoint_dir.join(format!("job-{}", key.job)),
                resume_from: launch.resume_from.as_ref().map(PathBuf::from),
                master_addr: launch.master_addr.clone(),
                master_port: launch.master_port,
            };
            // Running once the supervisor says it started.
            held.status.state = WorkerState::Running {
                pid: 0,
                started_ms: now_ms(),
            };
            self.workers.insert(key, held);
            self.sup.start(spec).await;
            return false;
        }
        self.workers.insert(key, held);
        true
    }

    fn on_report(&mut self, r: WorkerReport) {
        let key = r.worker;
        let run = (key.job, key.run);
        let Some(h) = self.workers.get_mut(&key) else {
            return;
        };
        match r.fact {
            WorkerFact::Started { pid } => {
                h.status.state = WorkerState::Running {
                    pid,
                    started_ms: now_ms(),
                };
                h.started = Some(Instant::now());
            }
            WorkerFact::StartFailed { reason } => {
                h.status.state = WorkerState::StartFailed { reason };
            }
            WorkerFact::CheckpointComplete {
                name,
                path,
                progress,
            } => {
                h.status.checkpoint = Some(CheckpointSeen {
                    name,
                    progress,
                    uri: path.display().to_string(),
                    completed_ms: now_ms(),
                });
                if let Some(asked) = self.checkpoint_asked.remove(&run) {
                    self.health.checkpoint_done(asked.elapsed());
                }
                if self.stop_on_checkpoint.remove(&run) {
                    self.sup.kill(key.job, key.run);
                }
            }
            WorkerFact::Exited { code, signal } => {
                // A checkpoint asked of a run that exited first never completes.
                self.checkpoint_asked.remove(&run);
                h.status.state = WorkerState::Exited {
                    code,
                    signal,
                    timed_out: self.timed_out.contains(&run),
                };
            }
        }
    }

    /// Signals a run to checkpoint, and stops it once one completes.
    fn ask_checkpoint(&mut self, run: (u64, u32)) {
        self.sup.request_checkpoint(run.0, run.1);
        self.stop_on_checkpoint.insert(run);
        self.checkpoint_asked
            .entry(run)
            .or_insert_with(Instant::now);
    }

    /// Runs past their max runtime are asked to checkpoint, then stopped.
    fn enforce_max_runtime(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        for (key, h) in &self.workers {
            let over = h
                .started
                .zip(h.max_runtime)
                .is_some_and(|(s, max)| now.duration_since(s) >= max);
            if over && matches!(h.status.state, WorkerState::Running { .. }) {
                due.push((*key, h.checkpoints));
            }
        }
        for (key, checkpoints) in due {
            let run = (key.job, key.run);
            if !self.timed_out.insert(run) {
                continue;
            }
            tracing::info!(
                job = key.job,
                run = key.run,
                "max runtime reached; stopping"
            );
            if checkpoints {
                self.ask_checkpoint(run);
                self.sup
                    .stop_by(key.job, key.run, now + self.cfg.timeout_grace);
            } else {
                self.sup.kill(key.job, key.run);
            }
        }
    }

    fn read_log(&self, payload: &[u8]) -> LogChunk {
        let fail = |e: String| LogChunk {
            text: String::new(),
            next_offset: 0,
            running: false,
            error: Some(e),
        };
        let req: LogRequest = match serde_json::from_slice(payload) {
            Ok(r) => r,
            Err(e) => return fail(format!("malformed log request: {e}")),
        };
        let paths = log_paths(&self.cfg.log_dir, req.key.job, req.key.run, req.key.rank);
        let path = if req.stream == "err" {
            paths.err
        } else {
            paths.out
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                return fail(format!(
                    "no log for job {} worker {}: {e}",
                    req.key.job, req.key.rank
                ))
            }
        };
        let start = usize::try_from(req.offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let max = usize::try_from(req.max_bytes).unwrap_or(usize::MAX);
        let end = start.saturating_add(max).min(bytes.len());
        LogChunk {
            text: String::from_utf8_lossy(&bytes[start..end]).into_owned(),
            next_offset: end as u64,
            running: self
                .workers
                .get(&req.key)
                .is_some_and(|h| matches!(h.status.state, WorkerState::Running { .. })),
            error: None,
        }
    }
}
