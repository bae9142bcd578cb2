//! `loadtest chaos --seed N [--short]`: the whole deployment on a private
//! Postgres and nats-server, submissions through the API at a steady rate
//! (an `Idempotency-Key` per job, retried under the same key), one fault
//! per phase, then every accepted job must end; the verdict comes from
//! the log (`check`) and goes into a table (`report`).
//!
//! Sub-modules: `plan` (faults and timing from the seed), `load` (clients
//! and their records), `faults` (injecting each fault), `bus` (bad
//! messages), `check` (the verdict), `report` (table, JSON, Markdown, log
//! excerpts).
//!
//! Owns: the run's order (start, phases, drain, probe, checks, teardown),
//! restarting a service that exited on its own (after recording it, so
//! later phases are still measured), and cleanup on every path.
//!
//! Must never: use the shared Postgres or NATS, hide a failure (a crash,
//! a fault that could not be injected, a check that could not run all
//! fail the run), or leave a process or directory behind.

mod bus;
mod check;
mod faults;
mod load;
mod plan;
mod report;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpusched_runtime::wall_clock;
use gpusched_store::{StoredEvent, Until};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sqlx::Row as _;
use tokio_util::sync::CancellationToken;

use self::check::{Fold, PhaseRun};
use self::load::{ApiClient, JobRecord, Ledger, Load};
use self::plan::{ChaosPlan, Goals, DECIDERS};
use self::report::{ChaosReport, Check, LogMarks};
use crate::infra::Infra;
use crate::stack::{self, Stack, StackOptions};
use crate::workload::{self, ClusterShape};
use crate::Args;

/// Runs the chaos scenario; `Ok(false)` when any check failed.
pub async fn run(args: Args) -> Result<bool> {
    let cancel = CancellationToken::new();
    {
        let c = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninterrupted: stopping everything and cleaning up");
                c.cancel();
            }
        });
    }
    let mut plan = plan::plan(args.seed, args.short);
    plan.goals = Goals {
        recovery: seconds("--recovery-goal-s", args.recovery_goal_s)?,
        stall: seconds("--stall-goal-s", args.stall_goal_s)?,
    };
    std::fs::create_dir_all(args.out.join("logs"))
        .with_context(|| format!("--out {}: cannot create", args.out.display()))?;
    eprintln!(
        "chaos {} form, seed {}: {} phases, ~{:.0} s of load at {}/s, {} nodes, lease TTL {} s",
        if plan.short { "short" } else { "long" },
        plan.seed,
        plan.phases.len(),
        plan.planned_s(),
        plan.rate,
        plan.nodes,
        plan.lease_ttl_s
    );
    let mut infra = Infra::start()
        .await
        .context("starting the private Postgres and nats-server")?;
    eprintln!(
        "private Postgres on 127.0.0.1:{}, nats-server on 127.0.0.1:{} (in {})",
        infra.pg.port,
        infra.nats.port,
        infra.root().display()
    );
    let result = session(&args, &plan, &mut infra, &cancel).await;
    infra.copy_logs(&args.out.join("logs"));
    drop(infra);
    let report = result?;
    report.print_table();
    report.write(&args.out)?;
    eprintln!(
        "report: {} (report.json, report.md, logs/)",
        args.out.display()
    );
    Ok(report.passed)
}

