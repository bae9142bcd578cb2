//! The simulation report: a readable table and JSON.
//!
//! Owns: turning a finished simulation's state and measurements into the
//! figures users compare runs by — waits, completion times, utilisation,
//! cycle cost, what operations, dependencies and array limits did, and
//! how each cohort member's share of GPU-hours tracked its weight (the
//! fair-share section), and what each GPU-hour budget's tenant used of it
//! period by period (the budgets section). A wait, a share or a budget's
//! use is a measured outcome here, never a prediction.
//!
//! Must never: change the simulation.

use crate::engine::Simulator;
use gpusched_core::{GoodputSummary, Phase};
use serde::Serialize;
use std::collections::BTreeMap;

/// Percentiles of a set of seconds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Samples.
    pub count: usize,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

impl Percentiles {
    /// From unsorted samples.
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(|a, b| a.total_cmp(b));
        Percentiles {
            p50: pct(&v, 0.50),
            p90: pct(&v, 0.90),
            p99: pct(&v, 0.99),
            max: v.last().copied().unwrap_or(0.0),
            count: v.len(),
        }
    }
}

/// Utilisation figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Utilization {
    /// Used GPU time over capacity GPU time, whole run.
    pub mean: f64,
    /// The same, only while some job was waiting.
    pub while_backlog: f64,
}

/// Cycle cost figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CycleReport {
    /// Cycles run.
    pub count: usize,
    /// Median wall time, µs.
    pub p50_us: f64,
    /// 99th percentile wall time, µs.
    pub p99_us: f64,
    /// Slowest, µs.
    pub max_us: f64,
    /// Most heads one cycle examined.
    pub max_heads_examined: u32,
    /// Most domains one cycle probed.
    pub max_domains_probed: u32,
}

/// Completion-time figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Jct {
    /// Median, seconds.
    pub p50: f64,
    /// 99th percentile, seconds.
    pub p99: f64,
}

/// Cost of the bounded victim search.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VictimSearch {
    /// Cycles in which the preemption stage looked for victims.
    pub searches: usize,
    /// 99th percentile wall time of the preemption stage in those cycles, µs.
    pub p99_us: f64,
    /// Slowest, µs.
    pub max_us: f64,
    /// Most victim sets costed for one beneficiary.
    pub max_sets_costed: u32,
}

/// One tenant's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TenantReport {
    /// Jobs submitted.
    pub jobs_submitted: u64,
    /// Jobs finished.
    pub jobs_finished: u64,
    /// Submit → first start, seconds.
    pub wait_s: Percentiles,
    /// Where its allocated GPU-hours went, and its capacity wait.
    pub goodput: GoodputSummary,
}

/// What the admins' queue and node operations did (only when the
/// workload had some).
#[derive(Clone, Debug, Default, Serialize)]
pub struct OperationsReport {
    /// Queue states set (hold, release, drain, stop).
    pub queue_changes: u64,
    /// Nodes evicted for maintenance.
    pub node_evictions: u64,
    /// Operations left out (no such tenant or live node, or already so).
    pub ignored: u64,
    /// Jobs evicted from stopped queues.
    pub evicted_from_stopped_queues: u64,
    /// Jobs evicted from nodes emptied for maintenance.
    pub evicted_from_nodes: u64,
    /// Of those that have stopped, how many stopped on a checkpoint
    /// completed after they were chosen.
    pub stopped_on_checkpoint: u64,
    /// GPU-hours the evictions were expected to lose, as costed.
    pub expected_lost_gpu_hours: f64,
    /// GPU-hours the evicted jobs lost.
    pub lost_gpu_hours: f64,
    /// Admitted jobs of stopped queues that gave their quota back.
    pub unadmitted: u64,
    /// Submissions refused because their queue was draining or stopped.
    pub refused: u64,
}

/// What dependencies and job arrays did (only when the workload had
/// some).
#[derive(Clone, Debug, Default, Serialize)]
pub struct GatesReport {
    /// Jobs submitted naming dependencies (`after_ok`, `after`).
    pub dependent_jobs: u64,
    /// Of those, how many were submitted before a dependency ended and
    /// waited for it.
    pub waited_for_dependencies: u64,
    /// Of those, how many were rejected at submission (a dependency
    /// unknown, of another tenant, submitted later, or already failed).
    pub rejected: u64,
    /// Cancelled because an `after_ok` dependency ended without
    /// succeeding (`job_dependency_failed`).
    pub cancelled_by_failed_dependency: u64,
    /// Dependent jobs that started.
    pub started: u64,
    /// Dependent jobs that succeeded.
    pub succeeded: u64,
    /// Jobs that failed, dependent or not.
    pub jobs_failed: u64,
    /// Of the dependent jobs that started: from the moment the last of
    /// their dependencies ended (or their submission, if later) to their
    /// start, seconds.
    pub wait_after_dependencies_s: Percentiles,
    /// The mean of the same, seconds.
    pub mean_wait_after_dependencies_s: f64,
    /// Job arrays, by id.
    pub arrays: Vec<ArrayReport>,
}

/// One job array.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ArrayReport {
    /// Its id (its first task's job id).
    pub array: u64,
    /// Its tenant.
    pub tenant: String,
    /// Tasks submitted.
    pub tasks: u64,
    /// Its limit on tasks queued for quota or holding it at once (`%N`).
    pub max_running: Option<u32>,
    /// Most tasks holding quota at once (admitted, bound, running or
    /// preempting), from the events: never above `max_running`.
    pub peak_holding_quota: u64,
    /// Most tasks running at once.
    pub peak_running: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that ended otherwise (failed, cancelled, rejected).
    pub ended_otherwise: u64,
    /// Submit → first start of its tasks, seconds.
    pub wait_s: Percentiles,
    /// From its first task's submission to its last task's end, seconds.
    pub span_s: f64,
}

