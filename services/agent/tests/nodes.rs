//! Real jobs through the whole scheduler: the admission, quota, placement
//! and preemption stages, the node relay and node agents in this process
//! (over the embedded log and the in-process node network), and every
//! worker a real child process (`tests/fixtures/trainer.sh`) with real
//! signals. GPU indices come from config; no GPU is needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use gpusched_agent::net::{LocalHub, NodeNet};
use gpusched_agent::node::{run_node, NodeConfig};
use gpusched_agent::protocol::{status_subject, NodeStatus, WorkerKey, WorkerState, WorkerStatus};
use gpusched_agent::relay::RelayConfig;
use gpusched_agent::relay_service::{serve_relay, RelayStats, RELAY_SERVICE};
use gpusched_core::{CycleConfig, Phase};
use gpusched_events::{Event, Outcome};
use gpusched_model::{CheckpointPolicy, FlavorQuota, JobId, JobSpec, QueueingMode, TenantSpec};
use gpusched_runtime::{
    bootstrap_cluster, read_view, run_service, Bus, Decider, Log, MemLog, ServiceConfig,
    ServiceStats,
};
use tokio_util::sync::CancellationToken;

const ROOT: &str = "t";
const FLAVOR: &str = "h100";

fn trainer() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/trainer.sh")
        .display()
        .to_string()
}

fn tenant(name: &str, nominal: u32) -> TenantSpec {
    TenantSpec {
        name: name.into(),
        cohort: Some("c".into()),
        weight: 1.0,
        queueing: QueueingMode::BestEffortFifo,
        quotas: vec![FlavorQuota {
            flavor: FLAVOR.into(),
            nominal,
            borrowing_limit: None,
            lending_limit: None,
        }],
        priority_preemption: false,
    }
}

/// A one-GPU-per-worker job running the trainer with these knobs.
fn job(tenant: &str, workers: u32, knobs: &[(&str, &str)]) -> JobSpec {
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
    }
}

struct Cluster {
    log: Log,
    net: NodeNet,
    gw: gpusched_gateway::Gateway,
    dir: tempfile::TempDir,
    relay: Arc<RelayStats>,
    shutdown: CancellationToken,
    agents: Vec<(String, CancellationToken)>,
}

fn spawn<D: Decider + 'static>(
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

fn node_config(dir: &Path, name: &str, gpus: u32) -> NodeConfig {
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
    }
}

