//! `gpusched`: the command line.
//!
//! Owns: parsing flags and files, running the simulator, printing reports.
//! Must never: make scheduling decisions (the core does) or hide errors:
//! bad input exits non-zero with a message that names the field.

mod batch;
mod client;
mod cohorts;
mod dev;
mod logs;
mod nodes;
mod ops;
mod replay;
mod review;
mod spec;
mod svg;
mod tenants;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use gpusched_sim::report::ReportOptions;
use gpusched_sim::workload::{self, ItpOptions, SyntheticOptions};
use gpusched_sim::{replay, Cluster, Report, SimOptions, Simulator, Workload};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "gpusched",
    version,
    about = "A durable, event-sourced scheduler for GPU batch jobs",
    after_help = "Exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 no token or not allowed, 5 refused (bad field), 6 server unreachable or busy."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the scheduling core on a cluster and workload in virtual time and print a report.
    Simulate(SimulateArgs),
    /// Rebuild the scheduler state from the Postgres event log and print a summary.
    Replay(ReplayArgs),
    /// Apply the event log's schema migrations and exit (once per release,
    /// before the services start).
    Migrate(MigrateArgs),
    /// Run every service in one process on an embedded log, with simulated nodes and a demo workload.
    Dev(dev::DevArgs),
    /// Submit a job (flags, or a spec file in TOML, YAML or JSON).
    Submit(client::SubmitArgs),
    /// Show one job.
    Get(client::JobArg),
    /// List jobs, like squeue.
    List(client::ListArgs),
    /// Cancel jobs (a running job checkpoints first when it checkpoints).
    Cancel(client::CancelArgs),
    /// Why a job is where it is: its history with reasons, and why it waits.
    Explain(client::JobArg),
    /// Quota and use per tenant and flavor; hold, release, drain or stop a queue.
    Queues(client::QueuesArgs),
    /// Nodes summed up by flavor and topology (GPUs, free, status); -l lists every node; cordon, uncordon, drain or evict one.
    Nodes(client::NodesArgs),
    /// Follow the event log live.
    Watch(client::WatchArgs),
    /// Print what a job's worker wrote (stdout, or --err); --follow keeps printing until the job ends.
    Logs(logs::LogsArgs),
    /// Make API tokens and their hashes for a tokens file.
    #[command(subcommand)]
    Token(client::TokenCmd),
    /// Configure tenants (admin).
    #[command(subcommand)]
    Tenants(tenants::TenantsCmd),
    /// Cohorts: each one's usage half-life and its members in the order
    /// borrowed quota goes to them; `set` changes the half-life (admin).
    Cohorts(cohorts::CohortsArgs),
    /// Every event about one job, node or tenant, from the log alone.
    Timeline(review::TimelineArgs),
    /// What changed between two instants of the log: admissions,
    /// preemptions, quota moves, nodes lost, and each tenant's use.
    Diff(review::DiffArgs),
    /// Why a job was preempted: the victim search run again on the state
    /// before the plan, every set it costed, and who got the GPUs.
    WhyPreempted(review::WhyPreemptedArgs),
}

#[derive(clap::Args)]
struct MigrateArgs {
    #[command(flatten)]
    log: gpusched_runtime::LogDatabaseArgs,
    /// Create the database first when it does not exist.
    #[arg(long, env = "GPUSCHED_CREATE_DATABASE")]
    create_database: bool,
}

