//! `gpusched-admission`: the admission service process.

use clap::Parser;
use gpusched_admission::{AdmissionStage, SERVICE};
use gpusched_runtime::StackArgs;

/// Validates submissions and accepts or rejects them.
#[derive(Parser, Debug)]
#[command(name = "gpusched-admission", version)]
struct Args {
    #[command(flatten)]
    stack: StackArgs,
    /// Submissions validated per cycle.
    #[arg(long, env = "GPUSCHED_MAX_VALIDATIONS", default_value_t = 4096)]
    max_validations: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    gpusched_runtime::serve(SERVICE, &args.stack, || {
        AdmissionStage::new(args.max_validations)
    })
    .await
}
