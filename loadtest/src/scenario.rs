//! The scenarios, end to end: plan the cluster and the jobs, measure the
//! append ceiling, start the deployment, drive it, read back what the log
//! says, stop everything and remove the run's database and streams, and
//! hand the measurements to `report`.
//!
//! Owns: each scenario's defaults and steps (burst, steady, reclaim,
//! trace, restart, and `--smoke`), the smoke run's completion checks, and
//! cleanup on every path (errors and Ctrl-C included).
//!
//! Must never: leave a process, database or stream behind, or report a
//! figure it did not measure in this run.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpusched_runtime::wall_clock;
use tokio_util::sync::CancellationToken;

use crate::drive::{self, Client, Status, Submission, SubmitOutcome};
use crate::metrics::{self, LogFacts};
use crate::outcome::{Outcome, Plan, ReclaimOutcome, RestartOutcome};
use crate::report::{self, Report};
use crate::stack::{self, Stack, StackOptions};
use crate::workload::{self, ClusterShape, Planned};
use crate::{Args, Scenario};

fn plan(args: &Args) -> Result<Plan> {
    let scenario = args.scenario();
    let gpn = args.gpus_per_node.max(1);
    let tenant_names = |n: usize| {
        (0..n.max(1))
            .map(|i| format!("team-{i}"))
            .collect::<Vec<_>>()
    };
    // The cluster, `--nodes` and `--quota-factor` overriding the
    // scenario's own defaults.
    let even = |nodes: usize, quota_factor: f64| {
        ClusterShape::even(
            args.nodes.unwrap_or(nodes),
            gpn,
            args.tenants,
            args.quota_factor.unwrap_or(quota_factor),
        )
    };
    let fit = |jobs: &[Planned]| {
        // Room for every job at once, with slack for gang fragmentation.
        (workload::total_gpus(jobs) as f64 * 1.25 / f64::from(gpn)).ceil() as usize
    };
    let p = match scenario {
        Scenario::Burst => {
            let n = args.jobs.unwrap_or(if args.smoke { 300 } else { 100_000 });
            let jobs = workload::synthetic(n, &tenant_names(args.tenants), gpn, args.seed, None);
            let nodes = args.nodes.unwrap_or_else(|| fit(&jobs));
            let time_scale = args
                .time_scale
                .unwrap_or(if args.smoke { 3600.0 } else { 1.0 });
            Plan {
                scenario,
                shape: even(nodes, 1.0),
                description: format!(
                    "synthetic, {n} jobs submitted at once (closed loop, {} in flight); seed {}",
                    args.in_flight, args.seed
                ),
                jobs,
                open_loop: false,
                time_scale,
            }
        }
        Scenario::Steady => {
            if !(args.rate.is_finite() && args.rate > 0.0) {
                bail!("--rate: must be a positive number of jobs per second");
            }
            let n = args
                .jobs
                .unwrap_or((args.rate * args.duration_s).round().max(1.0) as usize);
            let jobs = workload::synthetic(
                n,
                &tenant_names(args.tenants),
                gpn,
                args.seed,
                Some(args.rate),
            );
            Plan {
                scenario,
                shape: even(1250, 1.0),
                description: format!(
                    "synthetic, {n} jobs, Poisson arrivals at {}/s (open loop); seed {}",
                    args.rate, args.seed
                ),
                jobs,
                open_loop: true,
                time_scale: args.time_scale.unwrap_or(3600.0),
            }
        }
        Scenario::Trace => {
            let shape = even(1250, 1.0);
            let (raw, _) =
                workload::trace(&args.trace, &shape.tenant_names(), gpn, args.jobs, 1.0)?;
            // Default: the whole trace in about two minutes.
            let scale = args
                .time_scale
                .unwrap_or_else(|| (workload::span_s(&raw) / 120.0).max(1.0));
            let (jobs, description) =
                workload::trace(&args.trace, &shape.tenant_names(), gpn, args.jobs, scale)?;
            Plan {
                scenario,
                shape,
                description: format!(
                    "trace {} replayed {scale:.0}x faster (open loop): {description}",
                    args.trace.display()
                ),
                jobs,
                open_loop: true,
                time_scale: scale,
            }
        }
        Scenario::Reclaim => {
            let mut shape = ClusterShape::even(args.nodes.unwrap_or(1250), gpn, 2, 1.0);
            shape.tenants[0].0 = workload::RECLAIM_OWNER.to_string();
            shape.tenants[1].0 = workload::RECLAIM_BORROWER.to_string();
            Plan {
                scenario,
                description: format!(
                    "reclaim: {} borrows all {} nodes with 1x{gpn} jobs (checkpoint every 30 min, 60 s each), \
                     then after {:.0} s {} asks for its nominal {} GPUs",
                    workload::RECLAIM_BORROWER,
                    shape.nodes,
                    args.reclaim_wait_s,
                    workload::RECLAIM_OWNER,
                    shape.tenants[0].1
                ),
                shape,
                jobs: Vec::new(),
                open_loop: false,
                time_scale: args.time_scale.unwrap_or(60.0),
            }
        }
        Scenario::Restart => {
            let n = args.jobs.unwrap_or(125_000);
            let jobs = workload::synthetic(n, &tenant_names(args.tenants), gpn, args.seed, None);
            Plan {
                scenario,
                // Quota far above the cluster: everything is admitted and
                // waits for GPUs, so the queue is as deep as it gets.
                shape: even(10_000, 100.0),
                description: format!(
                    "restart: {n} synthetic jobs submitted at once onto a cluster they overfill; \
                     then each of [{}] is SIGKILLed and restarted in turn",
                    args.restart.join(", ")
                ),
                jobs,
                open_loop: false,
                time_scale: args.time_scale.unwrap_or(1.0),
            }
        }
        Scenario::Chaos => bail!("chaos runs through its own module (chaos::run)"),
    };
    if !(p.time_scale.is_finite() && p.time_scale > 0.0) {
        bail!("--time-scale: must be a positive number");
    }
    Ok(p)
}