/// The whole report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// How the workload was derived.
    pub workload: String,
    /// Nodes and GPUs.
    pub cluster: String,
    /// Jobs submitted.
    pub jobs_submitted: u64,
    /// Jobs finished (succeeded or failed).
    pub jobs_finished: u64,
    /// Jobs rejected at submission.
    pub jobs_rejected: u64,
    /// Jobs still waiting or running at the end.
    pub jobs_unfinished: u64,
    /// Jobs requeued after node loss.
    pub requeues: u64,
    /// Final state hash.
    pub state_hash: String,
    /// Events applied.
    pub events: u64,
    /// Decisions made by the core.
    pub decisions: u64,
    /// Wall seconds.
    pub wall_s: f64,
    /// Decisions per wall second.
    pub decisions_per_s: f64,
    /// Virtual seconds simulated.
    pub virtual_s: f64,
    /// Utilisation.
    pub utilization: Utilization,
    /// Submit → first start, seconds.
    pub wait_s: Percentiles,
    /// Submit → end, seconds.
    pub jct_s: Jct,
    /// Cycle cost.
    pub cycle: CycleReport,
    /// Per tenant.
    pub tenants: BTreeMap<String, TenantReport>,
    /// Victims stopped.
    pub preemptions: u64,
    /// GPU-hours of work lost to preemption and node loss (since each
    /// victim's last complete checkpoint).
    pub lost_gpu_hours: f64,
    /// Complete checkpoints reported.
    pub checkpoints: u64,
    /// Jobs that reclaimed lent quota: from the moment each was eligible
    /// (within its nominal quota, blocked only by borrowers) to its start,
    /// seconds.
    pub reclaim_latency_s: Percentiles,
    /// Submit → first start of jobs of 32 GPUs or more, seconds.
    pub big_gang_wait_s: Percentiles,
    /// Jobs backfilled onto reserved nodes.
    pub backfilled_jobs: u64,
    /// Reservations made (re-plans included).
    pub reservations: u64,
    /// Victim search cost.
    pub victim_search: VictimSearch,
    /// Reclaims after which indivisible jobs left a borrower above nominal
    /// or the owner below it (count; the first few are listed).
    pub reclaim_imbalances: usize,
    /// The first few such reclaims, as text.
    pub reclaim_imbalance_examples: Vec<String>,
    /// Where every allocated GPU-hour went, and the capacity wait
    /// (`gpusched_core::goodput`).
    pub goodput: GoodputSummary,
    /// Replay of the recorded log gave the same hash (when checked).
    pub replay_hash_matches: Option<bool>,
    /// Queue and node operations, when the workload had any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operations: Option<OperationsReport>,
    /// Dependencies and job arrays, when the workload had any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gates: Option<GatesReport>,
    /// Each cohort member's share of GPU-hours against its weight, when
    /// some cohort has more than one member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<FairShareReport>,
    /// Each GPU-hour budget's use, period by period, when some tenant has
    /// a budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budgets: Option<Vec<BudgetReport>>,
}

/// How the report is computed.
#[derive(Clone, Copy, Debug)]
pub struct ReportOptions {
    /// Length of the fair-share section's windows, virtual seconds (≥ 1).
    pub fair_share_window_s: u64,
}

/// The fair-share section's default window: 6 hours.
pub const DEFAULT_FAIR_SHARE_WINDOW_S: u64 = 6 * 3600;

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            fair_share_window_s: DEFAULT_FAIR_SHARE_WINDOW_S,
        }
    }
}

impl Report {
    /// Builds the report of a finished simulation, with the default options.
    pub fn build(sim: &Simulator, cluster_desc: String) -> Report {
        Report::build_with(sim, cluster_desc, &ReportOptions::default())
    }

    /// Builds the report of a finished simulation.
    pub fn build_with(sim: &Simulator, cluster_desc: String, opts: &ReportOptions) -> Report {
        let state = sim.state();
        let m = &sim.measurements;
        let mut waits = Vec::new();
        let mut jcts = Vec::new();
        let mut tenants: BTreeMap<String, (TenantReport, Vec<f64>)> = BTreeMap::new();
        let mut requeues = 0;
        let (mut finished, mut submitted) = (0, 0);
        for t in state.tenants() {
            tenants.entry(t.spec.name.clone()).or_default();
        }
        for (name, acc) in m.goodput.totals() {
            tenants.entry(name).or_default().0.goodput = acc.summary();
        }
        for id in 1..=state.job_count() as u64 {
            let Some(j) = state.job(gpusched_model::JobId(id)) else {
                continue;
            };
            submitted += 1;
            requeues += j.requeues as u64;
            let entry = tenants.entry(j.spec.tenant.clone()).or_default();
            entry.0.jobs_submitted += 1;
            if let Some(s) = j.first_started_at {
                let w = s.millis_since(j.submitted_at) as f64 / 1000.0;
                waits.push(w);
                entry.1.push(w);
            }
            if matches!(j.phase, Phase::Succeeded | Phase::Failed) {
                finished += 1;
                entry.0.jobs_finished += 1;
                if let Some(e) = j.ended_at {
                    jcts.push(e.millis_since(j.submitted_at) as f64 / 1000.0);
                }
            }
        }
        let jct = Percentiles::of(jcts);
        let mut big = Vec::new();
        for id in 1..=state.job_count() as u64 {
            if let Some(j) = state.job(gpusched_model::JobId(id)) {
                if j.spec.total_gpus() >= 32 {
                    if let Some(s) = j.first_started_at {
                        big.push(s.millis_since(j.submitted_at) as f64 / 1000.0);
                    }
                }
            }
        }
        let reclaim: Vec<f64> = m
            .reclaim_latencies
            .iter()
            .map(|&(_, ms)| ms as f64 / 1000.0)
            .collect();
        let mut victim_us: Vec<f64> = m
            .cycles
            .iter()
            .filter(|c| c.beneficiaries > 0)
            .map(|c| c.victim_us as f64)
            .collect();
        victim_us.sort_by(|a, b| a.total_cmp(b));
        let mut us: Vec<f64> = m.cycles.iter().map(|c| c.elapsed_us as f64).collect();
        us.sort_by(|a, b| a.total_cmp(b));
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let c = state.phase_counts();
        Report {
            workload: sim.workload().description.clone(),
            cluster: cluster_desc,
            jobs_submitted: submitted,
            jobs_finished: finished,
            jobs_rejected: c.get(Phase::Rejected),
            jobs_unfinished: c.get(Phase::Submitted)
                + c.get(Phase::Queued)
                + c.get(Phase::Admitted)
                + c.get(Phase::Bound)
                + c.get(Phase::Running),
            requeues,
            state_hash: state.state_hash(),
            events: m.events,
            decisions: m.decisions,
            wall_s: m.wall_s,
            decisions_per_s: ratio(m.decisions as f64, m.wall_s),
            virtual_s: m.end.as_secs_f64(),
            utilization: Utilization {
                mean: ratio(m.used_gpu_ms, m.capacity_gpu_ms),
                while_backlog: ratio(m.backlog_used_gpu_ms, m.backlog_capacity_gpu_ms),
            },
            wait_s: Percentiles::of(waits),
            jct_s: Jct {
                p50: jct.p50,
                p99: jct.p99,
            },
            cycle: CycleReport {
                count: m.cycles.len(),
                p50_us: pct(&us, 0.5),
                p99_us: pct(&us, 0.99),
                max_us: us.last().copied().unwrap_or(0.0),
                max_heads_examined: m.cycles.iter().map(|c| c.heads_examined).max().unwrap_or(0),
                max_domains_probed: m.cycles.iter().map(|c| c.domains_probed).max().unwrap_or(0),
            },
            tenants: tenants
                .into_iter()
                .map(|(name, (mut r, w))| {
                    r.wait_s = Percentiles::of(w);
                    (name, r)
                })
                .collect(),
            preemptions: m.preemptions,
            lost_gpu_hours: m.lost_gpu_ms as f64 / 3_600_000.0,
            checkpoints: m.checkpoints,
            reclaim_latency_s: Percentiles::of(reclaim),
            big_gang_wait_s: Percentiles::of(big),
            backfilled_jobs: m.backfilled,
            reservations: m.reservations,
            victim_search: VictimSearch {
                searches: victim_us.len(),
                p99_us: pct(&victim_us, 0.99),
                max_us: victim_us.last().copied().unwrap_or(0.0),
                max_sets_costed: m.cycles.iter().map(|c| c.victim_sets).max().unwrap_or(0),
            },
            reclaim_imbalances: m.reclaim_imbalances.len(),
            reclaim_imbalance_examples: m
                .reclaim_imbalances
                .iter()
                .take(5)
                .map(|(j, t)| format!("job {j}: {t}"))
                .collect(),
            goodput: m.goodput.overall().summary(),
            replay_hash_matches: None,
            operations: operations(&m.operations),
            gates: gates(sim),
            fair_share: fair_share(sim, opts.fair_share_window_s.max(1) * 1000),
            budgets: budgets(sim),
        }
    }

