//! The run's report: one [`Report`] built from the measurements, printed
//! as a table, written as `report.json` and `report.md`, with SVG plots of
//! queue depth, throughput and p99 latency over time.
//!
//! Owns: which figures are derived how (windows, rates, goal checks) and
//! how they are shown.
//!
//! Must never: measure anything itself, or round a figure so that a missed
//! goal looks met.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use gpusched_core::GoodputSummary;
use gpusched_runtime::histogram_quantile_us;
use plotters::prelude::*;
use serde::Serialize;

use crate::metrics::{LogFacts, Percentiles};
use crate::outcome::{Outcome, Plan, ReclaimOutcome, RestartOutcome};
use crate::stack::{read_stats, Stack};
use crate::{Args, Scenario};

/// One service process.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceReport {
    /// Service.
    pub service: String,
    /// Instance.
    pub instance: String,
    /// Peak resident memory, MiB.
    pub peak_rss_mib: Option<f64>,
    /// CPU time used over the run (user + system), seconds.
    pub cpu_s: Option<f64>,
    /// Decide cycles run.
    pub cycles: u64,
    /// Appends made.
    pub batches: u64,
    /// Events appended.
    pub appended: u64,
    /// Events `apply` refused.
    pub superseded: u64,
    /// Median cycle time (decide + append + fold, cycles that appended), ms.
    pub cycle_p50_ms: Option<f64>,
    /// 99th percentile cycle time, ms.
    pub cycle_p99_ms: Option<f64>,
}

/// Every process's figures (after the processes stopped).
pub fn services(stack: &Stack) -> Vec<ServiceReport> {
    stack
        .procs
        .iter()
        .map(|p| {
            let s = read_stats(&p.stats_file);
            let q = |q: f64| {
                s.as_ref()
                    .and_then(|s| histogram_quantile_us(&s.cycle_hist, q))
                    .map(|us| us / 1000.0)
            };
            ServiceReport {
                service: p.service.clone(),
                instance: p.instance.clone(),
                peak_rss_mib: p.peak_rss_kib.map(|k| k as f64 / 1024.0),
                cpu_s: p.cpu_s,
                cycles: s.as_ref().map_or(0, |s| s.cycles),
                batches: s.as_ref().map_or(0, |s| s.batches),
                appended: s.as_ref().map_or(0, |s| s.appended),
                superseded: s.as_ref().map_or(0, |s| s.superseded),
                cycle_p50_ms: q(0.5),
                cycle_p99_ms: q(0.99),
            }
        })
        .collect()
}

/// A goal the load test judges, and how this run did.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    /// The goal.
    pub goal: String,
    /// Measured.
    pub measured: String,
    /// Met?
    pub met: bool,
}

