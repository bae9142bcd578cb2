//! The harness of the node tests and the preemption benchmark
//! (`examples/preemption_latency.rs`): the admission, quota, placement and
//! preemption stages, the node relay and node agents in one process over
//! the embedded log (and the in-process node network, or NATS); every
//! worker a real child process (`tests/fixtures/trainer.sh`) with real
//! signals. GPU indices come from config; no GPU is needed.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpusched_agent::net::{LocalHub, NodeNet};
use gpusched_agent::node::{run_node, NodeConfig};
use gpusched_agent::node_health::NodeHealth;
use gpusched_agent::relay::RelayConfig;
use gpusched_agent::relay_service::{serve_relay, RelayStats, RELAY_SERVICE};
use gpusched_core::{CycleConfig, Phase};
use gpusched_events::Event;
use gpusched_model::{CheckpointPolicy, FlavorQuota, JobId, JobSpec, QueueingMode, TenantSpec};
use gpusched_runtime::{
    bootstrap_cluster, read_view, run_service, Bus, Decider, Log, MemLog, ServiceConfig,
    ServiceStats,
};
use tokio_util::sync::CancellationToken;

pub const ROOT: &str = "t";

pub const FLAVOR: &str = "h100";

pub fn trainer() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/trainer.sh")
        .display()
        .to_string()
}

pub fn tenant(name: &str, nominal: u32) -> TenantSpec {
    TenantSpec {
        cohort: Some("c".into()),
        queueing: QueueingMode::BestEffortFifo,
        priority_preemption: false,
        ..TenantSpec::new(name, vec![FlavorQuota::new(FLAVOR, nominal)])
    }
}

/// A one-GPU-per-worker job running the trainer with these knobs.
pub fn job(tenant: &str, workers: u32, knobs: &[(&str, &str)]) -> JobSpec {
    let env: BTreeMap<String, String> = knobs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    JobSpec {
        tenant: tenant.into(),
        priority: 0,
        workers,
        gpus_per_worker: 1,
        flavors: vec![],
        topology: "any".into(),
        preemptible: true,
        checkpoint: None,
        max_runtime_s: None,
        command: vec!["sh".into(), trainer()],
        env,
        working_dir: None,
        checkpoint_signal: None,
        array: None,
        after_ok: Vec::new(),
        after: Vec::new(),
    }
}

pub struct Cluster {
    pub log: Log,
    pub net: NodeNet,
    pub gw: gpusched_gateway::Gateway,
    pub dir: tempfile::TempDir,
    pub relay: Arc<RelayStats>,
    pub shutdown: CancellationToken,
    pub agents: Vec<(String, CancellationToken)>,
    /// What each agent's probes and metrics read, by node name (the latest
    /// start's).
    pub health: BTreeMap<String, Arc<NodeHealth>>,
    pub root: String,
}

pub fn spawn<D: Decider + 'static>(
    name: &str,
    log: &Log,
    bus: &Bus,
    make: impl Fn() -> D + Send + 'static,
    shutdown: &CancellationToken,
) {
    let cfg = ServiceConfig::new(name, "test");
    let (log, bus, shutdown) = (log.clone(), bus.clone(), shutdown.clone());
    tokio::spawn(async move {
        let _ = run_service(
            log,
            bus,
            cfg,
            make,
            shutdown,
            Arc::new(ServiceStats::default()),
        )
        .await;
    });
}

pub fn node_config(dir: &Path, name: &str, gpus: u32) -> NodeConfig {
    NodeConfig {
        name: name.into(),
        flavor: FLAVOR.into(),
        gpu_indices: (0..gpus).collect(),
        path: vec![],
        state_dir: dir.join(name).join("state"),
        log_dir: dir.join(name).join("logs"),
        checkpoint_dir: dir.join("checkpoints"),
        heartbeat: Duration::from_millis(300),
        kill_grace: Duration::from_millis(500),
        timeout_grace: Duration::from_secs(2),
        log_cap_bytes: 1 << 20,
        poll: Duration::from_millis(100),
        stop_workers_on_exit: false,
    }
}

impl Cluster {
    /// Tenants, the stages, the relay and one agent per node (one GPU each).
    pub async fn start(tenants: Vec<TenantSpec>, nodes: &[&str]) -> Cluster {
        Cluster::start_on(tenants, nodes, NodeNet::Local(LocalHub::new()), ROOT).await
    }

