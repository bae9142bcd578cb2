//! `gpusched dev`: every service in one process, over the embedded log and
//! an in-process bus by default, with simulated nodes and a demo workload.
//!
//! The services are the same loops the separate binaries run
//! (`gpusched_runtime::run_service` around each service's decider); only
//! the log and the bus handles differ. `--database-url` and `--nats-url`
//! put the same run on real Postgres and NATS.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpusched_agent::net::{LocalHub, NodeNet};
use gpusched_agent::node::{run_node, NodeConfig};
use gpusched_agent::relay::RelayConfig;
use gpusched_agent::relay_service::{serve_relay, RelayStats, RELAY_SERVICE};
use gpusched_agent::SimulatedAgent;
use gpusched_core::{CycleConfig, Phase};
use gpusched_runtime::{
    bootstrap_cluster, read_view, run_service, Bus, Decider, Log, MemLog, Projection,
    ServiceConfig, ServiceStats,
};
use gpusched_sim::workload::{self, SyntheticOptions};
use gpusched_store::EventStore;
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

/// How often a run whose stderr is not a terminal prints a progress line.
const PROGRESS_LINE_EVERY: Duration = Duration::from_secs(5);

#[derive(clap::Args)]
pub struct DevArgs {
    /// Jobs to submit from the demo workload (synthetic beyond its 400);
    /// 0 submits none (submit your own through the API).
    #[arg(long, default_value_t = 400)]
    jobs: usize,
    /// Stop once every submitted job has ended, and print the summary.
    #[arg(long)]
    exit_when_done: bool,
    /// Cluster file (default: the built-in demo cluster).
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Simulated time runs this many times faster than wall time.
    #[arg(long, default_value_t = 3600.0)]
    time_scale: f64,
    /// Serve the HTTP API here.
    #[arg(long, env = "GPUSCHED_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Do not serve the HTTP API.
    #[arg(long)]
    no_api: bool,
    #[command(flatten)]
    auth: gpusched_gateway::AuthArgs,
    /// Use this Postgres event log instead of the embedded one.
    #[arg(long)]
    database_url: Option<String>,
    /// Use this NATS server instead of the in-process bus.
    #[arg(long)]
    nats_url: Option<String>,
    /// Subject and stream root on NATS.
    #[arg(long, default_value = "gpusched")]
    namespace: String,
    /// Workload seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Who runs the jobs: `simulated` plays them in scaled time;
    /// `process` runs each job's command as real processes on fake nodes of
    /// the cluster (one in-process node agent per node and the node relay).
    #[arg(long, value_enum, default_value = "simulated")]
    agents: Agents,
    /// Process agents keep worker state, logs and checkpoints here
    /// (default: a new directory under the system's temporary directory).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

/// Who runs the jobs in `gpusched dev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Agents {
    /// The simulated agent (scaled time, no processes).
    Simulated,
    /// Real processes on fake nodes.
    Process,
}

fn spawn_service<D: Decider + 'static, F: Fn() -> D + Send + 'static>(
    name: &str,
    log: &Log,
    bus: &Bus,
    make: F,
    shutdown: &CancellationToken,
    all: &mut Vec<(String, Arc<ServiceStats>)>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) {
    let stats = Arc::new(ServiceStats::default());
    all.push((name.to_string(), stats.clone()));
    let mut cfg = ServiceConfig::new(name, &format!("dev-{}", std::process::id()));
    cfg.lease_ttl = Duration::from_secs(5);
    let (log, bus, shutdown, name) = (log.clone(), bus.clone(), shutdown.clone(), name.to_string());
    tasks.push(tokio::spawn(async move {
        if let Err(e) = run_service(log, bus, cfg, make, shutdown, stats).await {
            tracing::error!(service = %name, error = %e, "service stopped");
        }
    }));
}

/// Subject root of the in-process node network of `gpusched dev`.
const DEV_NODE_ROOT: &str = "dev";