/// The reclaim's figures.
#[derive(Clone, Debug, Serialize)]
pub struct ReclaimReport {
    /// Owner jobs.
    pub owner_jobs: usize,
    /// Owner's first submission → its last job bound, seconds.
    pub reclaim_latency_s: f64,
    /// Per owner job, submit → bound, ms.
    pub owner_submit_to_bound_ms: Percentiles,
    /// Per reclaim, from the moment its job was eligible to reclaim (within
    /// nominal, blocked only by borrowers) to its start, ms.
    pub eligible_to_start_ms: Percentiles,
    /// Victims preempted.
    pub preempted: u64,
    /// Work lost by the victims, GPU-hours of wall time.
    pub lost_gpu_hours_wall: f64,
    /// The same in simulated time (× time scale).
    pub lost_gpu_hours_simulated: f64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Scenario.
    pub scenario: Scenario,
    /// Smoke run?
    pub smoke: bool,
    /// The command line.
    pub command: String,
    /// When, UTC.
    pub finished_utc: String,
    /// The run's database (dropped at the end).
    pub database: String,
    /// The run's NATS root (streams deleted at the end).
    pub namespace: String,
    /// Nodes.
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Tenants and nominal quotas.
    pub tenants: Vec<(String, u64)>,
    /// Agents' time scale.
    pub time_scale: f64,
    /// Workload.
    pub workload: String,
    /// Jobs planned.
    pub jobs: usize,
    /// Jobs a submission request carried (1: `POST /v1/jobs`, more:
    /// `POST /v1/jobs:batch`).
    pub batch: u16,
    /// Submissions accepted.
    pub submitted: u64,
    /// Submissions failed.
    pub submit_failed: u64,
    /// Batch items the gateway answered busy and that were sent again.
    pub submit_resent: u64,
    /// Seconds spent submitting.
    pub submit_seconds: f64,
    /// Submissions accepted per second.
    pub submissions_per_s: f64,
    /// Client-side submit request latency, ms.
    pub submit_request_ms: Percentiles,
    /// Open loop: worst lateness of a submission, ms.
    pub submit_worst_lag_ms: f64,
    /// First submission → last binding (log times), seconds.
    pub window_s: f64,
    /// Jobs admitted (quota charged) per second over the window.
    pub admitted_per_s: f64,
    /// Jobs bound per second over the window.
    pub bound_per_s: f64,
    /// Jobs never bound.
    pub unbound: usize,
    /// Submit → bound (JobSubmitted → first JobBound in the log), ms.
    pub submit_to_bound_ms: Percentiles,
    /// Events in the log.
    pub events: u64,
    /// The events table's size on disk, indexes included, bytes.
    pub log_bytes: i64,
    /// `log_bytes` ÷ `events`.
    pub log_bytes_per_event: f64,
    /// Events appended per second over the window.
    pub events_per_s: f64,
    /// Raw batched appends to a scratch table in the same database, events/s:
    /// the median of the probes.
    pub append_ceiling_per_s: Option<f64>,
    /// Each probe's rate, events/s.
    pub append_ceiling_probes_per_s: Vec<f64>,
    /// events_per_s ÷ ceiling.
    pub ceiling_ratio: Option<f64>,
    /// Messages in the event stream at the end.
    pub nats_messages: u64,
    /// Stream messages per second over the window.
    pub nats_messages_per_s: f64,
    /// Events per kind.
    pub kinds: BTreeMap<String, u64>,
    /// Per process.
    pub services: Vec<ServiceReport>,
    /// Reclaim.
    pub reclaim: Option<ReclaimReport>,
    /// Where every allocated GPU-hour went, GPU-hours of wall time
    /// (`gpusched_core::goodput`, the simulator's and `explain`'s rules).
    pub goodput: GoodputSummary,
    /// The same per tenant.
    pub goodput_by_tenant: BTreeMap<String, GoodputSummary>,
    /// Events a fold of the log refused as superseded.
    pub superseded: u64,
    /// Restarts.
    pub restarts: Vec<RestartOutcome>,
    /// The snapshots stored at the end: (sequence, bytes, writer).
    pub snapshots: Vec<(u64, u64, String)>,
    /// Goals.
    pub goals: Vec<Goal>,
    /// Series by second since the origin: submitted, admitted, bound,
    /// events, stream messages per second, queue depth, p99 latency, every
    /// kind in the log; and by millisecond: each service process's fold
    /// position (`pid<N>_<service>_seq`) and events appended.
    pub series: BTreeMap<String, BTreeMap<i64, f64>>,
}

fn to_f(m: BTreeMap<i64, u64>) -> BTreeMap<i64, f64> {
    m.into_iter().map(|(k, v)| (k, v as f64)).collect()
}