/// Runs the scenario `args` asks for; `Ok(false)` when a smoke check failed.
pub async fn run(args: Args) -> Result<bool> {
    let cancel = CancellationToken::new();
    {
        let c = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninterrupted: stopping the services and cleaning up");
                c.cancel();
            }
        });
    }
    for s in &args.restart {
        if !stack::SERVICES.contains(&s.as_str()) || s == "gateway" {
            bail!("--restart {s}: must be one of admission, quota, placement, preemption, agent");
        }
    }
    let plan = plan(&args)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("--out {}: cannot create", args.out.display()))?;
    let cluster_file = args.out.join("cluster.toml");
    plan.shape.write(&cluster_file)?;
    let bin_dir = crate::infra::service_binaries(args.bin_dir.as_deref())?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let opts = StackOptions {
        admin_url: args.database_url.clone(),
        nats_url: args.nats.nats_url.clone(),
        cluster_file: Some(cluster_file),
        time_scale: plan.time_scale,
        lease_ttl_s: args.lease_ttl_s,
        logs: args.out.join("logs"),
        token: token.clone(),
        keep_log: args.keep_log,
        label: "loadtest".into(),
    };
    eprintln!(
        "loadtest {:?}: {} nodes x {} GPUs, {} jobs planned; {}",
        plan.scenario,
        plan.shape.nodes,
        plan.shape.gpus_per_node,
        plan.jobs.len(),
        plan.description
    );
    let mut stack = Stack::create(opts, bin_dir).await?;
    eprintln!(
        "database {}, NATS namespace {}",
        stack.db_name, stack.namespace
    );
    let outcome = execute(&args, &plan, &mut stack, &token, &cancel).await;
    stack.stop_all();
    let services = report::services(&stack);
    let facts = match &outcome {
        Ok(o) => Some(read_facts(&stack.store, o.origin_unix_ms).await),
        Err(_) => None,
    };
    let teardown = stack.teardown().await;
    let outcome = outcome?;
    let facts = facts.context("no log facts")??;
    teardown?;
    let report = Report::build(&args, &plan, &outcome, &facts, services);
    report.print_table();
    report.write(&args.out)?;
    eprintln!(
        "report: {} (report.json, report.md, *.svg)",
        args.out.display()
    );
    if args.smoke {
        return Ok(smoke_check(&plan, &outcome, &facts));
    }
    Ok(true)
}