fn seconds(flag: &str, v: f64) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0) {
        bail!("{flag}: must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

async fn session(
    args: &Args,
    plan: &ChaosPlan,
    infra: &mut Infra,
    cancel: &CancellationToken,
) -> Result<ChaosReport> {
    let shape = ClusterShape::in_blocks(
        plan.nodes,
        plan.nodes_per_block,
        args.gpus_per_node,
        plan.tenants,
        1.0,
    );
    let cluster_file = args.out.join("cluster.toml");
    shape.write(&cluster_file)?;
    let bin_dir = crate::infra::service_binaries(args.bin_dir.as_deref())?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let opts = StackOptions {
        admin_url: infra.pg.url(),
        nats_url: infra.nats.url(),
        cluster_file: Some(cluster_file),
        time_scale: plan.time_scale,
        lease_ttl_s: plan.lease_ttl_s,
        logs: args.out.join("logs"),
        token: token.clone(),
        keep_log: false,
        label: "loadtest".into(),
    };
    let mut stack = Stack::create(opts, bin_dir).await?;
    let mut run = Run {
        plan,
        shape,
        token,
        cancel,
        watch: Watch::default(),
    };
    let r = run.drive(&mut stack, infra).await;
    stack.stop_all();
    stack.store.pool().close().await;
    r
}

/// Service processes that exited on their own: recorded, then started
/// again (at most once a second per service) so later phases still run.
#[derive(Default)]
struct Watch {
    crashes: Vec<String>,
    restart: Vec<(String, Instant)>,
}

impl Watch {
    fn tick(&mut self, stack: &mut Stack) {
        for (service, instance, status) in stack.reap() {
            let log = stack.opts.logs.join(format!("{instance}.log"));
            let said = report::tail(&log, 3).join(" ⏎ ");
            self.crashes.push(format!(
                "{instance} exited ({status}); its log ends: {said}"
            ));
            self.restart
                .push((service, Instant::now() + Duration::from_secs(1)));
        }
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self.restart.drain(..).partition(|(_, t)| *t <= now);
        self.restart = later;
        for (service, _) in due {
            match stack.start(&service) {
                Ok(i) => eprintln!("  restarted {service} as {i} after it exited"),
                Err(e) => self.crashes.push(format!("restarting {service}: {e:#}")),
            }
        }
    }

    /// Waits `d`, watching the processes.
    async fn observe(
        &mut self,
        stack: &mut Stack,
        d: Duration,
        cancel: &CancellationToken,
    ) -> Result<()> {
        let until = Instant::now() + d;
        loop {
            self.tick(stack);
            if cancel.is_cancelled() {
                bail!("interrupted");
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            tokio::time::sleep(left.min(Duration::from_millis(200))).await;
        }
    }
}

/// The run in progress.
struct Run<'a> {
    plan: &'a ChaosPlan,
    shape: ClusterShape,
    token: String,
    cancel: &'a CancellationToken,
    watch: Watch,
}

/// What the phases left for the checks.
struct Phases {
    runs: Vec<PhaseRun>,
    marks: Vec<(LogMarks, LogMarks)>,
    records: Vec<JobRecord>,
}

/// Everything the verdict reads besides the log.
struct Ending {
    phases: Phases,
    probes: Vec<JobRecord>,
    /// Why not every accepted job ended in time, if not.
    drained: Option<String>,
    end_ms: u64,
}

impl Run<'_> {
    async fn drive(&mut self, stack: &mut Stack, infra: &mut Infra) -> Result<ChaosReport> {
        stack.start_all().await?;
        stack.start("quota")?;
        wait_ready(stack, self.shape.nodes, self.cancel).await?;
        let client = ApiClient::new(&stack.http, &self.token)?;
        let specs: Arc<Vec<gpusched_model::JobSpec>> = Arc::new(
            workload::synthetic(
                2000,
                &self.shape.tenant_names(),
                self.shape.gpus_per_node,
                self.plan.seed,
                None,
            )
            .into_iter()
            .map(|p| p.spec)
            .collect(),
        );
        let phases = self.phases(stack, infra, &client, specs.clone()).await?;
        let drained = self.drain(stack, &phases.records, self.plan.drain).await;
        if self.cancel.is_cancelled() {
            bail!("interrupted");
        }
        let probes = self.probe(stack, &client, specs).await;
        let ending = Ending {
            phases,
            probes,
            drained,
            end_ms: wall_clock().0,
        };
        self.verdict(stack, infra, &client, ending).await
    }

    async fn phases(
        &mut self,
        stack: &mut Stack,
        infra: &mut Infra,
        client: &ApiClient,
        specs: Arc<Vec<gpusched_model::JobSpec>>,
    ) -> Result<Phases> {
        let ledger = Ledger::default();
        let stop = CancellationToken::new();
        let load = tokio::spawn(
            Load {
                client: client.clone(),
                specs,
                rate: self.plan.rate,
                prefix: "job-".into(),
                limit: None,
                give_up: self.plan.give_up,
                ledger: ledger.clone(),
            }
            .run(stop.clone()),
        );
        let mut rng = ChaCha8Rng::seed_from_u64(self.plan.seed ^ 0x5eed_c4a0_5bad_f00d);
        let mut out = Phases {
            runs: Vec::new(),
            marks: Vec::new(),
            records: Vec::new(),
        };
        for i in 0..self.plan.phases.len() {
            match self.phase(i, stack, infra, &mut rng, &ledger).await {
                Ok((run, marks)) => {
                    out.runs.push(run);
                    out.marks.push(marks);
                }
                Err(e) => {
                    stop.cancel();
                    return Err(e);
                }
            }
        }
        stop.cancel();
        eprintln!("faults done; waiting for the last submissions' retries");
        let _ = load.await;
        out.records = load::snapshot(&ledger);
        Ok(out)
    }

    /// Phase `i`: steady load, the fault, load while it recovers, then
    /// the check that every job accepted so far is in the log.
    async fn phase(
        &mut self,
        i: usize,
        stack: &mut Stack,
        infra: &mut Infra,
        rng: &mut ChaCha8Rng,
        ledger: &Ledger,
    ) -> Result<(PhaseRun, (LogMarks, LogMarks))> {
        let ph = &self.plan.phases[i];
        let logs = stack.opts.logs.clone();
        let start_ms = wall_clock().0;
        let from = LogMarks::take(&logs);
        self.watch.observe(stack, ph.lead, self.cancel).await?;
        let inj = faults::inject(&ph.fault, faults::Target { stack, infra, rng }).await;
        eprintln!(
            "[{}/{}] {}: {} ({:.1} s){}",
            i + 1,
            self.plan.phases.len(),
            ph.fault.label(),
            inj.detail,
            inj.end_ms.saturating_sub(inj.start_ms) as f64 / 1000.0,
            inj.error
                .as_deref()
                .map(|e| format!(" ERROR {e}"))
                .unwrap_or_default()
        );
        self.watch.observe(stack, ph.observe, self.cancel).await?;
        let (missing_after, note) = interim(stack, &load::snapshot(ledger)).await;
        let run = PhaseRun {
            fault: ph.fault.clone(),
            start_ms,
            end_ms: wall_clock().0,
            fault_start_ms: inj.start_ms,
            fault_end_ms: inj.end_ms,
            detail: format!("{}{note}", inj.detail),
            ready_ms: inj.new_instance.as_deref().and_then(|n| ready_ms(stack, n)),
            error: inj.error,
            crashes: std::mem::take(&mut self.watch.crashes),
            missing_after,
        };
        Ok((run, (from, LogMarks::take(&logs))))
    }

    /// Waits until every accepted job of `records` has ended in the log
    /// (or `limit`); returns a note when some had not.
    async fn drain(
        &mut self,
        stack: &mut Stack,
        records: &[JobRecord],
        limit: Duration,
    ) -> Option<String> {
        let ids: Vec<String> = records
            .iter()
            .filter_map(|r| r.id())
            .map(|i| i.to_string())
            .collect();
        let deadline = Instant::now() + limit;
        let mut last = 0i64;
        loop {
            match ended_count(stack, &ids).await {
                Ok(n) if n as usize >= ids.len() => return None,
                Ok(n) => last = n,
                Err(e) => eprintln!("  drain: {e:#}"),
            }
            if Instant::now() > deadline {
                return Some(format!(
                    "{} of {} accepted jobs ended within {} s of the last phase",
                    last,
                    ids.len(),
                    limit.as_secs()
                ));
            }
            if self
                .watch
                .observe(stack, Duration::from_millis(500), self.cancel)
                .await
                .is_err()
            {
                return Some("interrupted while draining".into());
            }
        }
    }

    /// Ten jobs after every fault: each must be accepted and end.
    async fn probe(
        &mut self,
        stack: &mut Stack,
        client: &ApiClient,
        specs: Arc<Vec<gpusched_model::JobSpec>>,
    ) -> Vec<JobRecord> {
        let ledger = Ledger::default();
        Load {
            client: client.clone(),
            specs,
            rate: 5.0,
            prefix: "probe-".into(),
            limit: Some(10),
            give_up: Duration::from_secs(30),
            ledger: ledger.clone(),
        }
        .run(CancellationToken::new())
        .await;
        let probes = load::snapshot(&ledger);
        let _ = self.drain(stack, &probes, Duration::from_secs(30)).await;
        probes
    }

    async fn verdict(
        &mut self,
        stack: &mut Stack,
        infra: &Infra,
        client: &ApiClient,
        ending: Ending,
    ) -> Result<ChaosReport> {
        let Ending {
            phases,
            probes,
            drained,
            end_ms,
        } = ending;
        let mut checks = Vec::new();
        checks.push(Check {
            name: "every accepted job ended before the deadline".into(),
            ok: drained.is_none(),
            detail: drained.unwrap_or_else(|| "yes".into()),
        });
        let events = read_log(stack).await.context("reading the log back")?;
        let fold = Fold::run(&events, self.plan.time_scale, end_ms);
        let mut rows = check::rows(&phases.runs, &phases.records, &probes, &fold);
        check::judge_rows(&mut rows, &phases.runs, &fold, self.plan.goals);
        self.watch.tick(stack);
        if let Some(last) = rows.last_mut() {
            for c in std::mem::take(&mut self.watch.crashes) {
                last.failures.push(format!("crashed: {c}"));
            }
        }
        checks.extend(run_checks(stack, client, &fold, &phases.runs, &rows, self.plan.goals).await);
        let excerpts = failing_excerpts(&rows, &phases.marks, &stack.opts.logs);
        let passed = rows.iter().all(|r| r.failures.is_empty()) && checks.iter().all(|c| c.ok);
        Ok(ChaosReport {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            finished_utc: chrono::Utc::now().to_rfc3339(),
            plan: self.plan.clone(),
            infra_dir: infra.root().display().to_string(),
            postgres_port: infra.pg.port,
            nats_port: infra.nats.port,
            database: stack.db_name.clone(),
            namespace: stack.namespace.clone(),
            jobs_sent: phases.records.len() + probes.len(),
            events: events.len(),
            rows,
            phases: phases.runs,
            checks,
            excerpts,
            passed,
        })
    }
}

/// What the processes logged during each failing row (the probe row:
/// since the last phase ended).
fn failing_excerpts(
    rows: &[check::Row],
    marks: &[(LogMarks, LogMarks)],
    logs: &std::path::Path,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out = std::collections::BTreeMap::new();
    for (i, r) in rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.failures.is_empty())
    {
        let (from, to) = match marks.get(i) {
            Some((a, b)) => (a.clone(), b.clone()),
            None => (
                marks.last().map(|m| m.1.clone()).unwrap_or_default(),
                LogMarks::take(logs),
            ),
        };
        out.insert(r.label.clone(), report::excerpts(&from, &to, 8));
    }
    out
}