impl Report {
    /// Derives the report.
    pub fn build(
        args: &Args,
        plan: &Plan,
        o: &Outcome,
        f: &LogFacts,
        services: Vec<ServiceReport>,
    ) -> Report {
        let first_submit = f
            .jobs
            .iter()
            .map(|j| j.submitted_s)
            .fold(f64::INFINITY, f64::min);
        let last_bound = f
            .jobs
            .iter()
            .filter_map(|j| j.bound_s)
            .fold(f64::NEG_INFINITY, f64::max);
        let (from, to) = if first_submit.is_finite() && last_bound.is_finite() {
            (first_submit, last_bound.max(first_submit))
        } else {
            (o.submit_started_s, o.end_s)
        };
        let window_s = (to - from).max(1e-3);
        // Rates are the events recorded inside the window, to a tick of
        // log time, over the window's length.
        let per_s = |kind: Option<&str>| f.count_between(kind, from, to) as f64 / window_s;
        let stream_rates = o.samples.rates();
        let nats_messages = o
            .samples
            .stream_messages
            .values()
            .max()
            .copied()
            .unwrap_or(0);
        let in_window: Vec<f64> = stream_rates
            .range(from.floor() as i64..=to.ceil() as i64)
            .map(|(_, v)| *v)
            .collect();
        let nats_messages_per_s = if in_window.is_empty() {
            0.0
        } else {
            in_window.iter().sum::<f64>() / in_window.len() as f64
        };
        let events_per_s = per_s(None);
        let submitted = o.submit.accepted;
        let reclaim = o.reclaim.as_ref().map(|r: &ReclaimOutcome| {
            let owner = |j: &crate::metrics::JobLatency| {
                j.tenant == crate::workload::RECLAIM_OWNER && j.submitted_s >= r.back_at_s - 1.0
            };
            let lat = f.latencies(owner);
            let first = f
                .jobs
                .iter()
                .filter(|j| owner(j))
                .map(|j| j.submitted_s)
                .fold(f64::INFINITY, f64::min);
            let last = f
                .jobs
                .iter()
                .filter(|j| owner(j))
                .filter_map(|j| j.bound_s)
                .fold(f64::NEG_INFINITY, f64::max);
            let lost_h = f.lost_gpu_ms as f64 / 3.6e6;
            ReclaimReport {
                owner_jobs: r.owner_jobs,
                reclaim_latency_s: if first.is_finite() && last.is_finite() {
                    last - first
                } else {
                    f64::NAN
                },
                owner_submit_to_bound_ms: Percentiles::of(lat),
                eligible_to_start_ms: Percentiles::of(f.fold.reclaim_eligible_to_start_ms.clone()),
                preempted: f.preempted,
                lost_gpu_hours_wall: lost_h,
                lost_gpu_hours_simulated: lost_h * plan.time_scale,
            }
        });
        let mut series = BTreeMap::new();
        series.insert("submitted_per_s".into(), to_f(f.series("job_submitted")));
        series.insert("admitted_per_s".into(), to_f(f.series("job_admitted")));
        series.insert("bound_per_s".into(), to_f(f.series("job_bound")));
        series.insert("events_per_s".into(), to_f(f.events_series()));
        series.insert("nats_messages_per_s".into(), stream_rates);
        series.insert(
            "queue_depth".into(),
            f.queue_depth()
                .into_iter()
                .map(|(k, v)| (k, v as f64))
                .collect(),
        );
        series.insert("p99_submit_to_bound_ms".into(), f.p99_by_bound_second());
        for kind in f.per_tick.keys() {
            series.insert(format!("log_{kind}_per_s"), to_f(f.series(kind)));
        }
        // Each service's fold position and appends over time (quarter
        // seconds, keyed by milliseconds since the origin).
        for (t, snap) in &o.samples.progress {
            let ms = (t * 1000.0).round() as i64;
            let name = format!("pid{}_{}", snap.pid, snap.service);
            series
                .entry(format!("{name}_seq"))
                .or_insert_with(BTreeMap::new)
                .insert(ms, snap.seq as f64);
            series
                .entry(format!("{name}_appended"))
                .or_insert_with(BTreeMap::new)
                .insert(ms, snap.appended as f64);
        }
        let mut r = Report {
            scenario: plan.scenario,
            smoke: args.smoke,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            finished_utc: chrono::Utc::now()
                .format("%Y-%m-%d %H:%M:%S UTC")
                .to_string(),
            database: o.database.clone(),
            namespace: o.namespace.clone(),
            nodes: plan.shape.nodes,
            gpus_per_node: plan.shape.gpus_per_node,
            tenants: plan.shape.tenants.clone(),
            time_scale: plan.time_scale,
            workload: plan.description.clone(),
            jobs: plan.jobs.len(),
            batch: args.batch,
            submitted,
            submit_failed: o.submit.failed,
            submit_resent: o.submit.resent,
            submit_seconds: o.submit.seconds,
            submissions_per_s: submitted as f64 / o.submit.seconds.max(1e-9),
            submit_request_ms: Percentiles::of(o.submit.latencies_ms.clone()),
            submit_worst_lag_ms: o.submit.worst_lag_ms,
            window_s,
            admitted_per_s: per_s(Some("job_admitted")),
            bound_per_s: per_s(Some("job_bound")),
            unbound: f.jobs.iter().filter(|j| j.bound_s.is_none()).count(),
            submit_to_bound_ms: Percentiles::of(f.latencies(|_| true)),
            events: f.max_seq,
            log_bytes: f.log_bytes,
            log_bytes_per_event: f.log_bytes as f64 / f.max_seq.max(1) as f64,
            events_per_s,
            append_ceiling_per_s: o.ceiling,
            append_ceiling_probes_per_s: o.ceiling_probes.clone(),
            ceiling_ratio: o.ceiling.map(|c| events_per_s / c.max(1e-9)),
            nats_messages,
            nats_messages_per_s,
            kinds: f.kinds(),
            services,
            reclaim,
            goodput: f.fold.goodput.clone(),
            goodput_by_tenant: f.fold.goodput_by_tenant.clone(),
            superseded: f.fold.superseded,
            restarts: o.restarts.clone(),
            snapshots: o.snapshots.clone(),
            goals: Vec::new(),
            series,
        };
        r.goals = r.judge();
        r
    }

