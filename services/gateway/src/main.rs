//! `gpusched-gateway`: the HTTP API process.

use std::net::SocketAddr;

use clap::Parser;
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = init_tracing("gateway");
    let conns = args.stack.connect("gateway").await?;
    let shutdown = shutdown_signal();
    let (gw, tasks) =
        gpusched_gateway::start(conns.log, conns.bus, &conns.instance, shutdown.clone());
    gpusched_gateway::serve_http(gw, args.listen, shutdown).await?;
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}