    /// The report as a readable table.
    pub fn to_table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "gpusched simulation");
        let _ = writeln!(s, "  cluster        {}", self.cluster);
        let _ = writeln!(s, "  workload       {}", self.workload);
        let _ = writeln!(
            s,
            "  jobs           {} submitted, {} finished, {} rejected, {} unfinished, {} requeues",
            self.jobs_submitted,
            self.jobs_finished,
            self.jobs_rejected,
            self.jobs_unfinished,
            self.requeues
        );
        let _ = writeln!(
            s,
            "  time           {:.0} virtual s in {:.2} wall s; {} events, {} decisions ({:.0}/s)",
            self.virtual_s, self.wall_s, self.events, self.decisions, self.decisions_per_s
        );
        let _ = writeln!(
            s,
            "  utilization    {:.1}% mean, {:.1}% while jobs waited",
            self.utilization.mean * 100.0,
            self.utilization.while_backlog * 100.0
        );
        let _ = writeln!(
            s,
            "  cycles         {} cycles; p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs; at most {} heads and {} domains a cycle",
            self.cycle.count, self.cycle.p50_us, self.cycle.p99_us, self.cycle.max_us, self.cycle.max_heads_examined, self.cycle.max_domains_probed
        );
        let _ = writeln!(
            s,
            "  completion     p50 {:.0} s, p99 {:.0} s",
            self.jct_s.p50, self.jct_s.p99
        );
        let _ = writeln!(
            s,
            "  preemption     {} victims stopped, {:.1} GPU-hours lost, {} checkpoints; reclaim latency (eligible → start) p50 {:.0} s, p99 {:.0} s, max {:.0} s",
            self.preemptions,
            self.lost_gpu_hours,
            self.checkpoints,
            self.reclaim_latency_s.p50,
            self.reclaim_latency_s.p99,
            self.reclaim_latency_s.max
        );
        if self.reclaim_imbalances > 0 {
            let _ =
                writeln!(
                s,
                "  reclaim        {} reclaims left quota uneven (jobs are indivisible), e.g. {}",
                self.reclaim_imbalances,
                self.reclaim_imbalance_examples.first().map_or("", |x| x.as_str())
            );
        }
        let _ = writeln!(
            s,
            "  victim search  {} searches; p99 {:.0} µs, max {:.0} µs; at most {} sets costed",
            self.victim_search.searches,
            self.victim_search.p99_us,
            self.victim_search.max_us,
            self.victim_search.max_sets_costed
        );
        let _ = writeln!(
            s,
            "  reservations   {} made, {} jobs backfilled; gangs ≥ 32 GPUs waited p99 {:.0} s, max {:.0} s",
            self.reservations,
            self.backfilled_jobs,
            self.big_gang_wait_s.p99,
            self.big_gang_wait_s.max
        );
        let [work, wait] = self.goodput.lines();
        let _ = writeln!(s, "  GPU-hours      {work}");
        let _ = writeln!(s, "                 {wait}");
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  {:<16} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10}",
            "wait (s)",
            "submitted",
            "finished",
            "p50",
            "p90",
            "p99",
            "max",
            "goodput",
            "wait GPU-h"
        );
        let mut row = |name: &str, sub: u64, fin: u64, w: &Percentiles, g: &GoodputSummary| {
            let _ = writeln!(
                s,
                "  {:<16} {:>9} {:>9} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>7.1}% {:>10.1}",
                name,
                sub,
                fin,
                w.p50,
                w.p90,
                w.p99,
                w.max,
                g.goodput * 100.0,
                g.wait_gpu_hours
            );
        };
        for (name, t) in &self.tenants {
            row(
                name,
                t.jobs_submitted,
                t.jobs_finished,
                &t.wait_s,
                &t.goodput,
            );
        }
        row(
            "all",
            self.jobs_submitted,
            self.jobs_finished,
            &self.wait_s,
            &self.goodput,
        );
        if let Some(o) = &self.operations {
            let _ = writeln!(
                s,
                "  operations     {} queue changes, {} nodes evicted ({} ignored); evicted {} jobs of stopped queues and {} from nodes, {} of them stopped on a checkpoint; lost {:.1} GPU-h (expected {:.1}); {} admitted jobs gave quota back; {} submissions refused",
                o.queue_changes,
                o.node_evictions,
                o.ignored,
                o.evicted_from_stopped_queues,
                o.evicted_from_nodes,
                o.stopped_on_checkpoint,
                o.lost_gpu_hours,
                o.expected_lost_gpu_hours,
                o.unadmitted,
                o.refused
            );
        }
        if let Some(g) = &self.gates {
            let w = &g.wait_after_dependencies_s;
            let _ = writeln!(
                s,
                "  dependencies   {} jobs named dependencies, {} waited for them, {} rejected; {} cancelled when an after_ok dependency failed; {} started, {} succeeded; started p50 {:.0} s, p99 {:.0} s, max {:.0} s (mean {:.0} s) after their dependencies ended; {} jobs failed",
                g.dependent_jobs,
                g.waited_for_dependencies,
                g.rejected,
                g.cancelled_by_failed_dependency,
                g.started,
                g.succeeded,
                w.p50,
                w.p99,
                w.max,
                g.mean_wait_after_dependencies_s,
                g.jobs_failed
            );
            for a in &g.arrays {
                let limit = a
                    .max_running
                    .map_or("no limit".to_string(), |n| format!("max_running {n}"));
                let _ = writeln!(
                    s,
                    "  array {:<8} {}: {} tasks, {limit}; at most {} held quota and {} ran at once; {} succeeded, {} ended otherwise; waited p50 {:.0} s, p99 {:.0} s, max {:.0} s; {:.0} s from the first submission to the last end",
                    a.array,
                    a.tenant,
                    a.tasks,
                    a.peak_holding_quota,
                    a.peak_running,
                    a.succeeded,
                    a.ended_otherwise,
                    a.wait_s.p50,
                    a.wait_s.p99,
                    a.wait_s.max,
                    a.span_s
                );
            }
        }
        if let Some(f) = &self.fair_share {
            f.write_table(&mut s);
        }
        for b in self.budgets.iter().flatten() {
            b.write_table(&mut s);
        }
        let _ = writeln!(s);
        if let Some(ok) = self.replay_hash_matches {
            let _ = writeln!(s, "replay_hash_matches: {ok}");
        }
        let _ = writeln!(s, "state_hash: {}", self.state_hash);
        s
    }
}

