//! `gpusched-preemption`: the preemption service process.

use clap::Parser;
use gpusched_preemption::{PreemptionStage, SERVICE};
use gpusched_runtime::{CycleArgs, StackArgs};

/// Runs the preemption stage of the scheduler against the log and the bus.
#[derive(Parser, Debug)]
#[command(name = "gpusched-preemption", version)]
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
    gpusched_runtime::serve(SERVICE, &args.stack, || PreemptionStage::new(cycle)).await
}