/// The node relay and one node agent per node of the cluster, in this
/// process, over an in-process node network; every job runs as real
/// processes. Returns the network (the gateway reads logs over it).
fn spawn_process_agents(
    log: &Log,
    bus: &Bus,
    nodes: &[gpusched_model::NodeSpec],
    work_dir: Option<PathBuf>,
    shutdown: &CancellationToken,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<NodeNet> {
    let dir = work_dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("gpusched-dev-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).with_context(|| format!("--work-dir {}", dir.display()))?;
    eprintln!(
        "process agents: {} nodes; worker logs, state and checkpoints under {}",
        nodes.len(),
        dir.display()
    );
    let net = NodeNet::Local(LocalHub::new());
    let (l, b, n, s) = (log.clone(), bus.clone(), net.clone(), shutdown.clone());
    let holder = format!("dev-{}", std::process::id());
    tasks.push(tokio::spawn(async move {
        let cfg = ServiceConfig::new(RELAY_SERVICE, &holder);
        let stats = Arc::new(RelayStats::default());
        let relay = RelayConfig::default();
        if let Err(e) = serve_relay(l, b, n, DEV_NODE_ROOT.into(), relay, cfg, s, stats).await {
            tracing::error!(error = %e, "node relay stopped");
        }
    }));
    for spec in nodes {
        let node_dir = dir.join("nodes").join(&spec.name);
        let cfg = NodeConfig {
            name: spec.name.clone(),
            flavor: spec.flavor.clone(),
            gpu_indices: (0..spec.gpus).collect(),
            path: spec.path.clone(),
            state_dir: node_dir.join("state"),
            log_dir: node_dir.join("logs"),
            // Shared by every node of the flavor, as on a real cluster.
            checkpoint_dir: dir.join("checkpoints").join(&spec.flavor),
            heartbeat: Duration::from_secs(2),
            kill_grace: Duration::from_secs(5),
            timeout_grace: Duration::from_secs(30),
            log_cap_bytes: 64 << 20,
            poll: Duration::from_millis(500),
            stop_workers_on_exit: true,
        };
        let (n, s) = (net.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            let name = cfg.name.clone();
            if let Err(e) = run_node(cfg, n, DEV_NODE_ROOT.into(), s, Default::default()).await {
                tracing::error!(node = %name, error = %e, "node agent stopped");
            }
        }));
    }
    Ok(net)
}

pub fn run(args: DevArgs) -> Result<()> {
    if !(args.time_scale > 0.0 && args.time_scale.is_finite()) {
        bail!("--time-scale: must be a positive number");
    }
    let _telemetry = gpusched_runtime::init_tracing_quiet("dev");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(dev(args))
}

