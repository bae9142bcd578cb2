//! The simulation report: a readable table and JSON.
//!
//! Owns: turning a finished simulation's state and measurements into the
//! figures users compare runs by — waits, completion times, utilisation,
//! cycle cost, and what operations, dependencies and array limits did.
//! A wait is a measured outcome here, never a prediction.
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
}

impl Report {
    /// Builds the report of a finished simulation.
    pub fn build(sim: &Simulator, cluster_desc: String) -> Report {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = Percentiles::of((1..=100).map(|i| i as f64).collect());
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(Percentiles::of(vec![]).max, 0.0);
    }
}