/// Waits until the agent registered every node and the gateway's view has
/// caught up with the log (so it knows the tenants it validates against).
async fn wait_ready(stack: &mut Stack, nodes: usize, cancel: &CancellationToken) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let client = ApiClient::new(&stack.http, &stack.opts.token)?;
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM events WHERE kind = 'node_added'")
            .fetch_one(stack.store.pool())
            .await
            .context("counting nodes")?;
        let max = stack
            .store
            .max_seq()
            .await
            .context("reading the log's length")?;
        let seen = client.status().await.map_or(0, |s| s.seq);
        if n as usize >= nodes && seen >= max {
            return Ok(());
        }
        if let Some(why) = stack.crashed() {
            bail!("{why}");
        }
        if cancel.is_cancelled() {
            bail!("interrupted");
        }
        if Instant::now() > deadline {
            bail!("in 120 s the agent registered {n} of {nodes} nodes, the gateway saw {seen} of {max} events");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Accepted jobs so far that are not in the log: (count, a note if the
/// check itself failed).
async fn interim(stack: &Stack, records: &[JobRecord]) -> (u64, String) {
    let keys: Vec<String> = records
        .iter()
        .filter(|r| r.id().is_some())
        .map(JobRecord::log_key)
        .collect();
    let mut last_err = String::new();
    for _ in 0..5 {
        let r: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM events WHERE idempotency_key = ANY($1::text[])",
        )
        .bind(&keys)
        .fetch_one(stack.store.pool())
        .await;
        match r {
            Ok(n) => {
                return (
                    (keys.len() as u64).saturating_sub(n.max(0) as u64),
                    String::new(),
                )
            }
            Err(e) => last_err = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (
        0,
        format!("; the check after the fault could not read the log: {last_err}"),
    )
}

/// When the instance's stats file says it became ready, Unix ms.
fn ready_ms(stack: &Stack, instance: &str) -> Option<u64> {
    let p = stack.procs.iter().find(|p| p.instance == instance)?;
    stack::read_stats(&p.stats_file)
        .map(|s| s.ready_unix_ms)
        .filter(|t| *t > 0)
}

async fn ended_count(stack: &Stack, ids: &[String]) -> Result<i64> {
    sqlx::query_scalar(
        "SELECT count(DISTINCT aggregate_id) FROM events
          WHERE aggregate_kind = 'job' AND aggregate_id = ANY($1::text[])
            AND kind IN ('job_finished', 'job_rejected', 'job_cancelled', 'job_dependency_failed')",
    )
    .bind(ids)
    .fetch_one(stack.store.pool())
    .await
    .context("counting ended jobs")
}

async fn read_log(stack: &Stack) -> Result<Vec<StoredEvent>> {
    let mut out: Vec<StoredEvent> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.seq);
        let page = stack.store.read_from(after, 10_000).await?;
        if page.is_empty() {
            return Ok(out);
        }
        out.extend(page);
    }
}

/// The run-wide checks: invariants, replay = live, fencing, leases (every
/// service led by a live process that keeps renewing), and the longest
/// stall outside the fault windows.
async fn run_checks(
    stack: &Stack,
    client: &ApiClient,
    fold: &Fold,
    phases: &[PhaseRun],
    rows: &[check::Row],
    goals: Goals,
) -> Vec<Check> {
    let mut checks = vec![Check {
        name: "core invariants on the final state".into(),
        ok: fold.state.check_invariants().is_ok(),
        detail: fold
            .state
            .check_invariants()
            .err()
            .unwrap_or_else(|| "hold".into()),
    }];
    checks.push(replay_check(stack, client).await);
    checks.push(Check {
        name: "fencing (no append under an epoch older than one already used)".into(),
        ok: fold.fencing.is_empty(),
        detail: if fold.fencing.is_empty() {
            "every producer's epochs only grow along the log".into()
        } else {
            fold.fencing
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        },
    });
    checks.push(lease_check(stack).await);
    let win = check::windows(phases, rows);
    let worst = fold
        .stalls
        .iter()
        .map(|g| check::outside(g, &win))
        .max()
        .unwrap_or((0, 0));
    checks.push(Check {
        name: format!(
            "no stall over {} s outside a fault window",
            goals.stall.as_secs_f64()
        ),
        ok: worst.0 <= goals.stall.as_millis() as u64,
        detail: format!(
            "longest {:.2} s (from {}); {} finish reports lost a race to a preemption or requeue",
            worst.0 as f64 / 1000.0,
            chrono::DateTime::from_timestamp_millis(worst.1 as i64)
                .map_or_else(String::new, |t| t.to_rfc3339()),
            fold.raced_finishes
        ),
    });
    checks
}

async fn replay_check(stack: &Stack, client: &ApiClient) -> Check {
    let name = "replay to the gateway's sequence gives its state hash".to_string();
    let mut live = client.status().await;
    for _ in 0..20 {
        if live.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        live = client.status().await;
    }
    let live = match live {
        Ok(s) => s,
        Err(e) => {
            return Check {
                name,
                ok: false,
                detail: format!("no status from the gateway: {e:#}"),
            }
        }
    };
    match stack.store.replay(Until::Seq(live.seq)).await {
        Ok(state) => {
            let h = state.state_hash();
            Check {
                name,
                ok: h == live.state_hash,
                detail: format!("seq {}: live {}, replay {h}", live.seq, live.state_hash),
            }
        }
        Err(e) => Check {
            name,
            ok: false,
            detail: format!("replay failed: {e}"),
        },
    }
}

async fn lease_check(stack: &Stack) -> Check {
    let name = "every service is led by a live process whose lease is current".to_string();
    let rows =
        sqlx::query("SELECT service, partition, holder, expires_at > now() AS current FROM leases")
            .fetch_all(stack.store.pool())
            .await;
    let rows = match rows {
        Ok(r) => r,
        Err(e) => {
            return Check {
                name,
                ok: false,
                detail: format!("reading leases: {e}"),
            }
        }
    };
    let live = |i: &str| stack.procs.iter().any(|p| p.instance == i && !p.stopped);
    let mut problems = Vec::new();
    let gateway = stack
        .live("gateway")
        .map(|p| p.instance.clone())
        .unwrap_or_default();
    let wanted = DECIDERS
        .iter()
        .map(|s| (s.to_string(), "default".to_string()))
        .chain([("gateway".to_string(), gateway)]);
    for (service, partition) in wanted {
        let row = rows.iter().find(|r| {
            r.try_get::<String, _>("service")
                .is_ok_and(|s| s == service)
                && r.try_get::<String, _>("partition")
                    .is_ok_and(|p| p == partition)
        });
        let Some(row) = row else {
            problems.push(format!("{service}: no lease"));
            continue;
        };
        let holder: String = row.try_get("holder").unwrap_or_default();
        let current: bool = row.try_get("current").unwrap_or(false);
        if !live(&holder) {
            problems.push(format!("{service}: held by {holder}, which is not running"));
        } else if !current {
            problems.push(format!("{service}: {holder} stopped renewing"));
        }
    }
    Check {
        name,
        ok: problems.is_empty(),
        detail: if problems.is_empty() {
            "yes".into()
        } else {
            problems.join("; ")
        },
    }
}