    /// The same over a given node network and subject root.
    pub async fn start_on(
        tenants: Vec<TenantSpec>,
        nodes: &[&str],
        net: NodeNet,
        root: &str,
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = Log::Memory(MemLog::new());
        let bus = Bus::memory();
        let mut config = vec![Event::TopologyConfigured { levels: vec![] }];
        config.extend(
            tenants
                .into_iter()
                .map(|spec| Event::TenantConfigured { spec }),
        );
        bootstrap_cluster(&log, &bus, &config, "test")
            .await
            .expect("configure");
        let shutdown = CancellationToken::new();
        let mut cycle = CycleConfig::default();
        cycle.preemption.min_runtime_ms = 0;
        cycle.preemption.wait_window_ms = 0;
        cycle.preemption.grace_ms = 3_000;
        spawn(
            gpusched_admission::SERVICE,
            &log,
            &bus,
            move || gpusched_admission::AdmissionStage::new(cycle.max_validations),
            &shutdown,
        );
        spawn(
            gpusched_quota::SERVICE,
            &log,
            &bus,
            move || gpusched_quota::QuotaStage::new(cycle),
            &shutdown,
        );
        spawn(
            gpusched_placement::SERVICE,
            &log,
            &bus,
            move || gpusched_placement::PlacementStage::new(cycle),
            &shutdown,
        );
        spawn(
            gpusched_preemption::SERVICE,
            &log,
            &bus,
            move || gpusched_preemption::PreemptionStage::new(cycle),
            &shutdown,
        );
        let relay = Arc::new(RelayStats::default());
        let relay_cfg = RelayConfig {
            node_timeout_ms: 3_000,
            ..RelayConfig::default()
        };
        {
            let (log, bus, net, relay, shutdown, root) = (
                log.clone(),
                bus.clone(),
                net.clone(),
                relay.clone(),
                shutdown.clone(),
                root.to_string(),
            );
            tokio::spawn(async move {
                let _ = serve_relay(
                    log,
                    bus,
                    net,
                    root,
                    relay_cfg,
                    ServiceConfig::new(RELAY_SERVICE, "test"),
                    shutdown,
                    relay,
                )
                .await;
            });
        }
        let (gw, _) = gpusched_gateway::start(
            log.clone(),
            bus.clone(),
            "test",
            gpusched_gateway::Tokens::default(),
            shutdown.clone(),
        );
        let mut c = Cluster {
            log,
            net,
            gw,
            dir,
            relay,
            shutdown,
            agents: Vec::new(),
            health: BTreeMap::new(),
            root: root.to_string(),
        };
        for n in nodes {
            c.start_agent(n);
        }
        c.wait_for("every node registered", |c| c.nodes_ready() == nodes.len())
            .await;
        c
    }

    pub fn start_agent(&mut self, name: &str) {
        let token = self.shutdown.child_token();
        let cfg = node_config(self.dir.path(), name, 1);
        let (net, t, root) = (self.net.clone(), token.clone(), self.root.clone());
        let health = Arc::new(NodeHealth::default());
        self.health.insert(name.to_string(), health.clone());
        tokio::spawn(async move {
            if let Err(e) = run_node(cfg, net, root, t, health).await {
                panic!("agent stopped: {e:#}");
            }
        });
        self.agents.push((name.to_string(), token));
    }

    pub fn nodes_ready(&self) -> usize {
        read_view(&self.gw.view)
            .state()
            .nodes()
            .iter()
            .filter(|n| n.status == gpusched_core::NodeStatus::Ready)
            .count()
    }

    pub async fn submit(&self, spec: JobSpec) -> JobId {
        self.gw
            .submitter
            .submit(spec, None)
            .await
            .expect("submitted")
            .job
    }

    pub fn phase(&self, job: JobId) -> Option<Phase> {
        read_view(&self.gw.view).state().job(job).map(|j| j.phase)
    }