fn operations(o: &crate::engine::Operations) -> Option<OperationsReport> {
    let hours = |ms: u64| ms as f64 / 3_600_000.0;
    o.any().then(|| OperationsReport {
        queue_changes: o.queue_changes,
        node_evictions: o.node_evictions,
        ignored: o.ignored,
        evicted_from_stopped_queues: o.evicted.get("queue_stopped").copied().unwrap_or(0),
        evicted_from_nodes: o.evicted.get("node_evicted").copied().unwrap_or(0),
        stopped_on_checkpoint: o.stopped_on_checkpoint,
        expected_lost_gpu_hours: hours(o.expected_lost_gpu_ms),
        lost_gpu_hours: hours(o.lost_gpu_ms),
        unadmitted: o.unadmitted,
        refused: o.refused,
    })
}

/// The gates section, from the final state and the engine's counts.
fn gates(sim: &Simulator) -> Option<GatesReport> {
    use gpusched_model::JobId;
    let g = &sim.measurements.gates;
    if !g.any() {
        return None;
    }
    let state = sim.state();
    let secs = |ms: u64| ms as f64 / 1000.0;
    let mut r = GatesReport {
        cancelled_by_failed_dependency: g.dependency_failed,
        ..GatesReport::default()
    };
    let mut waits = Vec::new();
    let mut arrays: BTreeMap<u64, (ArrayReport, Vec<f64>, u64, u64)> = BTreeMap::new();
    for id in 1..=state.job_count() as u64 {
        let Some(j) = state.job(JobId(id)) else {
            continue;
        };
        r.jobs_failed += u64::from(j.phase == Phase::Failed);
        if let Some(task) = j.spec.array {
            let (a, w, first, last) = arrays.entry(task.array).or_insert_with(|| {
                (
                    ArrayReport {
                        array: task.array,
                        tenant: j.spec.tenant.clone(),
                        max_running: task.max_running,
                        ..ArrayReport::default()
                    },
                    Vec::new(),
                    u64::MAX,
                    0,
                )
            });
            a.tasks += 1;
            match j.phase {
                Phase::Succeeded => a.succeeded += 1,
                p if p.is_terminal() => a.ended_otherwise += 1,
                _ => {}
            }
            if let Some(s) = j.first_started_at {
                w.push(secs(s.millis_since(j.submitted_at)));
            }
            *first = (*first).min(j.submitted_at.0);
            *last = (*last).max(j.ended_at.map_or(0, |e| e.0));
        }
        if j.spec.after_ok.is_empty() && j.spec.after.is_empty() {
            continue;
        }
        r.dependent_jobs += 1;
        if j.phase == Phase::Rejected {
            r.rejected += 1;
            continue;
        }
        // When the last dependency ended (None: one never did).
        let released = j
            .spec
            .dependencies()
            .map(|(d, _)| state.job(d).and_then(|d| d.ended_at))
            .try_fold(j.submitted_at, |t, e| e.map(|e| t.max(e)));
        if released.is_none_or(|t| t > j.submitted_at) {
            r.waited_for_dependencies += 1;
        }
        r.succeeded += u64::from(j.phase == Phase::Succeeded);
        if let (Some(s), Some(from)) = (j.first_started_at, released) {
            r.started += 1;
            waits.push(secs(s.millis_since(from)));
        }
    }
    r.mean_wait_after_dependencies_s = if waits.is_empty() {
        0.0
    } else {
        waits.iter().sum::<f64>() / waits.len() as f64
    };
    r.wait_after_dependencies_s = Percentiles::of(waits);
    r.arrays = arrays
        .into_values()
        .map(|(mut a, w, first, last)| {
            if let Some(c) = g.arrays.get(&a.array) {
                a.peak_holding_quota = c.peak_holding;
                a.peak_running = c.peak_running;
            }
            a.wait_s = Percentiles::of(w);
            a.span_s = secs(last.saturating_sub(first));
            a
        })
        .collect();
    Some(r)
}