    fn judge(&self) -> Vec<Goal> {
        let mut g = Vec::new();
        match self.scenario {
            Scenario::Burst if !self.smoke => {
                let jobs_per_s = (self.jobs - self.unbound) as f64 / self.window_s;
                g.push(Goal {
                    goal: format!("burst: {} jobs submitted and bound in <= 20 s", self.jobs),
                    measured: format!("{:.1} s", self.window_s),
                    met: self.window_s <= 20.0 && self.unbound == 0,
                });
                g.push(Goal {
                    goal: "burst: >= 5,000 jobs/s end to end".into(),
                    measured: format!("{jobs_per_s:.0} jobs/s"),
                    met: jobs_per_s >= 5000.0,
                });
                if self.batch > 1 {
                    g.extend(self.batch_goals(jobs_per_s));
                }
            }
            Scenario::Steady => g.push(Goal {
                goal: "steady: submit->bound p99 <= 100 ms".into(),
                measured: format!("{:.0} ms", self.submit_to_bound_ms.p99),
                met: self.submit_to_bound_ms.p99 <= 100.0 && self.unbound == 0,
            }),
            Scenario::Reclaim if !self.smoke => g.extend(self.reclaim_goals()),
            Scenario::Restart => {
                for r in &self.restarts {
                    let ms = r.kill_to_ready_ms.unwrap_or(f64::INFINITY);
                    g.push(Goal {
                        goal: format!(
                            "restart {} in place with {} pending: deciding again within 1 s",
                            r.service, r.pending
                        ),
                        measured: format!("{ms:.0} ms"),
                        met: ms <= 1000.0,
                    });
                }
                for s in &self.services {
                    if let Some(m) = s.peak_rss_mib {
                        g.push(Goal {
                            goal: format!(
                                "peak memory of {} ({}) <= 500 MiB",
                                s.service, s.instance
                            ),
                            measured: format!("{m:.0} MiB"),
                            met: m <= 500.0,
                        });
                    }
                }
            }
            _ => {}
        }
        g
    }

    /// The goals of a reclaim: each owner job starts within its victims'
    /// checkpoint time + 1 s of becoming eligible, and the whole reclaim
    /// (owner's first submission → last bound) takes no longer.
    fn reclaim_goals(&self) -> Vec<Goal> {
        let Some(r) = &self.reclaim else {
            return Vec::new();
        };
        let bound_s =
            crate::workload::RECLAIM_CHECKPOINT_S as f64 / self.time_scale.max(1e-9) + 1.0;
        let p99_s = r.eligible_to_start_ms.p99 / 1000.0;
        vec![
            Goal {
                goal: format!(
                    "reclaim: eligible → started p99 <= checkpoint + 1 s ({bound_s:.1} s)"
                ),
                measured: format!("{p99_s:.2} s"),
                met: r.eligible_to_start_ms.n > 0 && p99_s <= bound_s,
            },
            Goal {
                goal: format!(
                    "reclaim: {} owner jobs, first submission → last bound <= checkpoint + 1 s ({bound_s:.1} s)",
                    r.owner_jobs
                ),
                measured: format!("{:.2} s", r.reclaim_latency_s),
                met: r.reclaim_latency_s <= bound_s,
            },
        ]
    }

