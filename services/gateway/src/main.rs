//! `gpusched-gateway`: the HTTP API process.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use gpusched_gateway::{AuthArgs, Tokens};
use gpusched_runtime::{init_tracing, shutdown_signal, StackArgs};

/// Serves the HTTP API.
#[derive(Parser, Debug)]
#[command(name = "gpusched-gateway", version)]
struct Args {
    #[command(flatten)]
    stack: StackArgs,
    /// Address to listen on.
    #[arg(long, env = "GPUSCHED_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    #[command(flatten)]
    auth: AuthArgs,
}

fn tokens(a: &AuthArgs) -> anyhow::Result<Tokens> {
    let t = a.tokens()?;
    if t.is_empty() {
        anyhow::bail!(
            "no API tokens: set GPUSCHED_ADMIN_TOKEN or --tokens-file (every request would get 401)"
        );
    }
    Ok(t)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = init_tracing("gateway");
    let tokens = tokens(&args.auth).context("gateway auth")?;
    tracing::info!(tokens = tokens.len(), "API tokens loaded");
    let snapshots = args.stack.snapshot_policy()?;
    let conns = args.stack.connect("gateway").await?;
    let shutdown = shutdown_signal();
    let (mut gw, tasks) = gpusched_gateway::start_with(
        conns.log,
        conns.bus,
        &conns.instance,
        tokens,
        conns.lease_ttl,
        snapshots,
        shutdown.clone(),
    );
    // Worker logs are read from node agents over NATS.
    let nats = gpusched_bus::async_nats::connect(&args.stack.nats.nats_url)
        .await
        .with_context(|| {
            format!(
                "--nats-url {}: cannot connect",
                gpusched_runtime::redact_url(&args.stack.nats.nats_url)
            )
        })?;
    gw.node_net = Some((
        gpusched_bus::node_net::NodeNet::Nats(nats),
        args.stack.namespace.clone(),
    ));
    gpusched_gateway::serve_http(gw, args.listen, shutdown).await?;
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}
