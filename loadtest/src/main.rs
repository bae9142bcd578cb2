//! `loadtest`: drives the real gpusched deployment — every service as its
//! own process over NATS JetStream and Postgres — with a simulated cluster
//! and a workload, and reports what users and SREs care about (issue #6).
//!
//! Modules: `stack` (processes, the run's database and streams),
//! `workload` (cluster file and job lists), `drive` (HTTP submissions,
//! progress, samples), `metrics` (what the log says afterwards),
//! `scenario` (burst, steady, reclaim, trace, restart), `report` (table,
//! JSON, Markdown, SVG plots), `infra` (a private Postgres and
//! nats-server) and `chaos` (fault injection on that private infrastructure).

mod chaos;
mod drive;
mod infra;
mod metrics;
mod outcome;
mod report;
mod scenario;
use gpusched_stack as stack;
mod workload;

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Every job submitted as fast as the gateway takes them; ends when all are bound.
    Burst,
    /// Open-loop arrivals at --rate; ends when all are bound.
    Steady,
    /// A tenant borrows the whole cluster, then the quota owner returns.
    Reclaim,
    /// A trace (--trace, ITP format) replayed --time-scale times faster.
    Trace,
    /// Fills the queue (--jobs), then SIGKILLs and restarts services one at a time.
    Restart,
    /// Faults one per phase (kills, Postgres and NATS outages, a paused
    /// leader, bad bus messages) on a private Postgres and nats-server,
    /// under steady submissions; fails on any lost, duplicated or wrongly
    /// refused job or a slow recovery. --seed draws the timing; --short
    /// is the test suite's form.
    Chaos,
}

/// Load test of the real deployment. Reports go to --out.
#[derive(Parser, Debug, Clone)]
#[command(name = "loadtest", version)]
pub struct Args {
    /// Scenario (also --scenario).
    #[arg(value_enum)]
    pub scenario_pos: Option<Scenario>,
    /// Scenario.
    #[arg(long, value_enum)]
    pub scenario: Option<Scenario>,
    /// A few hundred jobs on a small cluster, every job run to the end;
    /// fails unless all completed and none was lost (for the test suite).
    #[arg(long)]
    pub smoke: bool,
    /// Chaos: a fault's end → every stage it touched deciding again must
    /// take at most this long, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub recovery_goal_s: f64,
    /// Chaos: no stall (work waiting, the log not growing) outside a fault
    /// window may last longer, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub stall_goal_s: f64,
    /// Chaos: the short form the test suite runs (six faults, ~250 jobs, about a minute).
    #[arg(long)]
    pub short: bool,
    /// Jobs (burst default 100,000; steady rate × duration; restart 125,000).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Steady: arrivals per second.
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Steady: seconds of arrivals when --jobs is not given.
    #[arg(long, default_value_t = 30.0)]
    pub duration_s: f64,
    /// Nodes (default: burst sizes the cluster to fit every job; 1,250 otherwise; restart 10,000).
    #[arg(long)]
    pub nodes: Option<usize>,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    /// Tenants (team-0 …), one cohort, equal nominal quotas.
    #[arg(long, default_value_t = 4)]
    pub tenants: usize,
    /// Nominal quota of each tenant as a multiple of its equal share.
    #[arg(long)]
    pub quota_factor: Option<f64>,
    /// Simulated time runs this many times faster than wall time (agents;
    /// trace submission times). Default per scenario.
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// Trace file (ITP CSV: job_id,submission_time,duration,num_gpu).
    #[arg(long, default_value = "data/traces/itp/cluster04.csv")]
    pub trace: PathBuf,
    /// Reports (report.json, report.md, *.svg) and service logs go here.
    #[arg(long, default_value = "loadtest-report")]
    pub out: PathBuf,
    /// Maintenance database; the run creates and drops its own beside it.
    #[arg(
        long,
        env = "LOADTEST_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub database_url: String,
    /// NATS with JetStream; the run uses and deletes its own streams.
    #[command(flatten)]
    pub nats: gpusched_runtime::NatsArgs,
    /// Submissions in flight at once (closed loop).
    #[arg(long, default_value_t = 256)]
    pub in_flight: usize,
    /// Jobs a submission request carries: 1 sends each job alone (`POST
    /// /v1/jobs`); more sends them through `POST /v1/jobs:batch` (at most
    /// 1000), with --in-flight / BATCH requests open (at least 2). Closed
    /// loop only (burst, and the restart and reclaim fills).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub batch: u16,
    /// Workload seed.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Lease time to live of the services, seconds (bounds restart time).
    #[arg(long, default_value_t = 2.0)]
    pub lease_ttl_s: f64,
    /// Restart: services to SIGKILL and restart, one after the other.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "quota,placement,admission,preemption,agent"
    )]
    pub restart: Vec<String>,
    /// Reclaim: seconds the borrower runs before the owner returns (victims
    /// younger than the preemption stage's 60 s minimum runtime are spared).
    #[arg(long, default_value_t = 65.0)]
    pub reclaim_wait_s: f64,
    /// Rows written by each raw append-ceiling probe (0: skip them).
    #[arg(long, default_value_t = 100_000)]
    pub ceiling_rows: usize,
    /// Raw append-ceiling probes, one after the other; the ceiling is
    /// their median (a single one-second probe varied ±25 % between runs).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=15))]
    pub ceiling_probes: u16,
    /// Keep the run's database (its event log) for incident review instead
    /// of dropping it; the run prints its URL (docs/incident-review.md).
    #[arg(long)]
    pub keep_log: bool,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 900.0)]
    pub timeout_s: f64,
    /// Directory of the service binaries (default: next to this executable).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
}

impl Args {
    /// The scenario asked for (burst by default; smoke is a burst).
    pub fn scenario(&self) -> Scenario {
        self.scenario
            .or(self.scenario_pos)
            .unwrap_or(Scenario::Burst)
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let run = async move {
        if args.scenario() == Scenario::Chaos {
            chaos::run(args).await
        } else {
            scenario::run(args).await
        }
    };
    match rt.block_on(run) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(2),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