impl Cluster {
    /// Tenants, the stages, the relay and one agent per node (one GPU each).
    async fn start(tenants: Vec<TenantSpec>, nodes: &[&str]) -> Cluster {
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
        let net = NodeNet::Local(LocalHub::new());
        let relay = Arc::new(RelayStats::default());
        let relay_cfg = RelayConfig {
            node_timeout_ms: 3_000,
            ..RelayConfig::default()
        };
        {
            let (log, bus, net, relay, shutdown) = (
                log.clone(),
                bus.clone(),
                net.clone(),
                relay.clone(),
                shutdown.clone(),
            );
            tokio::spawn(async move {
                let _ = serve_relay(
                    log,
                    bus,
                    net,
                    ROOT.into(),
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
        };
        for n in nodes {
            c.start_agent(n);
        }
        c.wait_for("every node registered", |c| c.nodes_ready() == nodes.len())
            .await;
        c
    }

    fn start_agent(&mut self, name: &str) {
        let token = self.shutdown.child_token();
        let cfg = node_config(self.dir.path(), name, 1);
        let (net, t) = (self.net.clone(), token.clone());
        tokio::spawn(async move {
            if let Err(e) = run_node(cfg, net, ROOT.into(), t).await {
                panic!("agent stopped: {e:#}");
            }
        });
        self.agents.push((name.to_string(), token));
    }

    fn nodes_ready(&self) -> usize {
        read_view(&self.gw.view)
            .state()
            .nodes()
            .iter()
            .filter(|n| n.status == gpusched_core::NodeStatus::Ready)
            .count()
    }

    async fn submit(&self, spec: JobSpec) -> JobId {
        self.gw
            .submitter
            .submit(spec, None)
            .await
            .expect("submitted")
            .job
    }

    fn phase(&self, job: JobId) -> Option<Phase> {
        read_view(&self.gw.view).state().job(job).map(|j| j.phase)
    }

    /// Waits (up to 60 s) until `cond` holds; panics with `what` otherwise.
    async fn wait_for(&self, what: &str, cond: impl Fn(&Cluster) -> bool) {
        for _ in 0..600 {
            if cond(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {what}; log:\n{}", self.dump().await);
    }

    async fn wait_phase(&self, job: JobId, phase: Phase) {
        self.wait_for(&format!("job {job} {phase:?}"), |c| {
            c.phase(job) == Some(phase)
        })
        .await;
    }

    async fn events(&self) -> Vec<Event> {
        self.log
            .read_from(0, 1_000_000)
            .await
            .expect("read the log")
            .into_iter()
            .map(|e| e.event)
            .collect()
    }

    async fn dump(&self) -> String {
        self.events()
            .await
            .iter()
            .map(|e| serde_json::to_string(e).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn explain(&self, job: JobId) -> String {
        let events = self.events().await;
        let view = read_view(&self.gw.view);
        gpusched_core::explain::history(&events, view.state(), job).join("\n")
    }

    /// A worker's stdout, from its agent's log dir.
    fn stdout(&self, node: &str, job: JobId, run: u32, rank: u32) -> String {
        let p = gpusched_agent::process::log_paths(
            &self.dir.path().join(node).join("logs"),
            job.0,
            run,
            rank,
        );
        std::fs::read_to_string(p.out).unwrap_or_default()
    }

    fn node_of(&self, job: JobId, rank: usize) -> String {
        let v = read_view(&self.gw.view);
        let s = v.state();
        let j = s.job(job).expect("job");
        let node = j.assignments[rank].node;
        s.nodes()[node.index()].spec.name.clone()
    }

    fn boot_of(&self, node: &str) -> u64 {
        let p: PathBuf = self.dir.path().join(node).join("state").join("boot");
        std::fs::read_to_string(p)
            .expect("boot file")
            .trim()
            .parse()
            .expect("boot number")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn dump(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| serde_json::to_string(e).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn finished(events: &[Event], job: JobId) -> Option<&Event> {
    events
        .iter()
        .find(|e| matches!(e, Event::JobFinished { job: j, .. } if *j == job))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exit_zero_succeeds_and_exit_three_fails_with_its_code() {
    let c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let ok = c
        .submit(job(
            "a",
            1,
            &[("TRAINER_STEPS", "3"), ("TRAINER_STEP_S", "0.05")],
        ))
        .await;
    let bad = c
        .submit(job(
            "a",
            1,
            &[
                ("TRAINER_STEPS", "2"),
                ("TRAINER_STEP_S", "0.05"),
                ("TRAINER_EXIT", "3"),
            ],
        ))
        .await;
    c.wait_phase(ok, Phase::Succeeded).await;
    c.wait_phase(bad, Phase::Failed).await;
    let events = c.events().await;
    match finished(&events, bad) {
        Some(Event::JobFinished { outcome, exits, .. }) => {
            assert_eq!(*outcome, Outcome::Failed);
            assert_eq!(exits.len(), 1);
            assert_eq!(exits[0].code, Some(3));
        }
        other => panic!("no JobFinished for the failing job: {other:?}"),
    }
    assert!(
        c.explain(bad).await.contains("worker 0 exited with code 3"),
        "{}",
        c.explain(bad).await
    );
    // The worker really ran: its output is on its node.
    let node = events
        .iter()
        .find_map(|e| match e {
            Event::JobBound {
                job, assignments, ..
            } if *job == ok => Some(assignments[0].node),
            _ => None,
        })
        .expect("bound");
    let name = read_view(&c.gw.view).state().nodes()[node.index()]
        .spec
        .name
        .clone();
    let out = c.stdout(&name, ok, 1, 0);
    assert!(out.contains("step 3"), "{out}");
    assert!(out.contains("CUDA_VISIBLE_DEVICES=0"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_that_cannot_start_fails_the_job_with_the_reason() {
    let c = Cluster::start(vec![tenant("a", 1)], &["n1"]).await;
    let mut spec = job("a", 1, &[]);
    spec.command = vec!["no-such-trainer-binary".into()];
    let id = c.submit(spec).await;
    c.wait_phase(id, Phase::Failed).await;
    let text = c.explain(id).await;
    assert!(text.contains("no-such-trainer-binary"), "{text}");
    assert!(text.contains("not found"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gang_on_two_nodes_shares_fate() {
    let c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let id = c
        .submit(job(
            "a",
            2,
            &[("TRAINER_STEPS", "100000"), ("TRAINER_STEP_S", "0.1")],
        ))
        .await;
    c.wait_phase(id, Phase::Running).await;
    let (n0, n1) = (c.node_of(id, 0), c.node_of(id, 1));
    assert_ne!(n0, n1, "one worker per node");
    c.wait_for("both workers printed their env", |c| {
        c.stdout(&n0, id, 1, 0).contains("step 1") && c.stdout(&n1, id, 1, 1).contains("step 1")
    })
    .await;
    let (o0, o1) = (c.stdout(&n0, id, 1, 0), c.stdout(&n1, id, 1, 1));
    assert!(o0.contains("RANK=0") && o1.contains("RANK=1"), "{o0}\n{o1}");
    for o in [&o0, &o1] {
        assert!(o.contains("WORLD_SIZE=2"), "{o}");
        assert!(o.contains(&format!("MASTER_ADDR={n0}")), "{o}");
        assert!(o.contains("CUDA_VISIBLE_DEVICES=0"), "{o}");
    }
    let port = |o: &str| {
        o.lines()
            .find(|l| l.starts_with("MASTER_PORT="))
            .map(str::to_string)
    };
    assert_eq!(port(&o0), port(&o1));

    // Kill rank 1: the job fails and rank 0 is stopped too.
    let record = |node: &str, rank: u32| -> u32 {
        let p = c
            .dir
            .path()
            .join(node)
            .join("state/workers")
            .join(format!("{}-1-{rank}.json", id.0));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).expect("worker record"))
                .expect("record json");
        v["pid"].as_u64().expect("pid") as u32
    };
    let (pid0, pid1) = (record(&n0, 0), record(&n1, 1));
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid1.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    c.wait_phase(id, Phase::Failed).await;
    let events = c.events().await;
    match finished(&events, id) {
        Some(Event::JobFinished { exits, .. }) => {
            assert!(
                exits.iter().any(|e| e.rank == 1 && e.signal == Some(9)),
                "{exits:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    c.wait_for("rank 0 stopped", |_| {
        !Path::new(&format!("/proc/{pid0}")).exists()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_reports_are_refused_counted_and_never_appended() {
    let c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let id = c
        .submit(job(
            "a",
            1,
            &[("TRAINER_STEPS", "2"), ("TRAINER_STEP_S", "0.05")],
        ))
        .await;
    c.wait_phase(id, Phase::Succeeded).await;
    // Settle: nothing else happens now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = c.events().await.len();
    let refused = c.relay.refused.load(Ordering::Relaxed);
    let other = if c.node_of_finished(id).await == "n1" {
        "n2"
    } else {
        "n1"
    };
    let spec = read_view(&c.gw.view).state().nodes()[read_view(&c.gw.view)
        .state()
        .node_id(other)
        .expect("node")
        .index()]
    .spec
    .clone();
    let forged = |boot: u64, job: u64, run: u32| NodeStatus {
        version: gpusched_agent::protocol::PROTOCOL_VERSION,
        boot,
        spec: spec.clone(),
        workers: vec![WorkerStatus {
            key: WorkerKey { job, run, rank: 0 },
            state: WorkerState::Running {
                pid: 4242,
                started_ms: 0,
            },
            checkpoint: None,
        }],
    };
    let boot = c.boot_of(other);
    for s in [
        forged(boot, 999, 1),      // a job that does not exist
        forged(boot, id.0, 1),     // a job that ran elsewhere and ended
        forged(boot - 1, id.0, 1), // an older registration
    ] {
        c.net
            .publish(status_subject(ROOT), serde_json::to_vec(&s).expect("json"))
            .await
            .expect("publish");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    c.wait_for("three refusals", |c| {
        c.relay.refused.load(Ordering::Relaxed) >= refused + 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.events().await.len(), before, "nothing appended");
    assert_eq!(c.phase(id), Some(Phase::Succeeded));
    assert_eq!(c.nodes_ready(), 2, "no node lost or re-added");
}

impl Cluster {
    async fn node_of_finished(&self, job: JobId) -> String {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_its_max_runtime_a_job_checkpoints_stops_and_times_out() {
    let c = Cluster::start(vec![tenant("a", 1)], &["n1"]).await;
    let mut spec = job(
        "a",
        1,
        &[("TRAINER_STEPS", "100000"), ("TRAINER_STEP_S", "0.1")],
    );
    spec.max_runtime_s = Some(2);
    spec.checkpoint = Some(CheckpointPolicy {
        interval_s: 3600,
        duration_s: 1,
    });
    let id = c.submit(spec).await;
    c.wait_phase(id, Phase::Failed).await;
    let events = c.events().await;
    match finished(&events, id) {
        Some(Event::JobFinished { outcome, .. }) => assert_eq!(*outcome, Outcome::TimedOut),
        other => panic!("{other:?}"),
    }
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::JobCheckpointed { job, .. } if *job == id)),
        "the job checkpointed before it was stopped"
    );
    assert!(c.explain(id).await.contains("timed out"));
}

impl Cluster {
    /// Stops an agent as a crash would: no more statuses, its workers keep
    /// running.
    fn stop_agent(&mut self, name: &str) {
        for (n, t) in &self.agents {
            if n == name {
                t.cancel();
            }
        }
    }

    /// The run number of the job's current (or last) run.
    fn run_of(&self, job: JobId) -> u32 {
        read_view(&self.gw.view)
            .state()
            .job(job)
            .map_or(0, |j| j.starts)
    }

    fn pid_of(&self, node: &str, job: JobId, run: u32, rank: u32) -> Option<u32> {
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

fn checkpointing(mut spec: JobSpec) -> JobSpec {
    spec.checkpoint = Some(CheckpointPolicy {
        interval_s: 3600,
        duration_s: 1,
    });
    spec
}

/// The step a run's stdout says it resumed at.
fn resumed_at(out: &str) -> Option<u64> {
    out.lines()
        .find_map(|l| l.strip_prefix("resumed at step "))
        .and_then(|s| s.trim().parse().ok())
}

/// The plan that preempted a job of `tenant`: (victim, deadline).
fn victim_of(events: &[Event]) -> Option<(JobId, gpusched_model::Timestamp)> {
    events.iter().find_map(|e| match e {
        Event::PreemptionPlanned { victims, .. } => victims.first().map(|v| (v.job, v.deadline)),
        _ => None,
    })
}

/// Two borrowers' jobs fill both nodes; the owner returns and reclaims one.
async fn reclaim(knobs: &[(&str, &str)], after_checkpoint: bool) -> (Cluster, JobId, JobId, JobId) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reclaimed_victim_checkpoints_frees_its_gpus_early_and_resumes_where_it_stopped() {
    let (c, b1, b2, owner) = reclaim(
        &[
            ("TRAINER_STEPS", "80"),
            ("TRAINER_STEP_S", "0.05"),
            ("TRAINER_EXIT_ON_CHECKPOINT", "1"),
        ],
        false,
    )
    .await;
    c.wait_phase(owner, Phase::Succeeded).await;
    let events = c.events().await;
    let (victim, deadline) = victim_of(&events).expect("a preemption was planned");
    assert!(victim == b1 || victim == b2);
    let preempted_at = events
        .iter()
        .find_map(|e| match e {
            Event::JobPreempted { job, at, .. } if *job == victim => Some(*at),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the victim was not preempted:\n{}", dump(&events)));
    assert!(
        preempted_at < deadline,
        "GPUs freed at {preempted_at:?}, before the deadline {deadline:?}"
    );
    // Its checkpoint, written on the signal, is what it resumes from.
    let first_node = events
        .iter()
        .find_map(|e| match e {
            Event::JobBound {
                job, assignments, ..
            } if *job == victim => Some(assignments[0].node),
            _ => None,
        })
        .expect("bound");
    let first_node = read_view(&c.gw.view).state().nodes()[first_node.index()]
        .spec
        .name
        .clone();
    let run1 = c.stdout(&first_node, victim, 1, 0);
    let k: u64 = run1
        .lines()
        .find_map(|l| l.strip_prefix("checkpoint step-"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint in run 1:\n{run1}"));
    c.wait_phase(victim, Phase::Succeeded).await;
    assert_eq!(c.run_of(victim), 2);
    let node2 = c.node_of_finished_run(victim, 2).await;
    let run2 = c.stdout(&node2, victim, 2, 0);
    assert_eq!(resumed_at(&run2), Some(k), "{run2}");
    assert!(run2.contains(&format!("step {}", k + 1)), "{run2}");
    assert!(!run2.contains("step 1\n") || k == 0, "{run2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_victim_that_ignores_the_signal_is_killed_at_the_deadline_and_resumes_from_its_last_complete_checkpoint(
) {
    let (c, b1, b2, owner) = reclaim(
        &[
            ("TRAINER_STEPS", "200"),
            ("TRAINER_STEP_S", "0.05"),
            ("TRAINER_CHECKPOINT_EVERY", "10"),
            ("TRAINER_CHECKPOINT_UNTIL", "10"),
            ("TRAINER_IGNORE_SIGNAL", "1"),
            ("TRAINER_IGNORE_TERM", "1"),
        ],
        true,
    )
    .await;
    // A half-written checkpoint (no marker) of each borrower, from a crash.
    for j in [b1, b2] {
        let d = c
            .dir
            .path()
            .join(format!("checkpoints/job-{}/step-999", j.0));
        std::fs::create_dir_all(&d).expect("half checkpoint");
        std::fs::write(d.join("state"), "999").expect("half checkpoint");
    }
    c.wait_phase(owner, Phase::Succeeded).await;
    let events = c.events().await;
    let (victim, deadline) = victim_of(&events).expect("a preemption was planned");
    let preempted_at = events
        .iter()
        .find_map(|e| match e {
            Event::JobPreempted { job, at, .. } if *job == victim => Some(*at),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the victim was not preempted:\n{}", dump(&events)));
    assert!(
        preempted_at >= deadline,
        "stopped only at its deadline:\n{}",
        dump(&events)
    );
    c.wait_for("the victim's second run", |c| c.run_of(victim) == 2)
        .await;
    let node2 = c.node_of_finished_run(victim, 2).await;
    c.wait_for("the second run resumed", |c| {
        resumed_at(&c.stdout(&node2, victim, 2, 0)).is_some()
    })
    .await;
    let run2 = c.stdout(&node2, victim, 2, 0);
    let k = resumed_at(&run2).unwrap_or_else(|| panic!("did not resume:\n{run2}"));
    assert_eq!(k, 10, "resumed from its last marked checkpoint: {run2}");
    assert!(!run2.contains("step-999"), "{run2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_agent_loses_its_node_the_job_resumes_elsewhere_and_the_restarted_agent_kills_the_orphan(
) {
    let mut c = Cluster::start(vec![tenant("a", 2)], &["n1", "n2"]).await;
    let id = c
        .submit(checkpointing(job(
            "a",
            1,
            &[
                ("TRAINER_STEPS", "100000"),
                ("TRAINER_STEP_S", "0.05"),
                ("TRAINER_CHECKPOINT_EVERY", "10"),
            ],
        )))
        .await;
    c.wait_phase(id, Phase::Running).await;
    let first = c.node_of(id, 0);
    c.wait_for("a complete checkpoint", |c| {
        read_view(&c.gw.view)
            .state()
            .job(id)
            .is_some_and(|j| j.last_checkpoint.is_some())
    })
    .await;
    let orphan = c.pid_of(&first, id, 1, 0).expect("worker record");
    c.stop_agent(&first);
    c.wait_for("the node lost", |c| {
        read_view(&c.gw.view)
            .state()
            .node_id(&first)
            .is_some_and(|n| {
                read_view(&c.gw.view).state().nodes()[n.index()].status
                    == gpusched_core::NodeStatus::Lost
            })
    })
    .await;
    c.wait_for("the job running again elsewhere", |c| {
        c.phase(id) == Some(Phase::Running) && c.run_of(id) == 2
    })
    .await;
    let second = c.node_of(id, 0);
    assert_ne!(second, first);
    c.wait_for("run 2 resumed", |c| {
        resumed_at(&c.stdout(&second, id, 2, 0)).is_some()
    })
    .await;
    assert!(
        Path::new(&format!("/proc/{orphan}")).exists(),
        "the orphan runs until its agent is back"
    );
    c.start_agent(&first);
    c.wait_for("the orphan killed", |_| {
        !Path::new(&format!("/proc/{orphan}")).exists()
    })
    .await;
    c.wait_for("the node back", |c| c.nodes_ready() == 2).await;
}

impl Cluster {
    async fn node_of_finished_run(&self, job: JobId, run: u32) -> String {
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
