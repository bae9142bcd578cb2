//! `gpusched-agent`: the node agent process.

use std::path::PathBuf;

use clap::Parser;
use gpusched_agent::{agent_config, load_cluster, SERVICE};
use gpusched_runtime::{SimulatedAgent, StackArgs};

/// Registers nodes and reports what runs on them.
#[derive(Parser, Debug)]
#[command(name = "gpusched-agent", version)]
struct Args {
    #[command(flatten)]
    stack: StackArgs,
    /// Simulate the nodes and their jobs (the only mode so far).
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.simulate {
        anyhow::bail!("--simulate false: only simulated agents exist so far");
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