async fn dev(args: DevArgs) -> Result<()> {
    let log = match &args.database_url {
        Some(url) => {
            let store = EventStore::connect(url, 8).await.with_context(|| {
                format!(
                    "--database-url {}: cannot connect",
                    gpusched_runtime::redact_url(url)
                )
            })?;
            store.migrate().await.context("running migrations")?;
            Log::Postgres(store)
        }
        None => Log::Memory(MemLog::new()),
    };
    let bus = match &args.nats_url {
        Some(url) => {
            let ns = gpusched_bus::Namespace::new(&args.namespace).context("--namespace")?;
            Bus::connect_nats(url, ns)
                .await
                .with_context(|| format!("--nats-url {url}: cannot connect"))?
        }
        None => Bus::memory(),
    };
    let cluster = gpusched_agent::load_cluster(args.cluster.as_deref())?;
    // On Postgres, the raw batched-append ceiling of the same database,
    // measured before anything else runs, to compare this run against.
    let ceiling = match &log {
        Log::Postgres(store) => Some(
            store
                .raw_append_ceiling(100_000, 100)
                .await
                .context("measuring the raw append ceiling")?,
        ),
        Log::Memory(_) => None,
    };
    let started = Instant::now();
    let shutdown = gpusched_runtime::shutdown_signal();
    let holder = format!("dev-{}", std::process::id());
    bootstrap_cluster(&log, &bus, &cluster.events, &holder).await?;

    let cycle: CycleConfig = cluster.cycle;
    let mut stats = Vec::new();
    let mut tasks = Vec::new();
    spawn_service(
        gpusched_admission::SERVICE,
        &log,
        &bus,
        move || gpusched_admission::AdmissionStage::new(cycle.max_validations),
        &shutdown,
        &mut stats,
        &mut tasks,
    );
    spawn_service(
        gpusched_quota::SERVICE,
        &log,
        &bus,
        move || gpusched_quota::QuotaStage::new(cycle),
        &shutdown,
        &mut stats,
        &mut tasks,
    );
    spawn_service(
        gpusched_placement::SERVICE,
        &log,
        &bus,
        move || gpusched_placement::PlacementStage::new(cycle),
        &shutdown,
        &mut stats,
        &mut tasks,
    );
    spawn_service(
        gpusched_preemption::SERVICE,
        &log,
        &bus,
        move || gpusched_preemption::PreemptionStage::new(cycle),
        &shutdown,
        &mut stats,
        &mut tasks,
    );
    let agent_cfg = gpusched_agent::agent_config(&cluster, args.time_scale, 600);
    let node_net = match args.agents {
        Agents::Simulated => {
            spawn_service(
                gpusched_agent::SERVICE,
                &log,
                &bus,
                move || SimulatedAgent::new(agent_cfg.clone()),
                &shutdown,
                &mut stats,
                &mut tasks,
            );
            None
        }
        Agents::Process => Some(spawn_process_agents(
            &log,
            &bus,
            &agent_cfg.nodes,
            args.work_dir.clone(),
            &shutdown,
            &mut tasks,
        )?),
    };
    let mut tokens = args.auth.tokens()?;
    let generated = if tokens.is_empty() {
        let t = uuid::Uuid::new_v4().simple().to_string();
        tokens = tokens.with_token(&t, gpusched_gateway::Principal::Admin);
        Some(t)
    } else {
        None
    };
    let (mut gw, gw_tasks) =
        gpusched_gateway::start(log.clone(), bus.clone(), &holder, tokens, shutdown.clone());
    gw.node_net = node_net.map(|n| (n, DEV_NODE_ROOT.to_string()));
    tasks.extend(gw_tasks);
    if !args.no_api {
        match tokio::net::TcpListener::bind(args.listen).await {
            Ok(listener) => {
                let addr = listener.local_addr().unwrap_or(args.listen);
                let (gw, sd) = (gw.clone(), shutdown.clone());
                tasks.push(tokio::spawn(async move {
                    if let Err(e) = gpusched_gateway::serve_on(gw, listener, sd).await {
                        tracing::error!(error = %e, "HTTP API stopped");
                    }
                }));
                eprintln!("HTTP API on http://{addr}");
                if let Some(t) = &generated {
                    eprintln!("admin token (this run only): export GPUSCHED_TOKEN={t}");
                }
            }
            // A demo run that exits by itself does not need the API.
            Err(e) if args.exit_when_done => {
                eprintln!("HTTP API not served: --listen {}: {e}", args.listen)
            }
            Err(e) => bail!(
                "--listen {}: {e} (another gpusched dev running? try --listen 127.0.0.1:8081)",
                args.listen
            ),
        }
    }

    // The demo workload, submitted through the gateway as fast as it takes it.
    let w = workload::synthetic(&SyntheticOptions {
        jobs: args.jobs,
        tenants: cluster.tenants.clone(),
        seed: args.seed,
        arrival_rate_per_s: 0.5,
        gpus_per_node: cluster.gpus_per_node,
    });
    let specs: Vec<_> = w
        .into_submissions()
        .map(|(_, mut spec, duration_s)| {
            spec.max_runtime_s = Some(duration_s);
            if args.agents == Agents::Process {
                // A real process that runs as long as the simulated job would.
                let secs = (duration_s as f64 / args.time_scale).ceil().max(1.0);
                spec.command = vec!["sleep".into(), format!("{secs}")];
                spec.checkpoint = None;
            }
            spec
        })
        .collect();
    let total = specs.len() as u64;
    let submit_started = Instant::now();
    let mut submits = tokio::task::JoinSet::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let sub = gw.submitter.clone();
        let key = format!("dev:{}:{i}", args.seed);
        submits.spawn(async move { sub.submit(spec, Some(key)).await });
    }
    let mut submitted = 0u64;
    while let Some(r) = submits.join_next().await {
        r.context("submit task")?.context("submitting")?;
        submitted += 1;
    }
    let submit_s = submit_started.elapsed().as_secs_f64();

    // A bar for a person at a terminal; a plain line every few seconds for
    // a log or a pipe (indicatif draws nothing there).
    let interactive = std::io::stderr().is_terminal();
    let bar = if interactive {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    let mut last_line: Option<Instant> = None;
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} jobs ended  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let p_total = |gw: &gpusched_gateway::Gateway| read_view(&gw.view).state().job_count() as u64;
    let ended = |p: &Projection| {
        let c = p.state().phase_counts();
        [
            Phase::Succeeded,
            Phase::Failed,
            Phase::Cancelled,
            Phase::Rejected,
        ]
        .iter()
        .map(|ph| c.get(*ph))
        .sum::<u64>()
    };
    loop {
        let (done, running, waiting) = {
            let p = read_view(&gw.view);
            let c = p.state().phase_counts();
            (
                ended(&p),
                c.get(Phase::Running) + c.get(Phase::Bound) + c.get(Phase::Preempting),
                c.get(Phase::Submitted) + c.get(Phase::Queued) + c.get(Phase::Admitted),
            )
        };
        bar.set_position(done);
        bar.set_length(total.max(p_total(&gw)));
        bar.set_message(format!("running {running}, waiting {waiting}"));
        if !interactive && last_line.is_none_or(|t| t.elapsed() >= PROGRESS_LINE_EVERY) {
            eprintln!(
                "{:>7.1} s  {done}/{} jobs ended, running {running}, waiting {waiting}",
                started.elapsed().as_secs_f64(),
                total.max(p_total(&gw))
            );
            last_line = Some(Instant::now());
        }
        if shutdown.is_cancelled() || (args.exit_when_done && done >= total) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bar.finish();
    let wall_s = started.elapsed().as_secs_f64();
    shutdown.cancel();
    for t in tasks {
        let _ = t.await;
    }

    // Summary: the live view against a replay of the log to the same point.
    let (live_seq, live_hash, superseded, phases) = {
        let p = read_view(&gw.view);
        let c = p.state().phase_counts();
        let phases: Vec<String> = Phase::ALL
            .iter()
            .filter(|ph| c.get(**ph) > 0)
            .map(|ph| format!("{} {}", format!("{ph:?}").to_lowercase(), c.get(*ph)))
            .collect();
        (p.seq(), p.state().state_hash(), p.superseded(), phases)
    };
    let mut replayed = Projection::new();
    replayed
        .catch_up(&log, live_seq, &mut |_, _, _, _| {})
        .await
        .context("replaying the log")?;
    let replay_hash = replayed.state().state_hash();
    let events_per_s = live_seq as f64 / wall_s.max(1e-9);
    println!();
    println!("jobs submitted:   {submitted} in {submit_s:.2} s");
    println!("jobs:             {}", phases.join(", "));
    println!(
        "events in log:    {live_seq} ({events_per_s:.0} events/s over {wall_s:.1} s; {superseded} superseded)"
    );
    println!(
        "jobs/s:           {:.0} (submitted to all ended)",
        total as f64 / wall_s.max(1e-9)
    );
    if let Some(c) = ceiling {
        println!(
            "append ceiling:   {c:.0} events/s raw (UNNEST, 100 rows/tx, same database); this run {:.1}% of it",
            100.0 * events_per_s / c
        );
    }
    for (name, s) in &stats {
        println!(
            "  {name:<11} cycles {:>7}  batches {:>6}  events {:>7}",
            s.cycles.load(Ordering::Relaxed),
            s.batches.load(Ordering::Relaxed),
            s.appended.load(Ordering::Relaxed)
        );
    }
    println!(
        "replay matches:   {}",
        if replay_hash == live_hash {
            "yes"
        } else {
            "NO"
        }
    );
    println!("state_hash: {live_hash}");
    if replay_hash != live_hash {
        bail!("replaying the log gave state_hash {replay_hash}");
    }
    Ok(())
}