#[derive(clap::Args)]
struct ReplayArgs {
    #[command(flatten)]
    log: gpusched_runtime::LogDatabaseArgs,
    /// Replay events with sequence ≤ N only.
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "until_time",
        value_parser = clap::value_parser!(u64).range(..=gpusched_store::SEQ_MAX)
    )]
    until_seq: Option<u64>,
    /// Replay the events recorded at or before this time (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    until_time: Option<String>,
    /// Start from the newest good snapshot (at or before --until-seq) and
    /// fold only the events after it, instead of from the first event.
    #[arg(long, conflicts_with = "until_time")]
    from_snapshot: bool,
    /// Replay both ways, from the newest good snapshot and from the first
    /// event, and fail unless the two states are identical.
    #[arg(long, conflicts_with_all = ["until_time", "from_snapshot"])]
    verify: bool,
    /// With --show: the instant, a sequence number or an RFC 3339 time on
    /// the log's clock (the latest `at` its events carried) [default: the
    /// log's end].
    #[arg(long, value_name = "SEQ|TIME", requires = "show", conflicts_with_all = ["until_seq", "until_time"])]
    at: Option<review::Instant>,
    #[command(flatten)]
    show: review::ShowArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum WorkloadFormat {
    /// gpusched's CSV: submit_s,tenant,workers,gpus_per_worker,duration_s,…
    Native,
    /// Microsoft ITP trace CSV: job_id,submission_time,duration,num_gpu.
    Itp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum VictimOrderArg {
    /// Least work lost since the last complete checkpoint (gpusched).
    Checkpoint,
    /// Kueue's documented order, as a baseline.
    Kueue,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ScenarioArg {
    /// A borrower fills an idle cluster; the quota owner returns (docs/simulator.md).
    Reclaim,
    /// Queues held, drained and stopped, nodes evicted for maintenance (docs/simulator.md).
    Maintenance,
    /// Pipelines chained by dependencies, some failing, and a job array under a limit (docs/simulator.md).
    Pipeline,
    /// Borrowers of weights 1, 2 and 4 under a usage half-life, one bursting early and returning (docs/simulator.md).
    Fairshare,
    /// Daily GPU-hour budgets, one waiting and one borrow-only once spent, and a returning owner (docs/simulator.md).
    Budget,
}

#[derive(clap::Args)]
struct SimulateArgs {
    /// Run a built-in scenario (its own cluster and workload).
    #[arg(long, value_enum, conflicts_with_all = ["cluster", "workload", "synthetic"])]
    scenario: Option<ScenarioArg>,
    /// How victims are chosen.
    #[arg(long, value_enum, default_value = "checkpoint")]
    victim_order: VictimOrderArg,
    /// No reservations and no backfill (for comparison).
    #[arg(long)]
    no_reservations: bool,
    /// Override R, the blocked jobs that hold a reservation at once (the
    /// cluster file's `reservations`; 0 is --no-reservations).
    #[arg(long, value_name = "R", conflicts_with = "no_reservations")]
    reservations: Option<usize>,
    /// Override the most seconds a victim gets to complete a checkpoint on
    /// request (0: victims get only the base grace).
    #[arg(long, value_name = "SECONDS")]
    checkpoint_grace: Option<u64>,
    /// Seconds a resumed run (a preempted or requeued job that ran before)
    /// takes from its binding to its start: restoring its checkpoint and
    /// warming up. Counted as recovery (restart) in the goodput figures.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    restore_s: u64,
    /// Set every cohort's usage half-life, overriding the cluster file or
    /// scenario: borrowers are then served lowest decayed use per weight
    /// first (0: by the share they borrow now).
    #[arg(long, value_name = "SECONDS")]
    usage_half_life: Option<u64>,
    /// Length of the report's fair-share windows, in virtual seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = gpusched_sim::report::DEFAULT_FAIR_SHARE_WINDOW_S)]
    fair_share_window: u64,
    /// Print this job's history with the reason at each step.
    #[arg(long, value_name = "JOB_ID")]
    explain: Option<u64>,
    /// Cluster file (TOML); default: the built-in demo cluster (docs/clusters/demo.toml).
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Workload file; default: the built-in demo workload.
    #[arg(long, conflicts_with = "synthetic")]
    workload: Option<PathBuf>,
    /// Generate N synthetic jobs instead of reading a workload.
    #[arg(long, value_name = "N")]
    synthetic: Option<usize>,
    /// Format of --workload.
    #[arg(long, value_enum, default_value = "native")]
    workload_format: WorkloadFormat,
    /// Seed of the synthetic and demo workloads.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop at this many virtual seconds.
    #[arg(long, value_name = "SECONDS")]
    until: Option<u64>,
    /// Write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Override K, the heads examined per cycle.
    #[arg(long)]
    max_heads: Option<usize>,
    /// Synthetic arrivals per second (default: about 90% of the cluster's capacity).
    #[arg(long)]
    arrival_rate: Option<f64>,
    /// Keep only the first N jobs of an ITP trace.
    #[arg(long, value_name = "N")]
    max_jobs: Option<usize>,
    /// Keep every event and check that replaying them gives the same state hash.
    #[arg(long)]
    verify_replay: bool,
    /// Write every event as JSON lines to FILE (implies keeping them).
    #[arg(long, value_name = "FILE")]
    events_out: Option<PathBuf>,
    /// Write an SVG timeline of the run's preemptions to FILE: one row per
    /// job a plan involved, its states as bars and its checkpoints, plans
    /// and preemption as marks (implies keeping the events).
    #[arg(long, value_name = "FILE")]
    timeline_svg: Option<PathBuf>,
    /// Start the timeline's axis at this virtual second [default: a margin
    /// before the first plan].
    #[arg(long, value_name = "SECONDS", requires = "timeline_svg")]
    timeline_from: Option<u64>,
    /// End the timeline's axis at this virtual second [default: a margin
    /// after the last beneficiary started or victim stopped].
    #[arg(long, value_name = "SECONDS", requires = "timeline_svg")]
    timeline_to: Option<u64>,
    /// Print why this job was preempted in this run, as `gpusched
    /// why-preempted` prints it: the victim search run again on the state
    /// just before the last plan that chose it, under this run's cycle
    /// configuration (implies keeping the events).
    #[arg(long, value_name = "JOB_ID")]
    why_preempted: Option<u64>,
}

/// Runs an API client command on a small runtime of its own.
fn api<F: std::future::Future<Output = Result<()>>>(f: F) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(f)
}

/// Exit codes: 0 success, 1 an error (the message names the flag or
/// field), 2 a usage error (bad flags or spec file), 3 not found, 4 no
/// token or not allowed, 5 refused by the server (the message names the
/// field and rule), 6 server unreachable or overloaded (retry).
fn main() -> std::process::ExitCode {
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => simulate(args),
        Command::Replay(args) => replay_log(args),
        Command::Timeline(args) => review::run(review::timeline(args)),
        Command::Diff(args) => review::run(review::diff(args)),
        Command::WhyPreempted(args) => review::run(review::why_preempted(args)),
        Command::Migrate(args) => migrate(args),
        Command::Dev(args) => dev::run(args),
        Command::Submit(a) => api(client::submit(a)),
        Command::Get(a) => api(client::get(a)),
        Command::List(a) => api(client::list(a)),
        Command::Cancel(a) => api(client::cancel(a)),
        Command::Explain(a) => api(client::explain(a)),
        Command::Queues(a) => api(client::queues(a)),
        Command::Nodes(a) => api(client::nodes(a)),
        Command::Watch(a) => api(client::watch(a)),
        Command::Logs(a) => api(logs::logs(a)),
        Command::Token(c) => client::token(c),
        Command::Tenants(c) => api(tenants::tenants(c)),
        Command::Cohorts(a) => api(cohorts::cohorts(a)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::from(client::exit::BROKEN_PIPE),
        Err(e) => match e.downcast_ref::<client::Exit>() {
            Some(x) => {
                eprintln!("error: {x}");
                std::process::ExitCode::from(x.code)
            }
            None => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::from(client::exit::ERROR)
            }
        },
    }
}