    /// Waits (up to 60 s) until `cond` holds; panics with `what` otherwise.
    pub async fn wait_for(&self, what: &str, cond: impl Fn(&Cluster) -> bool) {
        for _ in 0..600 {
            if cond(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {what}; log:\n{}", self.dump().await);
    }

    pub async fn wait_phase(&self, job: JobId, phase: Phase) {
        self.wait_for(&format!("job {job} {phase:?}"), |c| {
            c.phase(job) == Some(phase)
        })
        .await;
    }

    pub async fn events(&self) -> Vec<Event> {
        self.log
            .read_from(0, 1_000_000)
            .await
            .expect("read the log")
            .into_iter()
            .map(|e| e.event)
            .collect()
    }

    pub async fn dump(&self) -> String {
        self.events()
            .await
            .iter()
            .map(|e| serde_json::to_string(e).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub async fn explain(&self, job: JobId) -> String {
        let events = self.events().await;
        let view = read_view(&self.gw.view);
        gpusched_core::explain::history(&events, view.state(), job).join("\n")
    }

    /// A worker's stdout, from its agent's log dir.
    pub fn stdout(&self, node: &str, job: JobId, run: u32, rank: u32) -> String {
        let p = gpusched_agent::process::log_paths(
            &self.dir.path().join(node).join("logs"),
            job.0,
            run,
            rank,
        );
        std::fs::read_to_string(p.out).unwrap_or_default()
    }

    pub fn node_of(&self, job: JobId, rank: usize) -> String {
        let v = read_view(&self.gw.view);
        let s = v.state();
        let j = s.job(job).expect("job");
        let node = j.assignments[rank].node;
        s.nodes()[node.index()].spec.name.clone()
    }

    pub fn boot_of(&self, node: &str) -> u64 {
        let p: PathBuf = self.dir.path().join(node).join("state").join("boot");
        std::fs::read_to_string(p)
            .expect("boot file")
            .trim()
            .parse()
            .expect("boot number")
    }
}

impl Drop for Cluster {
    /// Stops everything, and every worker still running (the agents leave
    /// theirs running, as a crashed agent would): a test leaves no process.
    fn drop(&mut self) {
        self.shutdown.cancel();
        let Ok(nodes) = std::fs::read_dir(self.dir.path()) else {
            return;
        };
        for node in nodes.flatten() {
            let Ok(records) = std::fs::read_dir(node.path().join("state/workers")) else {
                continue;
            };
            for r in records.flatten() {
                let pgid = std::fs::read_to_string(r.path())
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .and_then(|v| v["pgid"].as_u64());
                if let Some(pgid) = pgid.filter(|p| *p > 1) {
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", "--", &format!("-{pgid}")])
                        .stderr(std::process::Stdio::null())
                        .status();
                }
            }
        }
    }
}

pub fn dump(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn finished(events: &[Event], job: JobId) -> Option<&Event> {
    events
        .iter()
        .find(|e| matches!(e, Event::JobFinished { job: j, .. } if *j == job))
}

impl Cluster {
    pub async fn node_of_finished(&self, job: JobId) -> String {
        let events = self.events().await;
        let node = events
            .iter()
            .find_map(|e| match e {
                Event::JobBound {
                    job: j,
                    assignments,
                    ..
                } if *j == job => Some(assignments[0].node),
                _ => None,
            })
            .expect("bound");
        read_view(&self.gw.view).state().nodes()[node.index()]
            .spec
            .name
            .clone()
    }
}

impl Cluster {
    /// Stops an agent as a crash would: no more statuses, its workers keep
    /// running.
    pub fn stop_agent(&mut self, name: &str) {
        for (n, t) in &self.agents {
            if n == name {
                t.cancel();
            }
        }
    }

    /// The run number of the job's current (or last) run.
    pub fn run_of(&self, job: JobId) -> u32 {
        read_view(&self.gw.view)
            .state()
            .job(job)
            .map_or(0, |j| j.starts)
    }

    pub fn pid_of(&self, node: &str, job: JobId, run: u32, rank: u32) -> Option<u32> {
        let p = self
            .dir
            .path()
            .join(node)
            .join("state/workers")
            .join(format!("{}-{run}-{rank}.json", job.0));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()?;
        v["pid"].as_u64().map(|p| p as u32)
    }
}

pub fn checkpointing(mut spec: JobSpec) -> JobSpec {
    spec.checkpoint = Some(CheckpointPolicy {
        interval_s: 3600,
        duration_s: 1,
    });
    spec
}

/// The step a run's stdout says it resumed at.
pub fn resumed_at(out: &str) -> Option<u64> {
    out.lines()
        .find_map(|l| l.strip_prefix("resumed at step "))
        .and_then(|s| s.trim().parse().ok())
}

/// The plan that preempted a job of `tenant`: (victim, deadline).
pub fn victim_of(events: &[Event]) -> Option<(JobId, gpusched_model::Timestamp)> {
    events.iter().find_map(|e| match e {
        Event::PreemptionPlanned { victims, .. } => victims.first().map(|v| (v.job, v.deadline)),
        _ => None,
    })
}

/// Two borrowers' jobs fill both nodes; the owner returns and reclaims one.
pub async fn reclaim(
    knobs: &[(&str, &str)],
    after_checkpoint: bool,
) -> (Cluster, JobId, JobId, JobId) {
    let c = Cluster::start(vec![tenant("owner", 1), tenant("b", 1)], &["n1", "n2"]).await;
    let b1 = c.submit(checkpointing(job("b", 1, knobs))).await;
    let b2 = c.submit(checkpointing(job("b", 1, knobs))).await;
    for j in [b1, b2] {
        c.wait_phase(j, Phase::Running).await;
    }
    c.wait_for("both borrowers stepping", |c| {
        [b1, b2].iter().all(|j| {
            let n = c.node_of(*j, 0);
            c.stdout(&n, *j, 1, 0).contains("step 3")
        })
    })
    .await;
    if after_checkpoint {
        c.wait_for("both borrowers checkpointed", |c| {
            let v = read_view(&c.gw.view);
            [b1, b2].iter().all(|j| {
                v.state()
                    .job(*j)
                    .is_some_and(|x| x.last_checkpoint.is_some())
            })
        })
        .await;
    }
    let owner = c
        .submit(job(
            "owner",
            1,
            &[("TRAINER_STEPS", "3"), ("TRAINER_STEP_S", "0.05")],
        ))
        .await;
    (c, b1, b2, owner)
}

impl Cluster {
    pub async fn node_of_finished_run(&self, job: JobId, run: u32) -> String {
        let events = self.events().await;
        let node = events
            .iter()
            .filter_map(|e| match e {
                Event::JobBound {
                    job: j,
                    assignments,
                    ..
                } if *j == job => Some(assignments[0].node),
                _ => None,
            })
            .nth(run as usize - 1)
            .expect("bound that many times");
        read_view(&self.gw.view).state().nodes()[node.index()]
            .spec
            .name
            .clone()
    }
}