/// Each cohort member's share of GPU-hours against its weight (only for
/// cohorts of more than one tenant). See docs/simulator.md, "Fair share
/// with a half-life".
#[derive(Clone, Debug, Default, Serialize)]
pub struct FairShareReport {
    /// Window length, virtual seconds.
    pub window_s: u64,
    /// The run's deviation: the mean, over every counted window of every
    /// such cohort, of the window's deviation (0: shares equal to weights).
    pub deviation: f64,
    /// Windows counted (at least two backlogged tenants that held GPUs).
    pub windows_counted: usize,
    /// Per cohort, in order of creation.
    pub cohorts: Vec<CohortShares>,
}

/// One cohort's shares.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CohortShares {
    /// Its name.
    pub cohort: String,
    /// Its usage half-life at the end, seconds (0: borrowers served by the
    /// share they borrow now).
    pub usage_half_life_s: u64,
    /// GPU-hours its members' jobs held, whole run.
    pub gpu_hours: f64,
    /// The mean of its counted windows' deviations.
    pub deviation: f64,
    /// Its windows counted.
    pub windows_counted: usize,
    /// Its members, in configuration order.
    pub tenants: Vec<TenantShare>,
    /// Its windows, in time order.
    pub windows: Vec<WindowShares>,
}

/// One member's figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TenantShare {
    /// Its name.
    pub tenant: String,
    /// Its weight.
    pub weight: f64,
    /// Its weight over the sum of its cohort's weights.
    pub weight_share: f64,
    /// GPU-hours its jobs held, whole run.
    pub gpu_hours: f64,
    /// Its share of the cohort's GPU-hours, whole run.
    pub share: f64,
    /// Counted windows in which it was backlogged.
    pub backlogged_windows: usize,
    /// Over those windows, the mean of its share of the backlogged
    /// tenants' GPU-hours.
    pub mean_share_backlogged: f64,
    /// Over those windows, the mean of its entitled share (its weight
    /// over the backlogged tenants' weights).
    pub mean_entitled_backlogged: f64,
    /// Its decayed use at the end, mean GPUs weighted by age (summed over
    /// flavors), when its cohort has a half-life.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decayed_use_gpus: Option<f64>,
}

/// One window of a cohort.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WindowShares {
    /// Start, virtual seconds.
    pub from_s: f64,
    /// End, virtual seconds (the run's end for the last window).
    pub to_s: f64,
    /// GPU-hours the cohort's jobs held in it.
    pub gpu_hours: f64,
    /// Its deviation, when counted.
    pub deviation: Option<f64>,
    /// Per member.
    pub tenants: BTreeMap<String, WindowShare>,
}

/// One member in one window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WindowShare {
    /// Its share of the cohort's GPU-hours in the window.
    pub share: f64,
    /// Whether it had jobs waiting for at least half of the window.
    pub backlogged: bool,
    /// When the window is counted and it was backlogged: its share of the
    /// backlogged tenants' GPU-hours, and its entitled share of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_of_backlogged: Option<f64>,
    /// Its weight over the backlogged tenants' weights (as above).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entitled: Option<f64>,
}

/// Per tenant and window: GPU-ms held and ms backlogged.
type Integrals = Vec<Vec<(f64, u64)>>;

/// Integrates the engine's record of each tenant's GPUs held and backlog
/// over windows of `window_ms` from 0 to `end`.
fn integrate(
    changes: &[crate::engine::ShareChange],
    tenants: usize,
    window_ms: u64,
    end: u64,
) -> Integrals {
    let windows = end.div_ceil(window_ms).max(1) as usize;
    let mut acc = vec![vec![(0.0, 0u64); windows]; tenants];
    // Per tenant: since when, GPUs held, backlogged.
    let mut last = vec![(0u64, 0u64, false); tenants];
    let spread = |acc: &mut [(f64, u64)], (from, gpus, backlogged): (u64, u64, bool), to: u64| {
        let mut a = from;
        while a < to {
            let w = a / window_ms;
            let b = ((w + 1) * window_ms).min(to);
            if let Some(slot) = acc.get_mut(w as usize) {
                slot.0 += gpus as f64 * (b - a) as f64;
                if backlogged {
                    slot.1 += b - a;
                }
            }
            a = b;
        }
    };
    for c in changes {
        let t = c.tenant as usize;
        if t < tenants {
            spread(&mut acc[t], last[t], c.at.0.min(end));
            last[t] = (c.at.0, c.gpus, c.backlogged);
        }
    }
    for (t, a) in acc.iter_mut().enumerate() {
        spread(a, last[t], end);
    }
    acc
}

