//! `gpusched-agent`: the node agent process.
//!
//! - `gpusched-agent node …`: the real agent of one node (NATS only).
//! - `gpusched-agent relay …`: the node relay, the leased writer between
//!   agents and the log.
//! - `gpusched-agent [--simulate] …`: simulated nodes from a cluster file
//!   (load tests, demos).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args as ClapArgs, Parser, Subcommand};
use gpusched_agent::net::NodeNet;
use gpusched_agent::node::{run_node, NodeConfig};
use gpusched_agent::node_health::{serve_node_health, NodeHealth};
use gpusched_agent::relay::RelayConfig;
use gpusched_agent::relay_service::{serve_relay, RelayStats, RELAY_SERVICE};
use gpusched_agent::{agent_config, load_cluster, SimulatedAgent, SERVICE};
use gpusched_runtime::StackArgs;

/// Registers nodes and runs what is bound to them.
#[derive(Parser, Debug)]
#[command(
    name = "gpusched-agent",
    version,
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    sim: SimArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the jobs bound to this node as real processes (one agent per node).
    Node(NodeArgs),
    /// The node relay: node orders from the log, agents' reports into events.
    Relay(RelayArgs),
}

/// The simulated agent (no subcommand).
#[derive(ClapArgs, Debug)]
struct SimArgs {
    #[command(flatten)]
    stack: StackArgs,
    /// Simulate the nodes and their jobs.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    simulate: bool,
    /// Cluster file whose nodes this agent runs (default: the demo cluster).
    #[arg(long, env = "GPUSCHED_CLUSTER")]
    cluster: Option<PathBuf>,
    /// Simulated time runs this many times faster than wall time.
    #[arg(long, env = "GPUSCHED_TIME_SCALE", default_value_t = 60.0)]
    time_scale: f64,
    /// Runtime of a job that declares no max_runtime_s, seconds.
    #[arg(long, default_value_t = 600)]
    default_runtime_s: u64,
    /// Also configure the cluster file's topology and tenants (admin events)
    /// if the log lacks them.
    #[arg(long, default_value_t = false)]
    configure: bool,
}

#[derive(ClapArgs, Debug)]
struct NetArgs {
    /// The NATS server the agents and the relay share.
    #[command(flatten)]
    nats: gpusched_runtime::NatsArgs,
    /// Root of subject names (`<ROOT>.node.…`).
    #[arg(long, env = "GPUSCHED_NAMESPACE", default_value = "gpusched")]
    namespace: String,
}

#[derive(ClapArgs, Debug)]
struct NodeArgs {
    #[command(flatten)]
    net: NetArgs,
    /// This node's name, unique in the cluster (default: the host name).
    #[arg(long, env = "GPUSCHED_NODE_NAME")]
    name: Option<String>,
    /// GPU flavor of every GPU on the node, e.g. h100-80g (default: from
    /// the first GPU's name through NVML).
    #[arg(long, env = "GPUSCHED_FLAVOR")]
    flavor: Option<String>,
    /// GPU indices this agent hands out, e.g. 0,1,2,3 (default: every GPU
    /// NVML finds, when built with the `nvml` feature).
    #[arg(long, env = "GPUSCHED_GPUS", value_delimiter = ',')]
    gpus: Vec<u32>,
    /// Topology path, outermost level first, e.g. rack-1/block-2 (one entry
    /// per configured level).
    #[arg(long, env = "GPUSCHED_TOPOLOGY", default_value = "")]
    path: String,
    /// Worker records and the registration counter.
    #[arg(
        long,
        env = "GPUSCHED_STATE_DIR",
        default_value = "/var/lib/gpusched-agent"
    )]
    state_dir: PathBuf,
    /// Worker logs (default: <state-dir>/logs).
    #[arg(long, env = "GPUSCHED_LOG_DIR")]
    log_dir: Option<PathBuf>,
    /// Checkpoints, on storage shared by every node of the flavor (default:
    /// <state-dir>/checkpoints, which is only right for a single node).
    #[arg(long, env = "GPUSCHED_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Status at least this often, seconds.
    #[arg(long, default_value_t = 2.0)]
    heartbeat_s: f64,
    /// SIGTERM to SIGKILL, seconds.
    #[arg(long, default_value_t = 10.0)]
    kill_grace_s: f64,
    /// A job past its max runtime gets this long to checkpoint, seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout_grace_s: f64,
    /// A worker's log is rotated past this many MiB.
    #[arg(long, default_value_t = 64)]
    log_cap_mib: u64,
    /// Serve `/healthz`, `/readyz` and `/metrics` on this address.
    #[arg(long, env = "GPUSCHED_HEALTH_LISTEN")]
    health_listen: Option<std::net::SocketAddr>,
}

#[derive(ClapArgs, Debug)]
struct RelayArgs {
    #[command(flatten)]
    stack: StackArgs,
    /// Silence after which a node is lost and its jobs requeued, seconds.
    #[arg(long, env = "GPUSCHED_NODE_TIMEOUT_S", default_value_t = 30.0)]
    node_timeout_s: f64,
    /// A cancelled running job gets this long to checkpoint and stop, seconds.
    #[arg(long, default_value_t = 120.0)]
    cancel_grace_s: f64,
}

