//! `gpusched-quota`: the quota service process.

use clap::Parser;
use gpusched_quota::{QuotaStage, SERVICE};
use gpusched_runtime::{CycleArgs, StackArgs};

/// Runs the quota stage of the scheduler against the log and the bus.
#[derive(Parser, Debug)]
#[command(name = "gpusched-quota", version)]
struct Args {
    #[command(flatten)]
    stack: StackArgs,
    #[command(flatten)]
    cycle: CycleArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cycle = args.cycle.config();
    gpusched_runtime::serve(SERVICE, &args.stack, || QuotaStage::new(cycle)).await
}