/// The fair-share section: for every cohort of more than one member.
fn fair_share(sim: &Simulator, window_ms: u64) -> Option<FairShareReport> {
    let state = sim.state();
    let end = sim.measurements.end.0;
    let acc = integrate(
        &sim.measurements.shares.changes,
        state.tenants().len(),
        window_ms,
        end,
    );
    let cohorts: Vec<CohortShares> = (0..state.cohorts().len() as u32)
        .filter(|&c| state.cohort(c).members.len() > 1)
        .map(|c| cohort_shares(state, c, &acc, window_ms, end))
        .collect();
    if cohorts.is_empty() {
        return None;
    }
    let deviations: Vec<f64> = cohorts
        .iter()
        .flat_map(|c| c.windows.iter().filter_map(|w| w.deviation))
        .collect();
    Some(FairShareReport {
        window_s: window_ms / 1000,
        deviation: mean(&deviations),
        windows_counted: deviations.len(),
        cohorts,
    })
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// One cohort's rows and windows.
fn cohort_shares(
    state: &gpusched_core::State,
    c: u32,
    acc: &Integrals,
    window_ms: u64,
    end: u64,
) -> CohortShares {
    let cohort = state.cohort(c);
    let mut members = cohort.members.clone();
    members.sort_unstable();
    let weight = |t: u32| state.tenant(t).spec.weight;
    let name = |t: u32| state.tenant(t).spec.name.clone();
    let total_weight: f64 = members.iter().map(|&t| weight(t)).sum();
    let held = |t: u32| acc[t as usize].iter().map(|w| w.0).sum::<f64>();
    let total_held: f64 = members.iter().map(|&t| held(t)).sum();
    let half_life_ms = cohort.half_life_ms();
    let mut tenants: Vec<TenantShare> = members
        .iter()
        .map(|&t| TenantShare {
            tenant: name(t),
            weight: weight(t),
            weight_share: ratio(weight(t), total_weight),
            gpu_hours: held(t) / 3_600_000.0,
            share: ratio(held(t), total_held),
            decayed_use_gpus: (half_life_ms > 0).then(|| {
                let d = state.decayed_use(t, gpusched_model::Timestamp(end));
                (0..d.gpu_ms.len()).fold(0.0, |sum, f| sum + d.mean_gpus(f, half_life_ms))
            }),
            ..TenantShare::default()
        })
        .collect();
    let windows: Vec<WindowShares> = (0..acc.first().map_or(0, Vec::len))
        .map(|w| window_shares(state, &members, acc, w, window_ms, end))
        .collect();
    for r in &mut tenants {
        let name = &r.tenant;
        let (shares, entitled): (Vec<f64>, Vec<f64>) = windows
            .iter()
            .filter_map(|w| {
                let s = w.tenants.get(name)?;
                Some((s.share_of_backlogged?, s.entitled?))
            })
            .unzip();
        r.backlogged_windows = shares.len();
        r.mean_share_backlogged = mean(&shares);
        r.mean_entitled_backlogged = mean(&entitled);
    }
    let deviations: Vec<f64> = windows.iter().filter_map(|w| w.deviation).collect();
    CohortShares {
        cohort: cohort.name.clone(),
        usage_half_life_s: cohort.usage_half_life_s,
        gpu_hours: total_held / 3_600_000.0,
        deviation: mean(&deviations),
        windows_counted: deviations.len(),
        tenants,
        windows,
    }
}

/// One window: each member's share, whether it was backlogged (jobs
/// waiting for at least half the window), and, when at least two
/// backlogged members held GPUs in it, its deviation: half the sum over
/// the backlogged members of |share of the backlogged members' GPU-hours
/// − weight over the backlogged members' weights|.
fn window_shares(
    state: &gpusched_core::State,
    members: &[u32],
    acc: &Integrals,
    w: usize,
    window_ms: u64,
    end: u64,
) -> WindowShares {
    let from = w as u64 * window_ms;
    let to = ((w as u64 + 1) * window_ms).min(end);
    let len = to.saturating_sub(from);
    let at = |t: u32| acc[t as usize][w];
    let backlogged: Vec<u32> = members
        .iter()
        .copied()
        .filter(|&t| len > 0 && at(t).1 * 2 >= len)
        .collect();
    let total: f64 = members.iter().map(|&t| at(t).0).sum();
    let b_held: f64 = backlogged.iter().map(|&t| at(t).0).sum();
    let b_weight: f64 = backlogged
        .iter()
        .map(|&t| state.tenant(t).spec.weight)
        .sum();
    let counted = backlogged.len() >= 2 && b_held > 0.0;
    let mut deviation = 0.0;
    let mut tenants = BTreeMap::new();
    for &t in members {
        let is_b = backlogged.contains(&t);
        let (mut share_b, mut entitled) = (None, None);
        if counted && is_b {
            let s = at(t).0 / b_held;
            let e = ratio(state.tenant(t).spec.weight, b_weight);
            deviation += (s - e).abs() / 2.0;
            (share_b, entitled) = (Some(s), Some(e));
        }
        tenants.insert(
            state.tenant(t).spec.name.clone(),
            WindowShare {
                share: ratio(at(t).0, total),
                backlogged: is_b,
                share_of_backlogged: share_b,
                entitled,
            },
        );
    }
    WindowShares {
        from_s: from as f64 / 1000.0,
        to_s: to as f64 / 1000.0,
        gpu_hours: total / 3_600_000.0,
        deviation: counted.then_some(deviation),
        tenants,
    }
}

/// One tenant's GPU-hour budget in one flavor, and what it used of it
/// (see docs/simulator.md, "GPU-hour budgets"). Measured from the run's
/// events: a job holds quota from its `JobAdmitted` to the event that
/// releases it (preempted, requeued or ended).
#[derive(Clone, Debug, Default, Serialize)]
pub struct BudgetReport {
    /// The tenant.
    pub tenant: String,
    /// The flavor.
    pub flavor: String,
    /// GPU-hours per period (the budget at the end of the run).
    pub gpu_hours: u64,
    /// Its period: `day`, `week` or `month`.
    pub period: String,
    /// Its policy once spent: `wait` or `borrow-only`.
    pub when_spent: String,
    /// GPU-hours its jobs held in the flavor, whole run.
    pub used_gpu_hours: f64,
    /// `BudgetSpent` events: periods in which it was spent.
    pub times_spent: usize,
    /// Jobs given the pending reason `budget_spent` (the quota stage gives
    /// a reason to the job it examines, its tenant's head; the jobs behind
    /// it wait too, counted below).
    pub jobs_pending_budget_spent: u64,
    /// Jobs that waited for quota (submitted or queued) at some moment
    /// while the budget was spent.
    pub jobs_waited_while_spent: u64,
    /// Jobs admitted in the flavor while it was spent (borrow-only: all on
    /// lent quota).
    pub jobs_admitted_while_spent: u64,
    /// Jobs preempted while it was spent.
    pub jobs_preempted_while_spent: u64,
    /// Each period the run covered, in time order.
    pub periods: Vec<BudgetPeriodReport>,
}

/// One period of a budget.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BudgetPeriodReport {
    /// Its start, virtual seconds.
    pub from_s: f64,
    /// Its end, virtual seconds (the run's end for the last period).
    pub to_s: f64,
    /// GPU-hours the tenant's jobs held in it.
    pub used_gpu_hours: f64,
    /// When those reached the budget, seconds after the period's start.
    pub used_up_after_s: Option<f64>,
    /// When the log said it was spent (`BudgetSpent`: the first cycle
    /// after it was used up), seconds after the period's start.
    pub spent_after_s: Option<f64>,
    /// When the log renewed it at the period's start (`BudgetRenewed`),
    /// seconds after that start: only for a period that began spent.
    pub renewed_after_s: Option<f64>,
    /// GPU-hours held after it was used up by jobs admitted before
    /// (running jobs run on).
    pub run_on_gpu_hours: f64,
    /// GPU-hours held after it was used up by jobs admitted since
    /// (borrow-only: on lent quota; with `wait`, 0).
    pub after_spent_gpu_hours: f64,
}