fn seconds(flag: &str, v: f64) -> anyhow::Result<Duration> {
    if !(v > 0.0 && v.is_finite()) {
        anyhow::bail!("{flag}: must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.cmd {
        Some(Cmd::Node(a)) => node(a).await,
        Some(Cmd::Relay(a)) => relay(a).await,
        None => simulate(args.sim).await,
    }
}

async fn node(a: NodeArgs) -> anyhow::Result<()> {
    let _telemetry = gpusched_runtime::init_tracing(SERVICE);
    let name = match a.name {
        Some(n) => n,
        None => std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.trim().is_empty())
            .context("--name: no node name given and HOSTNAME is not set")?,
    };
    let path: Vec<String> = a
        .path
        .split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    let (gpus, flavor) = match (a.gpus.is_empty(), a.flavor) {
        (false, Some(f)) => (a.gpus, f),
        (empty, flavor) => {
            let (found, device) = gpusched_agent::gpus::discover()
                .map_err(|e| anyhow::anyhow!("--gpus not given and discovery failed: {e}"))?;
            let gpus = if empty { found } else { a.gpus };
            let flavor = flavor.unwrap_or_else(|| gpusched_agent::gpus::flavor_from_name(&device));
            (gpus, flavor)
        }
    };
    let cfg = NodeConfig {
        name,
        flavor,
        gpu_indices: gpus,
        path,
        log_dir: a.log_dir.unwrap_or_else(|| a.state_dir.join("logs")),
        checkpoint_dir: a
            .checkpoint_dir
            .unwrap_or_else(|| a.state_dir.join("checkpoints")),
        state_dir: a.state_dir,
        heartbeat: seconds("--heartbeat-s", a.heartbeat_s)?,
        kill_grace: seconds("--kill-grace-s", a.kill_grace_s)?,
        timeout_grace: seconds("--timeout-grace-s", a.timeout_grace_s)?,
        log_cap_bytes: a.log_cap_mib.saturating_mul(1 << 20),
        poll: Duration::from_millis(200),
        stop_workers_on_exit: false,
    };
    cfg.spec()
        .check_fields(cfg.path.len())
        .map_err(|e| anyhow::anyhow!("node configuration: {e}"))?;
    let client = gpusched_bus::async_nats::connect(&a.net.nats.nats_url)
        .await
        .with_context(|| {
            format!(
                "--nats-url {}: cannot connect",
                gpusched_runtime::redact_url(&a.net.nats.nats_url)
            )
        })?;
    let shutdown = gpusched_runtime::shutdown_signal();
    let health = Arc::new(NodeHealth::default());
    let probes = a.health_listen.map(|addr| {
        let (node, health, shutdown) = (cfg.name.clone(), health.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = serve_node_health(addr, node, health, shutdown).await {
                tracing::error!(%addr, error = %e, "--health-listen: cannot serve");
            }
        })
    });
    let out = run_node(
        cfg,
        NodeNet::Nats(client),
        a.net.namespace,
        shutdown.clone(),
        health,
    )
    .await;
    shutdown.cancel();
    if let Some(task) = probes {
        let _ = task.await;
    }
    out
}

async fn relay(a: RelayArgs) -> anyhow::Result<()> {
    let _telemetry = gpusched_runtime::init_tracing(RELAY_SERVICE);
    let snapshots = a.stack.snapshot_policy()?;
    let conns = a.stack.connect(RELAY_SERVICE).await?;
    let client = gpusched_bus::async_nats::connect(&a.stack.nats.nats_url)
        .await
        .with_context(|| {
            format!(
                "--nats-url {}: cannot connect",
                gpusched_runtime::redact_url(&a.stack.nats.nats_url)
            )
        })?;
    let cfg = RelayConfig {
        node_timeout_ms: seconds("--node-timeout-s", a.node_timeout_s)?.as_millis() as u64,
        cancel_grace_ms: seconds("--cancel-grace-s", a.cancel_grace_s)?.as_millis() as u64,
        ..RelayConfig::default()
    };
    let mut service = gpusched_runtime::ServiceConfig::new(RELAY_SERVICE, &conns.instance);
    service.lease_ttl = conns.lease_ttl;
    service.snapshots = snapshots;
    let shutdown = gpusched_runtime::shutdown_signal();
    tracing::info!(instance = %conns.instance, "node relay starting");
    let stats = Arc::new(RelayStats::default());
    let observers = gpusched_runtime::spawn_observers(
        RELAY_SERVICE,
        a.stack.health_listen,
        &stats.service,
        &shutdown,
    );
    let out = serve_relay(
        conns.log,
        conns.bus,
        NodeNet::Nats(client),
        a.stack.namespace,
        cfg,
        service,
        shutdown.clone(),
        stats,
    )
    .await;
    shutdown.cancel();
    for task in observers {
        let _ = task.await;
    }
    out
}

async fn simulate(args: SimArgs) -> anyhow::Result<()> {
    if !args.simulate {
        anyhow::bail!(
            "--simulate false: run real nodes with `gpusched-agent node` (and one `gpusched-agent relay`)"
        );
    }
    if !(args.time_scale > 0.0 && args.time_scale.is_finite()) {
        anyhow::bail!("--time-scale: must be a positive number");
    }
    // Before `serve`, so the configuration step is traced too; `serve`
    // then finds the subscriber in place.
    let _telemetry = gpusched_runtime::init_tracing(SERVICE);
    let cluster = load_cluster(args.cluster.as_deref())?;
    if args.configure {
        let conns = args.stack.connect(SERVICE).await?;
        let n = gpusched_runtime::bootstrap_cluster(
            &conns.log,
            &conns.bus,
            &cluster.events,
            &conns.instance,
        )
        .await?;
        tracing::info!(appended = n, "cluster configuration applied");
    }
    let cfg = agent_config(&cluster, args.time_scale, args.default_runtime_s);
    gpusched_runtime::serve(SERVICE, &args.stack, || SimulatedAgent::new(cfg.clone())).await
}