/// Every planned job was accepted, bound and finished, and nothing is missing.
fn smoke_check(plan: &Plan, o: &Outcome, f: &LogFacts) -> bool {
    let n = plan.jobs.len() as u64;
    let submitted = f.count("job_submitted");
    let rejected = f.count("job_rejected");
    let unbound = f.jobs.iter().filter(|j| j.bound_s.is_none()).count();
    let mut ok = true;
    let mut check = |cond: bool, what: String| {
        println!("smoke: {} {what}", if cond { "ok  " } else { "FAIL" });
        ok &= cond;
    };
    check(
        o.submit.accepted == n,
        format!("{} of {n} submissions accepted", o.submit.accepted),
    );
    check(
        submitted == n,
        format!("{submitted} of {n} JobSubmitted in the log"),
    );
    check(rejected == 0, format!("{rejected} rejected"));
    check(unbound == 0, format!("{unbound} jobs never bound"));
    check(
        f.finished == n,
        format!("{} of {n} jobs finished", f.finished),
    );
    check(
        o.status.ended() == n,
        format!("gateway view: {} of {n} ended", o.status.ended()),
    );
    ok
}

async fn wait_for_nodes(stack: &Stack, nodes: usize, cancel: &CancellationToken) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE kind = 'node_added'")
            .fetch_one(stack.store.pool())
            .await
            .context("counting nodes")?;
        if n as usize >= nodes {
            return Ok(());
        }
        if cancel.is_cancelled() {
            bail!("interrupted");
        }
        if Instant::now() > deadline {
            bail!("the agent registered {n} of {nodes} nodes in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(xs: &[f64]) -> Option<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

async fn execute(
    args: &Args,
    plan: &Plan,
    stack: &mut Stack,
    token: &str,
    cancel: &CancellationToken,
) -> Result<Outcome> {
    let mut out = Outcome {
        database: stack.db_name.clone(),
        namespace: stack.namespace.clone(),
        ..Outcome::default()
    };
    if args.ceiling_rows > 0 {
        eprintln!(
            "measuring the raw append ceiling ({} probes of {} rows, 100 per transaction)",
            args.ceiling_probes, args.ceiling_rows
        );
        for _ in 0..args.ceiling_probes {
            let rate = stack
                .store
                .raw_append_ceiling(args.ceiling_rows, 100)
                .await
                .context("measuring the raw append ceiling")?;
            out.ceiling_probes.push(rate);
        }
        out.ceiling = median(&out.ceiling_probes);
    }
    let origin = Instant::now();
    out.origin_unix_ms = wall_clock().0;
    stack.start_all().await?;
    wait_for_nodes(stack, plan.shape.nodes, cancel).await?;
    let stop_sampler = CancellationToken::new();
    let sampler = drive::spawn_sampler(
        args.nats.nats_url.clone(),
        stack.namespace.clone(),
        stack.opts.logs.clone(),
        origin,
        stop_sampler.clone(),
    );
    let client = Client::new(&stack.http, token, &stack.namespace)?;
    let timeout = Duration::from_secs_f64(args.timeout_s.max(1.0));
    out.submit_started_s = origin.elapsed().as_secs_f64();
    let cx = Ctx {
        args,
        plan,
        client: &client,
        timeout,
        cancel,
    };
    let result = match plan.scenario {
        Scenario::Burst | Scenario::Steady | Scenario::Trace => {
            run_submit_and_bind(&cx, stack, &mut out).await
        }
        Scenario::Reclaim => run_reclaim(&cx, stack, &mut out, origin).await,
        Scenario::Restart => run_restart(&cx, stack, &mut out).await,
        Scenario::Chaos => Err(anyhow::anyhow!("chaos runs through chaos::run")),
    };
    out.end_s = origin.elapsed().as_secs_f64();
    stop_sampler.cancel();
    out.samples = sampler.await.unwrap_or_default();
    result?;
    Ok(out)
}

/// What every scenario step reads.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    args: &'a Args,
    plan: &'a Plan,
    client: &'a Client,
    timeout: Duration,
    cancel: &'a CancellationToken,
}

/// `jobs` sent as fast as replies come, `--in-flight` requests open.
fn closed_loop<'a>(
    jobs: &'a [Planned],
    args: &Args,
    key_prefix: &'a str,
    bar: &'a indicatif::ProgressBar,
) -> Submission<'a> {
    Submission {
        jobs,
        in_flight: args.in_flight,
        key_prefix,
        bar,
    }
}