/// The budgets section: one entry per tenant and flavor with a budget.
fn budgets(sim: &Simulator) -> Option<Vec<BudgetReport>> {
    let log = &sim.measurements.budgets;
    if log.budgets.is_empty() {
        return None;
    }
    let state = sim.state();
    let end = sim.measurements.end;
    let reports = log
        .budgets
        .iter()
        .map(|(&(t, f), r)| {
            let periods = budget_periods(r, end);
            let count = |s: &std::collections::BTreeSet<gpusched_model::JobId>| s.len() as u64;
            BudgetReport {
                tenant: state.tenant(t).spec.name.clone(),
                flavor: state.flavor_name(f).to_string(),
                gpu_hours: r.budget.gpu_hours,
                period: r.budget.period.name().to_string(),
                when_spent: r.budget.when_spent.name().to_string(),
                used_gpu_hours: periods.iter().map(|p| p.used_gpu_hours).sum(),
                times_spent: r.spent.len(),
                jobs_pending_budget_spent: count(&r.pending),
                jobs_waited_while_spent: count(&r.waited_while_spent),
                jobs_admitted_while_spent: count(&r.admitted_while_spent),
                jobs_preempted_while_spent: count(&r.preempted_while_spent),
                periods,
            }
        })
        .collect();
    Some(reports)
}

/// A budget's periods from the one its record began in to the run's end.
fn budget_periods(
    r: &crate::engine::BudgetRecord,
    end: gpusched_model::Timestamp,
) -> Vec<BudgetPeriodReport> {
    let period = r.budget.period;
    let mut out = Vec::new();
    let mut from = period.start_of(r.since);
    while from < end || out.is_empty() {
        let next = period.next_start(from);
        let to = next.min(end);
        out.push(budget_period(r, from.0, to.0.max(from.0)));
        if next <= from {
            break;
        }
        from = next;
    }
    out
}

/// One period `[from, to)`, ms: the GPU-ms held in it, when they reached
/// the budget, and how what was held after that splits between jobs
/// admitted before and since.
fn budget_period(r: &crate::engine::BudgetRecord, from: u64, to: u64) -> BudgetPeriodReport {
    let budget_ms = r.budget.gpu_ms() as f64;
    // Each hold cut to the period: (from, to, GPUs, admitted at).
    let holds: Vec<(u64, u64, f64, u64)> = r
        .holds
        .iter()
        .filter_map(|h| {
            let a = h.admitted_at.0.max(from);
            let b = h.released_at.map_or(to, |x| x.0).min(to);
            (a < b).then_some((a, b, h.gpus as f64, h.admitted_at.0))
        })
        .collect();
    // The moment the running total reached the budget: sweep the changes
    // of GPUs held in time order.
    let mut steps: Vec<(u64, f64)> = holds
        .iter()
        .flat_map(|&(a, b, g, _)| [(a, g), (b, -g)])
        .collect();
    steps.sort_by(|x, y| x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)));
    let (mut used, mut gpus, mut at) = (0.0, 0.0, from);
    let mut used_up: Option<f64> = None;
    for (t, dg) in steps {
        let add = gpus * (t - at) as f64;
        if used_up.is_none() && gpus > 0.0 && used + add >= budget_ms {
            used_up = Some(at as f64 + (budget_ms - used) / gpus);
        }
        used += add;
        gpus += dg;
        at = t;
    }
    let (mut run_on, mut after_spent) = (0.0, 0.0);
    if let Some(u) = used_up {
        for &(a, b, g, admitted) in &holds {
            let held = g * (b as f64 - (a as f64).max(u)).max(0.0);
            if (admitted as f64) < u {
                run_on += held;
            } else {
                after_spent += held;
            }
        }
    }
    let secs_after = |t: f64| (t - from as f64) / 1000.0;
    let event_in = |events: &[(gpusched_model::Timestamp, gpusched_model::Timestamp)]| {
        events
            .iter()
            .find(|(p, _)| p.0 == from)
            .map(|(_, at)| secs_after(at.0 as f64))
    };
    let hours = |ms: f64| ms / 3_600_000.0;
    BudgetPeriodReport {
        from_s: from as f64 / 1000.0,
        to_s: to as f64 / 1000.0,
        used_gpu_hours: hours(used),
        used_up_after_s: used_up.map(secs_after),
        spent_after_s: event_in(&r.spent),
        renewed_after_s: event_in(&r.renewed),
        run_on_gpu_hours: hours(run_on),
        after_spent_gpu_hours: hours(after_spent),
    }
}