/// Whether `e` is output that found its reader gone (`gpusched … | head`).
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let broken = Some(std::io::ErrorKind::BrokenPipe);
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == broken
            || c.downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
                == broken
    })
}

/// Ends the process quietly with [`client::exit::BROKEN_PIPE`] when
/// printing finds its reader gone (`println!` panics then), as a tool
/// killed by SIGPIPE would; every other panic is reported as before.
fn quiet_on_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.contains("Broken pipe") {
            std::process::exit(i32::from(client::exit::BROKEN_PIPE));
        }
        report(info);
    }));
}

/// Mean GPU-seconds of a synthetic job, measured on a 10,000-job sample of
/// the generator with this seed; used to pick an arrival rate near the
/// cluster's capacity.
fn synthetic_gpu_s_per_job(tenants: &[String], seed: u64, gpus_per_node: u32) -> f64 {
    let sample = workload::synthetic(&SyntheticOptions {
        jobs: 10_000,
        tenants: tenants.to_vec(),
        seed,
        arrival_rate_per_s: 1.0,
        gpus_per_node,
    });
    let (mut sum, mut n) = (0.0, 0u32);
    for item in &sample.items {
        if let gpusched_sim::WorkloadKind::Submit { spec, duration_s } = &item.kind {
            sum += spec.total_gpus() as f64 * *duration_s as f64;
            n += 1;
        }
    }
    if n == 0 {
        1.0
    } else {
        sum / n as f64
    }
}