/// Submits the plan's jobs with a progress bar.
async fn submit_plan(
    args: &Args,
    plan: &Plan,
    client: &Client,
    cancel: &CancellationToken,
) -> Result<SubmitOutcome> {
    let bar = drive::bar(plan.jobs.len() as u64, "submitted");
    let mut s = Submission {
        jobs: &plan.jobs,
        in_flight: args.in_flight,
        key_prefix: "",
        bar: &bar,
    };
    let out = if args.batch > 1 && !plan.open_loop {
        let batch = usize::from(args.batch);
        s.in_flight = (args.in_flight / batch).max(2);
        client.submit_all_batched(&s, batch, cancel).await?
    } else {
        client.submit_all(&s, plan.open_loop, cancel).await?
    };
    bar.finish_and_clear();
    eprintln!(
        "submitted {} jobs in {:.1} s ({:.0}/s), {} failed",
        out.accepted,
        out.seconds,
        out.accepted as f64 / out.seconds.max(1e-9),
        out.failed
    );
    if cancel.is_cancelled() {
        bail!("interrupted");
    }
    Ok(out)
}

/// Submits the plan's jobs, then waits until every accepted job is known
/// to the gateway and `done` holds.
async fn submit_and_wait(
    cx: &Ctx<'_>,
    stack: &mut Stack,
    out: &mut Outcome,
    label: &str,
    progress: impl Fn(&Status) -> u64,
    done: impl Fn(&Status) -> bool,
) -> Result<()> {
    out.submit = submit_plan(cx.args, cx.plan, cx.client, cx.cancel).await?;
    let bar = drive::bar(cx.plan.jobs.len() as u64, label);
    let accepted = out.submit.accepted;
    out.status = drive::wait_until(
        cx.client,
        stack,
        &bar,
        progress,
        |s| s.jobs as u64 >= accepted && done(s),
        cx.timeout,
        cx.cancel,
    )
    .await?;
    bar.finish_and_clear();
    Ok(())
}

async fn run_submit_and_bind(cx: &Ctx<'_>, stack: &mut Stack, out: &mut Outcome) -> Result<()> {
    if cx.args.smoke {
        // Every job runs to the end.
        submit_and_wait(cx, stack, out, "ended", Status::ended, |s| {
            s.ended() >= s.jobs as u64
        })
        .await
    } else {
        submit_and_wait(
            cx,
            stack,
            out,
            "bound",
            |s| s.bound_or_later() + s.rejected(),
            |s| s.waiting() == 0,
        )
        .await
    }
}

async fn owner_bound(stack: &Stack, tenant: &str) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(DISTINCT b.aggregate_id) FROM events b
         JOIN events s ON s.aggregate_kind = 'job' AND s.aggregate_id = b.aggregate_id AND s.kind = 'job_submitted'
         WHERE b.kind = 'job_bound' AND s.payload->'spec'->>'tenant' = $1",
    )
    .bind(tenant)
    .fetch_one(stack.store.pool())
    .await
    .context("counting the owner's bound jobs")
}