/// Seconds as `+H:MM:SS`, or `-` for none.
fn offset(s: Option<f64>) -> String {
    s.map_or("-".to_string(), |s| {
        let s = s.round() as u64;
        format!("+{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    })
}

impl BudgetReport {
    /// The budget's lines of the table: a summary, then one per period.
    fn write_table(&self, s: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            s,
            "  budget         {} in {}: {} GPU-h a {}, when spent: {}; used {:.1} GPU-h, spent in {} of {} periods; {} jobs waited while spent ({} given budget_spent), {} admitted while spent, {} preempted while spent",
            self.tenant,
            self.flavor,
            self.gpu_hours,
            self.period,
            self.when_spent,
            self.used_gpu_hours,
            self.times_spent,
            self.periods.len(),
            self.jobs_waited_while_spent,
            self.jobs_pending_budget_spent,
            self.jobs_admitted_while_spent,
            self.jobs_preempted_while_spent
        );
        if self.periods.len() > TABLE_WINDOWS {
            let _ = writeln!(
                s,
                "    {} periods: each period's use is in the --report JSON (budgets[].periods)",
                self.periods.len()
            );
            return;
        }
        let _ = writeln!(
            s,
            "    {:<14} {:>10} {:>11} {:>11} {:>11} {:>10} {:>12}",
            "period (h)", "used GPU-h", "used up", "spent", "renewed", "run on", "after spent"
        );
        for p in &self.periods {
            let span = format!("{:.1}–{:.1}", p.from_s / 3600.0, p.to_s / 3600.0);
            let _ = writeln!(
                s,
                "    {span:<14} {:>10.1} {:>11} {:>11} {:>11} {:>10.1} {:>12.1}",
                p.used_gpu_hours,
                offset(p.used_up_after_s),
                offset(p.spent_after_s),
                offset(p.renewed_after_s),
                p.run_on_gpu_hours,
                p.after_spent_gpu_hours
            );
        }
        let _ = writeln!(
            s,
            "    (times after the period's start; run on / after spent: GPU-h held after it was used up by jobs admitted before / since)"
        );
    }
}

/// Most windows the table lists one by one.
const TABLE_WINDOWS: usize = 16;

impl FairShareReport {
    /// The section's lines of the table.
    fn write_table(&self, s: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            s,
            "  fair share     {:.3} deviation of backlogged tenants' shares of GPU-hours from their weights (mean of {} windows of {} s; 0 = equal)",
            self.deviation, self.windows_counted, self.window_s
        );
        for c in &self.cohorts {
            let half_life = match c.usage_half_life_s {
                0 => "no usage half-life".to_string(),
                h => format!("usage half-life {h} s"),
            };
            let _ = writeln!(
                s,
                "  cohort {:<8} {half_life}; {:.1} GPU-h; deviation {:.3} over {} windows",
                c.cohort, c.gpu_hours, c.deviation, c.windows_counted
            );
            let _ = writeln!(
                s,
                "    {:<14} {:>7} {:>8} {:>10} {:>7} {:>11} {:>10} {:>10} {:>12}",
                "tenant",
                "weight",
                "weight%",
                "GPU-h",
                "share%",
                "backlogged",
                "share% b.",
                "entitled%",
                "decayed GPUs"
            );
            for t in &c.tenants {
                let decayed = t
                    .decayed_use_gpus
                    .map_or("-".to_string(), |d| format!("{d:.1}"));
                let _ = writeln!(
                    s,
                    "    {:<14} {:>7.2} {:>8.1} {:>10.1} {:>7.1} {:>11} {:>10.1} {:>10.1} {:>12}",
                    t.tenant,
                    t.weight,
                    t.weight_share * 100.0,
                    t.gpu_hours,
                    t.share * 100.0,
                    t.backlogged_windows,
                    t.mean_share_backlogged * 100.0,
                    t.mean_entitled_backlogged * 100.0,
                    decayed
                );
            }
            c.write_windows(s);
        }
    }
}

impl CohortShares {
    /// Each window's shares (a `*` marks a backlogged tenant), or where
    /// to find them when there are many.
    fn write_windows(&self, s: &mut String) {
        use std::fmt::Write;
        if self.windows.len() > TABLE_WINDOWS {
            let _ = writeln!(
                s,
                "    {} windows: each window's shares are in the --report JSON (fair_share.cohorts[].windows)",
                self.windows.len()
            );
            return;
        }
        let mut head = format!("    {:<14}", "window (h)");
        for t in &self.tenants {
            let _ = write!(head, " {:>10}", truncate(&t.tenant, 10));
        }
        let _ = writeln!(s, "{head} {:>10}", "deviation");
        for w in &self.windows {
            let span = format!("{:.1}–{:.1}", w.from_s / 3600.0, w.to_s / 3600.0);
            let mut line = format!("    {span:<14}");
            for t in &self.tenants {
                let cell = w.tenants.get(&t.tenant).map_or(String::new(), |x| {
                    format!(
                        "{:.1}{}",
                        x.share * 100.0,
                        if x.backlogged { "*" } else { " " }
                    )
                });
                let _ = write!(line, " {cell:>10}");
            }
            let dev = w.deviation.map_or("-".to_string(), |d| format!("{d:.3}"));
            let _ = writeln!(s, "{line} {dev:>10}");
        }
        let _ = writeln!(
            s,
            "    (share% of the cohort's GPU-hours per window; * backlogged at least half of it)"
        );
    }
}

/// At most `n` characters of `s`.
fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = Percentiles::of((1..=100).map(|i| i as f64).collect());
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(Percentiles::of(vec![]).max, 0.0);
    }

    #[test]
    fn holding_and_backlog_are_split_at_window_edges() {
        use crate::engine::ShareChange;
        use gpusched_model::Timestamp;
        let change = |at: u64, tenant: u32, gpus: u64, backlogged: bool| ShareChange {
            at: Timestamp(at),
            tenant,
            gpus,
            backlogged,
        };
        // Tenant 0: 8 GPUs from 5 to 25, backlogged from 15 to 35; tenant 1
        // nothing. Windows of 10 to the end at 35.
        let changes = [
            change(5, 0, 8, false),
            change(15, 0, 8, true),
            change(25, 0, 0, true),
        ];
        let acc = integrate(&changes, 2, 10, 35);
        assert_eq!(
            acc[0],
            [(40.0, 0), (80.0, 5), (40.0, 10), (0.0, 5)],
            "the last window is cut at the end"
        );
        assert_eq!(acc[1], [(0.0, 0); 4]);
    }
}