fn simulate(args: SimulateArgs) -> Result<()> {
    let scenario = args.scenario.map(|s| match s {
        ScenarioArg::Reclaim => gpusched_sim::scenario::reclaim(args.seed),
        ScenarioArg::Maintenance => gpusched_sim::scenario::maintenance(args.seed),
        ScenarioArg::Pipeline => gpusched_sim::scenario::pipeline(args.seed),
        ScenarioArg::Fairshare => gpusched_sim::scenario::fairshare(args.seed),
        ScenarioArg::Budget => gpusched_sim::scenario::budget(args.seed),
    });
    let mut cluster = match (&scenario, &args.cluster) {
        (Some((c, _)), _) => c.clone(),
        (None, Some(p)) => Cluster::load(p).context("--cluster")?,
        (None, None) => Cluster::demo(),
    };
    if let Some(h) = args.usage_half_life {
        if h > gpusched_model::MAX_USAGE_HALF_LIFE_S {
            bail!(
                "--usage-half-life: must be at most {} (ten years)",
                gpusched_model::MAX_USAGE_HALF_LIFE_S
            );
        }
        gpusched_sim::scenario::set_usage_half_life(&mut cluster, h);
    }
    if args.fair_share_window == 0 {
        bail!("--fair-share-window: must be at least 1");
    }
    let workload: Workload = match (&args.workload, args.synthetic) {
        _ if scenario.is_some() => scenario.map(|(_, w)| w).unwrap_or_default(),
        (Some(path), _) => match args.workload_format {
            WorkloadFormat::Native => workload::load_native(path).context("--workload")?,
            WorkloadFormat::Itp => workload::load_itp(
                path,
                &ItpOptions {
                    tenants: cluster.tenants.clone(),
                    gpus_per_node: cluster.gpus_per_node,
                    max_jobs: args.max_jobs,
                },
            )
            .context("--workload")?,
        },
        (None, Some(n)) => workload::synthetic(&SyntheticOptions {
            jobs: n,
            tenants: cluster.tenants.clone(),
            seed: args.seed,
            arrival_rate_per_s: args.arrival_rate.unwrap_or_else(|| {
                0.9 * cluster.gpus as f64
                    / synthetic_gpu_s_per_job(&cluster.tenants, args.seed, cluster.gpus_per_node)
            }),
            gpus_per_node: cluster.gpus_per_node,
        }),
        (None, None) => workload::demo(&cluster.tenants),
    };
    if let Some(r) = args.arrival_rate {
        if !(r.is_finite() && r > 0.0) {
            bail!("--arrival-rate: must be a number > 0");
        }
    }
    let mut cycle = cluster.cycle;
    if let Some(k) = args.max_heads {
        if k == 0 {
            bail!("--max-heads: must be at least 1");
        }
        cycle.max_heads = k;
    }
    cycle.preemption.order = match args.victim_order {
        VictimOrderArg::Checkpoint => gpusched_core::VictimOrder::Checkpoint,
        VictimOrderArg::Kueue => gpusched_core::VictimOrder::Kueue,
    };
    if args.no_reservations {
        cycle.reservations = 0;
    }
    if let Some(r) = args.reservations {
        cycle.reservations = r;
    }
    if let Some(g) = args.checkpoint_grace {
        cycle.preemption.max_checkpoint_grace_ms = g.saturating_mul(1000);
    }
    if let (Some(from), Some(to)) = (args.timeline_from, args.timeline_to) {
        if from >= to {
            bail!("--timeline-from: {from} s is not before --timeline-to {to} s");
        }
    }
    let record = args.verify_replay
        || args.events_out.is_some()
        || args.explain.is_some()
        || args.timeline_svg.is_some()
        || args.why_preempted.is_some();
    let opts = SimOptions {
        cycle,
        until: args.until.map(gpusched_model::Timestamp::from_secs),
        record_events: record,
        restore_ms: args.restore_s.saturating_mul(1000),
    };
    let cluster_desc = format!(
        "{} nodes, {} GPUs, {} tenants, K = {}, R = {}, victim order {:?}",
        cluster.nodes,
        cluster.gpus,
        cluster.tenants.len(),
        cycle.max_heads,
        cycle.reservations,
        cycle.preemption.order
    );
    let mut sim =
        Simulator::new(&cluster, workload, opts).context("cluster configuration refused")?;

    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} simulating [{bar:30}] {pos}/{len} workload items, virtual {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let interactive = std::io::stdout().is_terminal();
    let started = Instant::now();
    let mut shown = false;
    sim.run(&mut |p| {
        if interactive && !shown && started.elapsed().as_secs_f64() > 1.0 {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_length(p.items_total as u64);
        bar.set_position(p.items_done as u64);
        bar.set_message(format!("{:.0} s", p.now.as_secs_f64()));
    })
    .context("simulation stopped")?;
    bar.finish_and_clear();

    let report_opts = ReportOptions {
        fair_share_window_s: args.fair_share_window,
    };
    let mut report = Report::build_with(&sim, cluster_desc, &report_opts);
    if args.verify_replay {
        let replayed = replay(sim.log()).context("replay refused an event")?;
        report.replay_hash_matches = Some(replayed.state_hash() == report.state_hash);
    }
    if let Some(path) = &args.events_out {
        use std::io::Write;
        let f = std::fs::File::create(path)
            .with_context(|| format!("--events-out {}", path.display()))?;
        let mut w = std::io::BufWriter::new(f);
        for e in sim.log() {
            serde_json::to_writer(&mut w, e)?;
            w.write_all(b"\n")?;
        }
        w.flush()?;
    }
    print!("{}", report.to_table());
    if let Some(id) = args.explain {
        let id = gpusched_model::JobId(id);
        if sim.state().job(id).is_none() {
            bail!("--explain: no job {id} in this run (jobs are numbered from 1 in submit order)");
        }
        println!();
        println!("job {id}:");
        for line in gpusched_core::explain::history(sim.log(), sim.state(), id) {
            println!("  {line}");
        }
    }
    if let Some(id) = args.why_preempted {
        let id = gpusched_model::JobId(id);
        if sim.state().job(id).is_none() {
            bail!(
                "--why-preempted: no job {id} in this run (jobs are numbered from 1 in submit order)"
            );
        }
        println!();
        review::why_preempted_in_run(sim.log(), id, cycle).context("--why-preempted")?;
    }
    if let Some(path) = &args.timeline_svg {
        write_timeline(&sim, path, args.timeline_from, args.timeline_to)?;
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json).with_context(|| format!("--report {}", path.display()))?;
    }
    if report.replay_hash_matches == Some(false) {
        bail!("replay of the event log gave a different state hash");
    }
    Ok(())
}