/// The run's facts from the log, with the fold of the whole log (goodput,
/// reclaim latencies).
async fn read_facts(
    store: &gpusched_store::EventStore,
    origin_unix_ms: u64,
) -> Result<metrics::LogFacts> {
    let mut facts = metrics::read_log(store, origin_unix_ms).await?;
    facts.fold = metrics::fold_log(store).await?;
    Ok(facts)
}

async fn run_reclaim(
    cx: &Ctx<'_>,
    stack: &mut Stack,
    out: &mut Outcome,
    origin: Instant,
) -> Result<()> {
    let Ctx {
        args,
        plan,
        client,
        timeout,
        cancel,
    } = *cx;
    let gpn = plan.shape.gpus_per_node;
    let owner_nominal = plan.shape.tenants[0].1;
    let (fill, back) = workload::reclaim(plan.shape.nodes, gpn, owner_nominal, 86_400);
    let as_planned = |v: Vec<gpusched_model::JobSpec>| -> Vec<Planned> {
        v.into_iter()
            .map(|spec| Planned {
                at: Duration::ZERO,
                spec,
            })
            .collect()
    };
    let (fill, back) = (as_planned(fill), as_planned(back));
    let bar = drive::bar(fill.len() as u64, "borrower jobs submitted");
    let s1 = client
        .submit_all(&closed_loop(&fill, args, "fill-", &bar), false, cancel)
        .await?;
    bar.finish_and_clear();
    let bar = drive::bar(fill.len() as u64, "borrower jobs running");
    let nfill = fill.len() as u64;
    drive::wait_until(
        client,
        stack,
        &bar,
        |s| s.phases.get("running").copied().unwrap_or(0),
        |s| s.phases.get("running").copied().unwrap_or(0) >= nfill,
        timeout,
        cancel,
    )
    .await?;
    bar.finish_and_clear();
    let wait = Duration::from_secs_f64(args.reclaim_wait_s.max(0.0));
    let bar = drive::bar(wait.as_secs(), "s until the owner returns");
    let until = Instant::now() + wait;
    while Instant::now() < until {
        if cancel.is_cancelled() {
            bail!("interrupted");
        }
        bar.set_position(
            wait.as_secs()
                .saturating_sub(until.saturating_duration_since(Instant::now()).as_secs()),
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bar.finish_and_clear();
    let back_at_s = origin.elapsed().as_secs_f64();
    let bar = drive::bar(back.len() as u64, "owner jobs submitted");
    let s2 = client
        .submit_all(&closed_loop(&back, args, "back-", &bar), false, cancel)
        .await?;
    bar.finish_and_clear();
    let bar = drive::bar(back.len() as u64, "owner jobs bound");
    let deadline = Instant::now() + timeout;
    loop {
        let n = owner_bound(stack, workload::RECLAIM_OWNER).await?;
        bar.set_position(n.max(0) as u64);
        if n as usize >= back.len() {
            break;
        }
        if let Some(why) = stack.crashed() {
            bail!("{why}");
        }
        if cancel.is_cancelled() {
            bail!("interrupted");
        }
        if Instant::now() > deadline {
            bail!("the owner got {n} of {} jobs bound in time", back.len());
        }
        stack.sample_rss();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bar.finish_and_clear();
    out.status = client.status().await.unwrap_or_default();
    let mut latencies_ms = s1.latencies_ms;
    latencies_ms.extend(s2.latencies_ms);
    out.submit = SubmitOutcome {
        accepted: s1.accepted + s2.accepted,
        failed: s1.failed + s2.failed,
        seconds: s1.seconds + s2.seconds,
        latencies_ms,
        worst_lag_ms: 0.0,
        resent: s1.resent + s2.resent,
    };
    out.reclaim = Some(ReclaimOutcome {
        back_at_s,
        owner_jobs: back.len(),
    });
    Ok(())
}

async fn first_append_after(stack: &Stack, producer: &str, epoch: u64) -> Result<Option<f64>> {
    let epoch = i64::try_from(epoch).context("the lease's epoch is out of bigint's range")?;
    let ms: Option<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM min(recorded_at)) * 1000)::float8 FROM events
         WHERE producer = $1 AND epoch > $2",
    )
    .bind(producer)
    .bind(epoch)
    .fetch_one(stack.store.pool())
    .await
    .context("finding the restarted service's first append")?;
    Ok(ms)
}