    /// The goals of a burst through batch submissions: twice the intake
    /// of one request per job, with the log's appends at half or more of
    /// the raw ceiling measured in the same run.
    fn batch_goals(&self, jobs_per_s: f64) -> Vec<Goal> {
        let mut g = vec![Goal {
            goal: format!(
                "burst through batches of {}: >= 10,000 jobs/s end to end",
                self.batch
            ),
            measured: format!("{jobs_per_s:.0} jobs/s"),
            met: jobs_per_s >= 10_000.0,
        }];
        if let Some(ratio) = self.ceiling_ratio {
            g.push(Goal {
                goal: "burst through batches: events appended at >= 50 % of the raw append ceiling"
                    .into(),
                measured: format!("{:.1} %", ratio * 100.0),
                met: ratio >= 0.5,
            });
        }
        g
    }

    /// Prints the table.
    pub fn print_table(&self) {
        let mut t = String::new();
        let opt =
            |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |v| format!("{v:.1}{unit}"));
        let _ = writeln!(
            t,
            "\n{:?}: {} nodes x {} GPUs, {} jobs, time scale {}",
            self.scenario, self.nodes, self.gpus_per_node, self.jobs, self.time_scale
        );
        let rows: Vec<(&str, String)> = vec![
            (
                "submissions accepted/s",
                format!(
                    "{:.0} ({} in {:.1} s, {} failed, {} sent again after busy)",
                    self.submissions_per_s,
                    self.submitted,
                    self.submit_seconds,
                    self.submit_failed,
                    self.submit_resent
                ),
            ),
            (
                "submit request p50/p99",
                format!(
                    "{:.1} / {:.1} ms",
                    self.submit_request_ms.p50, self.submit_request_ms.p99
                ),
            ),
            (
                "window (first submit -> last bound)",
                format!("{:.2} s", self.window_s),
            ),
            ("jobs admitted/s", format!("{:.0}", self.admitted_per_s)),
            (
                "jobs bound/s",
                format!("{:.0} ({} never bound)", self.bound_per_s, self.unbound),
            ),
            (
                "submit->bound p50/p99/p999",
                format!(
                    "{:.0} / {:.0} / {:.0} ms",
                    self.submit_to_bound_ms.p50,
                    self.submit_to_bound_ms.p99,
                    self.submit_to_bound_ms.p999
                ),
            ),
            (
                "events appended/s",
                format!("{:.0} ({} events)", self.events_per_s, self.events),
            ),
            (
                "log on disk",
                format!(
                    "{:.1} MiB ({:.0} bytes/event)",
                    self.log_bytes as f64 / (1 << 20) as f64,
                    self.log_bytes_per_event
                ),
            ),
            (
                "append ceiling (raw, 100 rows/tx)",
                ceiling_text(self.append_ceiling_per_s, &self.append_ceiling_probes_per_s),
            ),
            (
                "ceiling ratio",
                self.ceiling_ratio
                    .map_or("-".into(), |r| format!("{:.1}%", r * 100.0)),
            ),
            (
                "NATS messages/s",
                format!(
                    "{:.0} ({} in stream)",
                    self.nats_messages_per_s, self.nats_messages
                ),
            ),
        ];
        for (k, v) in rows {
            let _ = writeln!(t, "  {k:<38} {v}");
        }
        if let Some(r) = &self.reclaim {
            let _ = writeln!(
                t,
                "  {:<38} {:.2} s for {} owner jobs (per job p50 {:.0} ms, p99 {:.0} ms)",
                "reclaim latency",
                r.reclaim_latency_s,
                r.owner_jobs,
                r.owner_submit_to_bound_ms.p50,
                r.owner_submit_to_bound_ms.p99
            );
            let _ = writeln!(
                t,
                "  {:<38} p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} reclaims)",
                "reclaim, eligible → started",
                r.eligible_to_start_ms.p50,
                r.eligible_to_start_ms.p99,
                r.eligible_to_start_ms.max,
                r.eligible_to_start_ms.n
            );
            let _ = writeln!(
                t,
                "  {:<38} {:.3} wall ({:.1} simulated), {} victims",
                "lost GPU-hours", r.lost_gpu_hours_wall, r.lost_gpu_hours_simulated, r.preempted
            );
        }
        for line in self.goodput_lines() {
            let _ = writeln!(t, "  {line}");
        }
        for r in &self.restarts {
            let _ = writeln!(
                t,
                "  restart {} ({} pending, {} events)",
                r.steps(),
                r.pending,
                r.log_events
            );
            if let Some((n @ 1.., bytes, hold_us)) = r.killed_snapshots {
                let _ = writeln!(
                    t,
                    "    the killed instance wrote {n} snapshots, the last {:.1} MiB; encoding one held its loop {:.1} ms at most",
                    bytes as f64 / (1 << 20) as f64,
                    hold_us as f64 / 1000.0
                );
            }
        }
        for (seq, bytes, by) in &self.snapshots {
            let _ = writeln!(
                t,
                "  snapshot at {seq}: {:.1} MiB, written by {by}",
                *bytes as f64 / (1 << 20) as f64
            );
        }
        let _ = writeln!(
            t,
            "  {:<14} {:>9} {:>8} {:>9} {:>9} {:>9} {:>11} {:>11}",
            "service", "peak MiB", "CPU s", "cycles", "batches", "events", "cycle p50", "cycle p99"
        );
        for s in &self.services {
            let _ = writeln!(
                t,
                "  {:<14} {:>9} {:>8} {:>9} {:>9} {:>9} {:>11} {:>11}",
                s.instance,
                opt(s.peak_rss_mib, ""),
                opt(s.cpu_s, ""),
                s.cycles,
                s.batches,
                s.appended,
                opt(s.cycle_p50_ms, " ms"),
                opt(s.cycle_p99_ms, " ms")
            );
        }
        for g in &self.goals {
            let _ = writeln!(
                t,
                "  goal {}: {} — {}",
                if g.met { "MET   " } else { "MISSED" },
                g.goal,
                g.measured
            );
        }
        println!("{t}");
    }

    /// Where the allocated GPU-hours went and where the waiting ones
    /// waited, overall then per tenant (wall time; × the time scale for the
    /// simulated jobs' own time).
    fn goodput_lines(&self) -> Vec<String> {
        let [work, wait] = self.goodput.lines();
        let mut out = vec![
            format!("GPU-hours (wall): {work}"),
            format!("GPU-hours (wall): {wait}"),
        ];
        for (tenant, g) in &self.goodput_by_tenant {
            out.push(format!(
                "  {tenant}: goodput {:.1}% of {:.2} GPU-h, recovery {:.3}, {} preemptions, wait {:.2} GPU-h",
                g.goodput * 100.0,
                g.allocated_gpu_hours,
                g.recovery_gpu_hours,
                g.preemptions,
                g.wait_gpu_hours
            ));
        }
        if self.superseded > 0 {
            out.push(format!(
                "({} superseded events: counted by neither)",
                self.superseded
            ));
        }
        out
    }

    /// The goodput table: overall and per tenant, GPU-hours of wall time.
    fn goodput_markdown(&self, m: &mut String) {
        let _ = writeln!(
            m,
            "\nGPU-hours of wall time, accounted as docs/goodput.md says:\n\n| tenant | allocated | useful | recovery (lost + checkpoint + restart) | startup | unsaved at end | goodput | preemptions | capacity wait |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let all = std::iter::once(("all", &self.goodput))
            .chain(self.goodput_by_tenant.iter().map(|(t, g)| (t.as_str(), g)));
        for (name, g) in all {
            let _ = writeln!(
                m,
                "| {name} | {:.3} | {:.3} | {:.3} ({:.3} + {:.3} + {:.3}) | {:.3} | {:.3} | {:.2}% | {} | {:.3} |",
                g.allocated_gpu_hours,
                g.useful_gpu_hours,
                g.recovery_gpu_hours,
                g.lost_gpu_hours,
                g.checkpoint_gpu_hours,
                g.restart_gpu_hours,
                g.startup_gpu_hours,
                g.unsaved_at_end_gpu_hours,
                g.goodput * 100.0,
                g.preemptions,
                g.wait_gpu_hours
            );
        }
    }

    fn markdown(&self) -> String {
        let mut m = String::new();
        let _ = writeln!(m, "# gpusched load test: {:?}\n", self.scenario);
        let _ = writeln!(m, "`{}`  \n{}\n", self.command, self.finished_utc);
        let _ = writeln!(
            m,
            "Cluster: {} nodes × {} GPUs; tenants {}; time scale {}.  \nWorkload: {}\n",
            self.nodes,
            self.gpus_per_node,
            self.tenants
                .iter()
                .map(|(n, q)| format!("{n} ({q} GPUs nominal)"))
                .collect::<Vec<_>>()
                .join(", "),
            self.time_scale,
            self.workload
        );
        let _ = writeln!(m, "| figure | value |\n|---|---:|");
        let opt = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
        let rows = [
            (
                "submissions accepted/s",
                format!("{:.0}", self.submissions_per_s),
            ),
            (
                "submit request p50 / p99 (client)",
                format!(
                    "{:.1} / {:.1} ms",
                    self.submit_request_ms.p50, self.submit_request_ms.p99
                ),
            ),
            (
                "first submit → last bound",
                format!("{:.2} s", self.window_s),
            ),
            ("jobs admitted/s", format!("{:.0}", self.admitted_per_s)),
            ("jobs bound/s", format!("{:.0}", self.bound_per_s)),
            ("jobs never bound", self.unbound.to_string()),
            (
                "submit → bound p50 / p99 / p99.9",
                format!(
                    "{:.0} / {:.0} / {:.0} ms",
                    self.submit_to_bound_ms.p50,
                    self.submit_to_bound_ms.p99,
                    self.submit_to_bound_ms.p999
                ),
            ),
            ("events appended/s", format!("{:.0}", self.events_per_s)),
            (
                "log on disk (events table, indexes included)",
                format!(
                    "{:.1} MiB, {:.0} bytes/event",
                    self.log_bytes as f64 / (1 << 20) as f64,
                    self.log_bytes_per_event
                ),
            ),
            (
                "raw append ceiling (same Postgres)",
                ceiling_text(self.append_ceiling_per_s, &self.append_ceiling_probes_per_s),
            ),
            (
                "ceiling ratio",
                self.ceiling_ratio
                    .map_or("–".into(), |r| format!("{:.1}%", r * 100.0)),
            ),
            (
                "NATS messages/s",
                format!("{:.0}", self.nats_messages_per_s),
            ),
        ];
        for (k, v) in rows {
            let _ = writeln!(m, "| {k} | {v} |");
        }
        if let Some(r) = &self.reclaim {
            let _ = writeln!(
                m,
                "| reclaim latency ({} owner jobs) | {:.2} s |",
                r.owner_jobs, r.reclaim_latency_s
            );
            let _ = writeln!(
                m,
                "| owner submit → bound p50 / p99 | {:.0} / {:.0} ms |",
                r.owner_submit_to_bound_ms.p50, r.owner_submit_to_bound_ms.p99
            );
            let _ = writeln!(
                m,
                "| reclaim, eligible → started p50 / p99 / max | {:.0} / {:.0} / {:.0} ms |",
                r.eligible_to_start_ms.p50, r.eligible_to_start_ms.p99, r.eligible_to_start_ms.max
            );
            let _ = writeln!(
                m,
                "| victims / lost GPU-hours (wall; simulated) | {} / {:.3}; {:.1} |",
                r.preempted, r.lost_gpu_hours_wall, r.lost_gpu_hours_simulated
            );
        }
        self.goodput_markdown(&mut m);
        if !self.restarts.is_empty() {
            let _ = writeln!(m, "\n| restarted | pending | log events | snapshot at | its age | load | folded after it | kill → caught up | kill → lease | kill → ready | kill → first append | killed peak RSS |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
            let n = |v: Option<u64>| v.map_or("–".into(), |v| v.to_string());
            for r in &self.restarts {
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {} | {} s | {} ms | {} | {} ms | {} ms | {} ms | {} ms | {} MiB |",
                    r.service,
                    r.pending,
                    r.log_events,
                    n(r.snapshot_seq),
                    n(r.snapshot_age_ms.map(|a| a / 1000)),
                    n(r.snapshot_load_ms),
                    n(r.folded_after_snapshot),
                    opt(r.kill_to_caught_up_ms),
                    opt(r.kill_to_lease_ms),
                    opt(r.kill_to_ready_ms),
                    opt(r.kill_to_first_append_ms),
                    opt(r.killed_peak_rss_mib)
                );
            }
        }
        if !self.snapshots.is_empty() {
            let _ = writeln!(m, "\n| snapshot at | size | written by |\n|---:|---:|---|");
            for (seq, bytes, by) in &self.snapshots {
                let _ = writeln!(
                    m,
                    "| {seq} | {:.1} MiB | {by} |",
                    *bytes as f64 / (1 << 20) as f64
                );
            }
        }
        let _ = writeln!(m, "\n| process | peak RSS MiB | CPU s | cycles | batches | events | cycle p50 | cycle p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|");
        for s in &self.services {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} ms | {} ms |",
                s.instance,
                opt(s.peak_rss_mib),
                opt(s.cpu_s),
                s.cycles,
                s.batches,
                s.appended,
                opt(s.cycle_p50_ms),
                opt(s.cycle_p99_ms)
            );
        }
        if !self.goals.is_empty() {
            let _ = writeln!(m, "\n| goal | measured | |\n|---|---:|---|");
            for g in &self.goals {
                let _ = writeln!(
                    m,
                    "| {} | {} | {} |",
                    g.goal,
                    g.measured,
                    if g.met { "met" } else { "**missed**" }
                );
            }
        }
        let _ = writeln!(m, "\nCycle time: decide + append + fold of cycles that appended, from each service's histogram (within ~19%). Latency and rates come from the event log's `recorded_at`; NATS messages from the stream's message count sampled each second.\n");
        let _ = writeln!(m, "![queue depth](queue_depth.svg)\n\n![throughput](throughput.svg)\n\n![p99 latency](latency_p99.svg)");
        m
    }

    /// Writes report.json, report.md and the plots into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).context("encoding the report")?;
        std::fs::write(dir.join("report.json"), json).context("writing report.json")?;
        std::fs::write(dir.join("report.md"), self.markdown()).context("writing report.md")?;
        let s = |k: &str| self.series.get(k).cloned().unwrap_or_default();
        plot(
            &dir.join("queue_depth.svg"),
            "jobs waiting (submitted, not bound)",
            &[("queue depth", s("queue_depth"))],
        )?;
        plot(
            &dir.join("throughput.svg"),
            "per second",
            &[
                ("submitted", s("submitted_per_s")),
                ("bound", s("bound_per_s")),
                ("events appended", s("events_per_s")),
                ("NATS messages", s("nats_messages_per_s")),
            ],
        )?;
        plot(
            &dir.join("latency_p99.svg"),
            "p99 submit->bound of jobs bound that second, ms",
            &[("p99", s("p99_submit_to_bound_ms"))],
        )?;
        Ok(())
    }
}