/// Draws the run's preemptions (`--timeline-svg`) and says what it drew.
fn write_timeline(
    sim: &Simulator,
    path: &std::path::Path,
    from: Option<u64>,
    to: Option<u64>,
) -> Result<()> {
    let window = svg::Window {
        from: from.map(gpusched_model::Timestamp::from_secs),
        to: to.map(gpusched_model::Timestamp::from_secs),
    };
    let drawn = svg::timeline(sim.state(), sim.log(), window);
    std::fs::write(path, &drawn.svg)
        .with_context(|| format!("--timeline-svg {}", path.display()))?;
    let left_out = match drawn.left_out {
        0 => String::new(),
        n => format!(" ({n} more jobs left out)"),
    };
    println!();
    println!(
        "timeline of {} of {} preemption plans, {} jobs{left_out}, simulated {} s to {} s: {}",
        drawn.plans_shown,
        drawn.plans,
        drawn.rows,
        drawn.from.as_secs(),
        drawn.to.as_secs(),
        path.display()
    );
    Ok(())
}

fn migrate(args: MigrateArgs) -> Result<()> {
    use gpusched_store::{EventStore, MIGRATOR};
    let url = gpusched_runtime::redact_url(&args.log.database_url);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        if args.create_database
            && EventStore::create_database_if_missing(&args.log.database_url)
                .await
                .with_context(|| format!("--database-url {url}: cannot create the database"))?
        {
            println!("created the database");
        }
        let store = EventStore::connect(&args.log.database_url, 1)
            .await
            .with_context(|| format!("--database-url {url}: cannot connect"))?;
        store.migrate().await.context("running migrations")?;
        let last = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        println!("migrated {url}: schema at version {last}");
        Ok(())
    })
}

fn replay_log(args: ReplayArgs) -> Result<()> {
    if let Some(what) = args.show.show {
        return review::run(review::show(
            &args.log.database_url,
            args.at,
            what,
            &args.show,
        ));
    }
    use gpusched_store::{EventStore, Until};
    let until = match (args.until_seq, &args.until_time) {
        (Some(n), _) => Until::Seq(n),
        (None, Some(t)) => Until::Time(
            chrono::DateTime::parse_from_rfc3339(t)
                .with_context(|| format!("--until-time: {t:?} is not an RFC 3339 time"))?
                .with_timezone(&chrono::Utc),
        ),
        (None, None) => Until::All,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let store = EventStore::connect(&args.log.database_url, 2)
            .await
            .with_context(|| "--database-url: cannot connect".to_string())?;
        let last = store.max_seq().await?;
        let end = args.until_seq.map_or(last, |n| n.min(last));
        // Against a live log, both ways of --verify stop at the same event.
        let until = match until {
            Until::All => Until::Seq(end),
            u => u,
        };
        let snapshot = if args.from_snapshot || args.verify {
            let from = replay::from_snapshot(&store, end, until).await?;
            replay::print(&from, last);
            Some(from)
        } else {
            None
        };
        if args.from_snapshot {
            return Ok(());
        }
        let zero = replay::from_zero(&store, until).await?;
        replay::print(&zero, last);
        match snapshot {
            Some(from) => replay::verify(&from, &zero),
            None => Ok(()),
        }
    })
}