async fn run_restart(cx: &Ctx<'_>, stack: &mut Stack, out: &mut Outcome) -> Result<()> {
    let Ctx {
        args,
        plan,
        client,
        cancel,
        ..
    } = *cx;
    let phase = |s: &Status, p: &str| s.phases.get(p).copied().unwrap_or(0);
    // Settled: every job validated and charged, the rest waits for GPUs.
    submit_and_wait(
        cx,
        stack,
        out,
        "decided",
        |s| (s.jobs as u64).saturating_sub(phase(s, "submitted") + phase(s, "queued")),
        |s| phase(s, "submitted") + phase(s, "queued") + phase(s, "bound") == 0,
    )
    .await?;
    stack.sample_rss();
    let probes = workload::synthetic(
        20,
        &plan.shape.tenant_names(),
        plan.shape.gpus_per_node,
        99,
        None,
    );
    for (round, service) in args.restart.iter().enumerate() {
        if cancel.is_cancelled() {
            bail!("interrupted");
        }
        let status = client.status().await.unwrap_or_default();
        let log_events = stack
            .store
            .max_seq()
            .await
            .context("reading the log's length")?;
        let old_epoch = stack
            .store
            .lease(service, "default")
            .await
            .context("reading the lease")?
            .map_or(0, |l| l.epoch);
        let killed_stats = stack
            .live(service)
            .and_then(|p| stack::read_stats(&p.stats_file));
        let killed = stack.kill(service)?;
        let kill_ms = wall_clock().0 as f64;
        let peak = stack
            .procs
            .iter()
            .find(|p| p.instance == killed)
            .and_then(|p| p.peak_rss_kib);
        // Restarted in place, as a supervisor does: under the same name,
        // which takes the lease back as soon as the old session is gone.
        let instance = stack.restart_in_place(service, &killed)?;
        eprintln!(
            "killed {killed} with {} jobs waiting; restarted {instance} in place",
            status.waiting()
        );
        // Work for it: a few fresh submissions (admission and quota
        // decide on them at once).
        let (quiet, prefix) = (indicatif::ProgressBar::hidden(), format!("probe{round}-"));
        let probe = Submission {
            jobs: &probes,
            in_flight: 20,
            key_prefix: &prefix,
            bar: &quiet,
        };
        let _ = client.submit_all(&probe, false, cancel).await;
        let stats_file = stack
            .live(service)
            .map(|p| p.stats_file.clone())
            .context("the restarted process")?;
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut ready = None;
        while Instant::now() < deadline && !cancel.is_cancelled() {
            if let Some(s) = stack::read_stats(&stats_file) {
                if s.ready_unix_ms > 0 {
                    ready = Some(s);
                    break;
                }
            }
            if let Some(why) = stack.crashed() {
                bail!("{why}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Give it a moment to decide something, if it has anything to.
        let mut first = None;
        let until = Instant::now() + Duration::from_secs(5);
        while first.is_none() && Instant::now() < until {
            first = first_append_after(stack, service, old_epoch).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let since_kill = |t: u64| (t > 0).then_some(t as f64 - kill_ms);
        let r = RestartOutcome {
            service: service.clone(),
            pending: status.waiting(),
            log_events,
            kill_to_ready_ms: ready.as_ref().and_then(|s| since_kill(s.ready_unix_ms)),
            rebuild_ms: ready.as_ref().map(|s| s.rebuild_ms),
            folded_at_takeover: ready.as_ref().map(|s| s.takeover_folded),
            kill_to_first_append_ms: first.map(|t| t - kill_ms),
            killed_peak_rss_mib: peak.map(|k| k as f64 / 1024.0),
            snapshot_seq: ready.as_ref().map(|s| s.snapshot_seq),
            snapshot_age_ms: ready.as_ref().map(|s| s.snapshot_age_ms),
            snapshot_load_ms: ready.as_ref().map(|s| s.snapshot_load_ms),
            folded_after_snapshot: ready.as_ref().map(|s| s.seq.saturating_sub(s.snapshot_seq)),
            kill_to_caught_up_ms: ready.as_ref().and_then(|s| since_kill(s.caught_up_unix_ms)),
            kill_to_lease_ms: ready.as_ref().and_then(|s| since_kill(s.lease_unix_ms)),
            killed_snapshots: killed_stats.map(|s| {
                (
                    s.snapshots_written,
                    s.snapshot_bytes,
                    s.snapshot_hold_us_max,
                )
            }),
        };
        eprintln!("  {}", r.steps());
        out.restarts.push(r);
    }
    out.snapshots = stack
        .store
        .snapshots()
        .await
        .context("listing the snapshots")?
        .into_iter()
        .map(|s| (s.seq, s.bytes, s.taken_by))
        .collect();
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use clap::{Parser, ValueEnum};

    use super::{median, plan};
    use crate::{workload, Args, Scenario};

    /// Every documented default command (`loadtest <scenario>`, no other
    /// flag) plans a cluster that the run's own check accepts and jobs that
    /// pass the model's field checks for tenants the cluster has: a
    /// validation change that breaks a default fails here, not for the
    /// first user who runs it. Chaos plans in its own module.
    #[test]
    fn every_scenarios_default_command_plans_a_cluster_and_jobs_that_validate() {
        for scenario in Scenario::value_variants() {
            if *scenario == Scenario::Chaos {
                continue;
            }
            let name = scenario.to_possible_value().expect("a name");
            let name = name.get_name();
            let args = Args::try_parse_from(["loadtest", name]).expect("the defaults parse");
            assert_eq!(args.scenario(), *scenario);
            let p = plan(&args).unwrap_or_else(|e| panic!("loadtest {name}: {e:#}"));
            let cluster = p
                .shape
                .parse()
                .unwrap_or_else(|e| panic!("loadtest {name}: {e:#}"));
            assert_eq!(cluster.nodes, p.shape.nodes, "loadtest {name}");
            let mut specs: Vec<_> = p.jobs.iter().map(|j| j.spec.clone()).collect();
            if *scenario == Scenario::Reclaim {
                // Its jobs are made when it runs: the fill and the return.
                let gpn = p.shape.gpus_per_node;
                let (fill, back) = workload::reclaim(p.shape.nodes, gpn, p.shape.tenants[0].1, 1);
                assert!(!fill.is_empty() && !back.is_empty(), "loadtest {name}");
                specs.extend(fill.into_iter().chain(back));
            }
            assert!(!specs.is_empty(), "loadtest {name}: no jobs");
            for spec in &specs {
                spec.check_fields()
                    .unwrap_or_else(|e| panic!("loadtest {name}: a planned job: {e}"));
                assert!(
                    cluster.tenants.contains(&spec.tenant),
                    "loadtest {name}: a job for {}, not in the cluster",
                    spec.tenant
                );
            }
        }
    }

    #[test]
    fn the_ceiling_is_the_middle_probe_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[140.0]), Some(140.0));
        assert_eq!(median(&[140.0, 94.0, 101.0]), Some(101.0));
        assert_eq!(median(&[140.0, 94.0, 101.0, 120.0]), Some(110.5));
    }
}
