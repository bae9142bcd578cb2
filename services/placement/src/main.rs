//! `gpusched-placement`: the placement service process.

use clap::Parser;
use gpusched_placement::{PlacementStage, SERVICE};
use gpusched_runtime::{CycleArgs, StackArgs};

/// Runs the placement stage of the scheduler against the log and the bus.
#[derive(Parser, Debug)]
#[command(name = "gpusched-placement", version)]
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
    gpusched_runtime::serve(SERVICE, &args.stack, || PlacementStage::new(cycle)).await
}