const COLORS: [RGBColor; 4] = [BLUE, RED, GREEN, MAGENTA];

/// A line plot of series by second.
fn plot(path: &Path, title: &str, series: &[(&str, BTreeMap<i64, f64>)]) -> Result<()> {
    let xs = series.iter().flat_map(|(_, m)| m.keys().copied());
    let (x0, x1) = xs.fold((i64::MAX, i64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0 > x1 {
        (0, 1)
    } else {
        (x0, x1.max(x0 + 1))
    };
    let ymax = series
        .iter()
        .flat_map(|(_, m)| m.values().copied())
        .fold(0f64, f64::max)
        .max(1.0)
        * 1.05;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d(x0 as f64..x1 as f64, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the services started")
            .draw()?;
        for (i, (name, m)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    m.iter().map(|(x, y)| (*x as f64, *y)),
                    color,
                ))?
                .label(*name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("plotting {}: {e}", path.display()))
}

/// The ceiling and the probes it is the median of: `94,507 events/s
/// (median of 94,507 / 101,639 / 88,210)`.
fn ceiling_text(median: Option<f64>, probes: &[f64]) -> String {
    let Some(m) = median else {
        return "-".to_string();
    };
    let each: Vec<String> = probes.iter().map(|p| format!("{p:.0}")).collect();
    match each.len() {
        0 | 1 => format!("{m:.0} events/s"),
        _ => format!("{m:.0} events/s (median of {})", each.join(" / ")),
    }
}
