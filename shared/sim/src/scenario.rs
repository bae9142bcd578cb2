//! Built-in scenarios: a cluster and a workload that show one behaviour.
//!
//! Owns: `reclaim` — a borrower fills an idle cluster with long,
//! checkpointing training jobs; three hours later the quota owner returns
//! and must reclaim its share by preemption. `maintenance` — the same two
//! tenants while an admin holds, drains and stops their queues and evicts
//! nodes for maintenance. `pipeline` — one tenant's prep → train → eval
//! pipelines chained by dependencies, some failing, while the other runs
//! a large job array under a limit on tasks at once. `fairshare` — three
//! borrowers of weights 1, 2 and 4 in one cohort with a usage half-life,
//! the heaviest bursting early, going quiet and returning. `budget` — two
//! tenants with daily GPU-hour budgets, one whose jobs wait once it is
//! spent and one whose jobs then run only on lent quota, and a quota owner
//! without a budget that returns and reclaims its share. And
//! [`set_usage_half_life`]: any cluster with every cohort's half-life set,
//! to run the same cluster and workload with and without one.
//!
//! Must never: decide anything about scheduling.

use crate::cluster::Cluster;
use crate::workload::{link, Links, Workload, WorkloadItem, WorkloadKind};
use gpusched_events::{Event, QueueState};
use gpusched_model::{CheckpointPolicy, CohortSpec, JobSpec, Timestamp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A scenario's cluster file, parsed (this module's tests check each).
fn scenario_cluster(text: &str, scenario: &str) -> Cluster {
    match Cluster::parse(text, scenario) {
        Ok(c) => c,
        Err(e) => unreachable!("the {scenario}'s cluster is checked by tests: {e}"),
    }
}

/// A scenario: its cluster, and its items in time order, described.
fn scenario(
    cluster: Cluster,
    mut items: Vec<WorkloadItem>,
    description: String,
) -> (Cluster, Workload) {
    items.sort_by_key(|i| i.at);
    (cluster, Workload { items, description })
}

/// The reclaim scenario's cluster: 512 H100s (2 racks × 4 blocks × 8 nodes
/// × 8 GPUs); tenants `research` (the owner) and `batch` (the borrower),
/// 256 GPUs nominal each, in one cohort.
pub const RECLAIM_CLUSTER: &str = include_str!("../scenarios/reclaim.toml");

fn job(
    tenant: &str,
    workers: u32,
    topology: &str,
    checkpoint: Option<CheckpointPolicy>,
) -> JobSpec {
    JobSpec {
        topology: topology.into(),
        checkpoint,
        ..JobSpec::new(tenant, workers, 8)
    }
}

/// The reclaim scenario.
///
/// - t = 0 … 50 min: `batch` submits 100 single-node (1×8) training jobs, one
///   every 30 s, each running 12 h and checkpointing every 20, 30 or 45 min
///   (60–180 s per checkpoint; one in five does not checkpoint). The first 64
///   fill the idle cluster, half of it on `research`'s lent quota.
/// - t = 3 h: `research` returns with eight 1×8 jobs and two 4×8 block
///   gangs (128 GPUs), and at 3 h 30 min eight more 1×8 jobs: 192 GPUs in all,
///   within its 256 nominal. Each runs 2 h.
///
/// The seed varies checkpoint intervals and durations.
pub fn reclaim(seed: u64) -> (Cluster, Workload) {
    let cluster = scenario_cluster(RECLAIM_CLUSTER, "reclaim scenario");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut items = Vec::new();
    for i in 0..100u64 {
        let checkpoint = if rng.gen_range(0..5) == 0 {
            None
        } else {
            Some(CheckpointPolicy {
                interval_s: [1200, 1800, 2700][rng.gen_range(0..3)],
                duration_s: rng.gen_range(60..=180),
            })
        };
        items.push(WorkloadItem {
            at: Timestamp::from_secs(i * 30),
            kind: WorkloadKind::Submit {
                spec: job("batch", 1, "node", checkpoint),
                duration_s: 12 * 3600,
            },
        });
    }
    let owner = |at: u64, workers: u32, topology: &str| WorkloadItem {
        at: Timestamp::from_secs(at),
        kind: WorkloadKind::Submit {
            spec: job(
                "research",
                workers,
                topology,
                Some(CheckpointPolicy {
                    interval_s: 1800,
                    duration_s: 60,
                }),
            ),
            duration_s: 2 * 3600,
        },
    };
    for _ in 0..8 {
        items.push(owner(3 * 3600, 1, "node"));
    }
    for _ in 0..2 {
        items.push(owner(3 * 3600, 4, "block"));
    }
    for _ in 0..8 {
        items.push(owner(3 * 3600 + 1800, 1, "node"));
    }
    scenario(
        cluster,
        items,
        format!(
            "reclaim scenario (seed {seed}): batch fills the idle cluster with 100 × 1×8 GPU, 12 h jobs checkpointing every 20/30/45 min (1 in 5 never); research returns at 3 h with 8 × 1×8 and 2 × 4×8 block gangs, and 8 × 1×8 more at 3.5 h"
        ),
    )
}

/// The maintenance scenario, on the reclaim scenario's cluster.
///
/// - t = 0 … 50 min: `batch` submits 100 single-node training jobs as in
///   the reclaim scenario (12 h, checkpointing every 20/30/45 min; one in
///   five never).
/// - `research` submits one 1×8 job of 1 h every 5 minutes from t = 0 to
///   10 h, each checkpointing every 20 min.
/// - 1 h: `research`'s queue is held; 1 h 30 min: released (its jobs
///   submitted meanwhile wait, then start).
/// - 2 h: four nodes of rack 0, block 0 are evicted for maintenance (their
///   jobs checkpoint and resume elsewhere); they stay out of service.
/// - 3 h: `research` is drained (its submissions are refused, its running
///   jobs finish); 3 h 30 min: released.
/// - 5 h: `batch` is stopped: its running jobs are evicted, those on
///   borrowed quota first; 7 h: released, and they resume from their
///   checkpoints.
pub fn maintenance(seed: u64) -> (Cluster, Workload) {
    let (cluster, reclaim) = reclaim(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d61_696e);
    let mut items: Vec<WorkloadItem> = reclaim
        .items
        .into_iter()
        .filter(|i| matches!(&i.kind, WorkloadKind::Submit { spec, .. } if spec.tenant == "batch"))
        .collect();
    for k in 0..120u64 {
        items.push(WorkloadItem {
            at: Timestamp::from_secs(k * 300 + rng.gen_range(0..60)),
            kind: WorkloadKind::Submit {
                spec: job(
                    "research",
                    1,
                    "node",
                    Some(CheckpointPolicy {
                        interval_s: 1200,
                        duration_s: 60,
                    }),
                ),
                duration_s: 3600,
            },
        });
    }
    let queue = |at: u64, tenant: &str, state: QueueState| WorkloadItem {
        at: Timestamp::from_secs(at),
        kind: WorkloadKind::Queue {
            tenant: tenant.into(),
            state,
        },
    };
    items.push(queue(3600, "research", QueueState::Held));
    items.push(queue(5400, "research", QueueState::Open));
    for n in 0..4 {
        items.push(WorkloadItem {
            at: Timestamp::from_secs(7200),
            kind: WorkloadKind::NodeEvict {
                node: format!("h100-80g-rack-0-block-0-node-{n}"),
            },
        });
    }
    items.push(queue(3 * 3600, "research", QueueState::Draining));
    items.push(queue(3 * 3600 + 1800, "research", QueueState::Open));
    items.push(queue(5 * 3600, "batch", QueueState::Stopped));
    items.push(queue(7 * 3600, "batch", QueueState::Open));
    scenario(
        cluster,
        items,
        format!(
            "maintenance scenario (seed {seed}): batch fills the cluster with 100 × 1×8 GPU, 12 h checkpointing jobs; research submits a 1×8, 1 h job every 5 min for 10 h; research held 1 h–1.5 h, 4 nodes evicted at 2 h, research drained 3 h–3.5 h, batch stopped 5 h–7 h"
        ),
    )
}

/// Pipelines in the pipeline scenario.
pub const PIPELINES: usize = 24;
/// Of those, how many have a prep that fails.
pub const FAILING_PREPS: usize = 6;
/// Tasks of the pipeline scenario's array.
pub const ARRAY_TASKS: u32 = 200;
/// The array's limit on tasks queued for quota or holding it at once.
pub const ARRAY_MAX_RUNNING: u32 = 16;

/// The pipeline scenario, on the reclaim scenario's cluster.
///
/// - `research` submits a pipeline every 10 minutes (plus up to a minute)
///   from t = 0, 24 in all, each four jobs at once: prep (1×8, 15–25 min)
///   → train (2×8 in one block, 100–140 min, checkpointing every 30 min;
///   `after_ok` prep) → eval (1×8, 8–12 min; `after_ok` train) → cleanup
///   (one GPU, 5 min; `after` eval: it runs however the pipeline ended).
///   The preps of 6 pipelines fail after 2–10 minutes, so their train is
///   cancelled (`JobDependencyFailed`), then their eval; their cleanup
///   runs.
/// - At 5 min `batch` submits a job array of 200 tasks (1×8, 10–20 min
///   each) with `max_running` 16: at most 16 are queued for quota or hold
///   it at once, though the cluster has room for more.
///
/// Jobs are numbered in submit order: pipeline 0 is jobs 1–4, the array
/// jobs 5–204 (its id is 5), pipeline k ≥ 1 jobs 201 + 4k to 204 + 4k.
/// The seed varies durations, jitter and which preps fail.
pub fn pipeline(seed: u64) -> (Cluster, Workload) {
    let (cluster, _) = reclaim(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7069_7065);
    let failing: Vec<usize> =
        rand::seq::index::sample(&mut rng, PIPELINES, FAILING_PREPS).into_vec();
    let mut drafts: Vec<(WorkloadItem, Links)> = Vec::new();
    let names = |k: usize, stage: &str| format!("p{k}-{stage}");
    for k in 0..PIPELINES {
        let at = Timestamp::from_secs(k as u64 * 600 + rng.gen_range(0..60));
        let fails = failing.contains(&k);
        let prep_s = if fails {
            rng.gen_range(120..=600)
        } else {
            rng.gen_range(900..=1500)
        };
        let train_s = rng.gen_range(6000..=8400);
        let eval_s = rng.gen_range(480..=720);
        let mut stage = |name: &str,
                         workers: u32,
                         gpus: u32,
                         duration_s: u64,
                         fails: bool,
                         after_ok: &[&str],
                         after: &[&str]| {
            let mut spec = job(
                "research",
                workers,
                if workers == 1 { "node" } else { "block" },
                (duration_s > 3600).then_some(CheckpointPolicy {
                    interval_s: 1800,
                    duration_s: 60,
                }),
            );
            spec.gpus_per_worker = gpus;
            let kind = if fails {
                WorkloadKind::SubmitFailing { spec, duration_s }
            } else {
                WorkloadKind::Submit { spec, duration_s }
            };
            let links = Links {
                id: Some(names(k, name)),
                after_ok: after_ok.iter().map(|s| names(k, s)).collect(),
                after: after.iter().map(|s| names(k, s)).collect(),
                ..Links::default()
            };
            drafts.push((WorkloadItem { at, kind }, links));
        };
        stage("prep", 1, 8, prep_s, fails, &[], &[]);
        stage("train", 2, 8, train_s, false, &["prep"], &[]);
        stage("eval", 1, 8, eval_s, false, &["train"], &[]);
        stage("cleanup", 1, 1, 300, false, &[], &["eval"]);
    }
    for _ in 0..ARRAY_TASKS {
        drafts.push((
            WorkloadItem {
                at: Timestamp::from_secs(300),
                kind: WorkloadKind::Submit {
                    spec: job("batch", 1, "node", None),
                    duration_s: rng.gen_range(600..=1200),
                },
            },
            Links {
                array: Some("sweep".into()),
                array_max_running: Some(ARRAY_MAX_RUNNING),
                ..Links::default()
            },
        ));
    }
    let items = match link(drafts, &|i| format!("item {i}")) {
        Ok(items) => items,
        Err(e) => unreachable!("the pipeline scenario's links are checked by tests: {e:?}"),
    };
    let workload = Workload {
        items,
        description: format!(
            "pipeline scenario (seed {seed}): research submits {PIPELINES} pipelines, one every 10 min, each prep 1×8 (15–25 min) → train 2×8 (100–140 min, after_ok prep) → eval 1×8 (8–12 min, after_ok train) → cleanup 1 GPU (5 min, after eval); {FAILING_PREPS} preps fail; batch submits a {ARRAY_TASKS}-task array of 1×8, 10–20 min jobs at 5 min with max_running {ARRAY_MAX_RUNNING}"
        ),
    };
    (cluster, workload)
}

/// Sets every cohort's usage half-life (seconds; 0: borrowers are served
/// by the share they borrow now): a cohort the cluster configures gets the
/// new value in its `CohortConfigured` event; any other cohort its tenants
/// name gets one appended after the configuration, unless `seconds` is 0,
/// which it already is (so the run is exactly the one without the call).
pub fn set_usage_half_life(cluster: &mut Cluster, seconds: u64) {
    // Cohorts the tenants name, in order, and those configured.
    let (mut named, mut configured): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for e in &mut cluster.events {
        match e {
            Event::CohortConfigured { spec, .. } => {
                spec.usage_half_life_s = seconds;
                configured.push(spec.name.clone());
            }
            Event::TenantConfigured { spec } => named.extend(spec.cohort.clone()),
            _ => {}
        }
    }
    if seconds == 0 {
        return;
    }
    named.dedup();
    for name in named {
        if !configured.contains(&name) {
            configured.push(name.clone());
            cluster.events.push(Event::CohortConfigured {
                spec: CohortSpec {
                    name,
                    usage_half_life_s: seconds,
                },
                at: Timestamp(0),
            });
        }
    }
}

/// The fairshare scenario's usage half-life: 2 hours.
pub const FAIRSHARE_HALF_LIFE_S: u64 = 2 * 3600;

/// The fairshare scenario's cluster: 128 H100s (2 racks × 2 blocks × 4
/// nodes × 8 GPUs); borrowers `small`, `medium` and `large` of weights 1,
/// 2 and 4 with no nominal quota, and `pool`, which lends all 128 GPUs and
/// submits nothing, in cohort `lab` with a usage half-life of 2 hours.
pub const FAIRSHARE_CLUSTER: &str = include_str!("../scenarios/fairshare.toml");

/// The fairshare scenario's submissions: (tenant, first at, every, jobs);
/// seconds.
const STREAMS: [(&str, u64, u64, u64); 4] = [
    ("small", 0, 600, 75),
    ("medium", 0, 300, 140),
    ("large", 0, 180, 40),
    ("large", 20 * 3600, 180, 80),
];

/// The fairshare scenario, on [`FAIRSHARE_CLUSTER`].
///
/// - From t = 0 `small` submits a job every 10 minutes (75 in all) and
///   `medium` one every 5 minutes (140): each wants more than the cluster,
///   so both stay backlogged for about 36 hours.
/// - `large` bursts: 40 jobs, one every 3 minutes from t = 0, which last
///   it about 8 hours; it is quiet from then until 20 h, when it returns
///   with 80 more, one every 3 minutes.
/// - Every job checkpoints every 30 min and runs 30–150 min; one in four
///   is a 2×8 gang in one block, the rest 1×8.
///
/// All three borrow everything they run from `pool`, so the order among
/// borrowers (by decayed use per weight, or with a half-life of 0 by the
/// share borrowed now) decides each one's share. The seed varies times,
/// sizes and durations.
pub fn fairshare(seed: u64) -> (Cluster, Workload) {
    let cluster = scenario_cluster(FAIRSHARE_CLUSTER, "fairshare scenario");
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6661_6972);
    let mut items = Vec::new();
    for (tenant, from_s, every_s, jobs) in STREAMS {
        for k in 0..jobs {
            let workers = if rng.gen_range(0..4) == 0 { 2 } else { 1 };
            let spec = job(
                tenant,
                workers,
                if workers == 1 { "node" } else { "block" },
                Some(CheckpointPolicy {
                    interval_s: 1800,
                    duration_s: 60,
                }),
            );
            items.push(WorkloadItem {
                at: Timestamp::from_secs(from_s + k * every_s + rng.gen_range(0..60)),
                kind: WorkloadKind::Submit {
                    spec,
                    duration_s: rng.gen_range(1800..=9000),
                },
            });
        }
    }
    scenario(
        cluster,
        items,
        format!(
            "fairshare scenario (seed {seed}): borrowers small, medium and large (weights 1, 2, 4) on 128 GPUs lent by pool; small submits a job every 10 min (75), medium every 5 min (140), large 40 every 3 min from t=0 and 80 more from 20 h; 1×8 or 2×8 jobs of 30–150 min"
        ),
    )
}

/// The budget scenario's daily budgets, GPU-hours (each of `capped` and
/// `flex`).
pub const BUDGET_GPU_HOURS: u64 = 160;

/// The budget scenario's cluster: 64 H100s (1 rack × 2 blocks × 4 nodes ×
/// 8 GPUs) in cohort `lab`: `owner` (32 GPUs nominal, no budget),
/// `capped` (16 nominal, 160 GPU-hours a day; when spent, its jobs wait)
/// and `flex` (16 nominal, 160 GPU-hours a day; when spent, its jobs run
/// only on quota the cohort lends).
pub const BUDGET_CLUSTER: &str = include_str!("../scenarios/budget.toml");

/// Days on which `capped` and `flex` submit.
pub const BUDGET_DAYS: u64 = 3;
/// The budget scenario's daily submissions from 08:00: (tenant, jobs, every
/// so many seconds).
const BUDGET_STREAMS: [(&str, u64, u64); 2] = [("capped", 16, 900), ("flex", 24, 600)];
/// When `owner` returns: day 1, 14:00 (virtual seconds; the run starts at
/// 00:00 UTC, so days are the budgets' periods).
pub const BUDGET_OWNER_RETURNS_S: u64 = 86_400 + 14 * 3600;

/// The budget scenario, on [`BUDGET_CLUSTER`].
///
/// - On each of 3 days, from 08:00, `capped` submits a 1×8 job every 15
///   minutes (16) and `flex` one every 10 minutes (24), plus up to a
///   minute each, running 60–180 minutes and checkpointing every 30:
///   about 260 and 380 GPU-hours a day, more than their 160. With `owner`
///   away they borrow its quota, and spend their budgets early in the
///   afternoon.
/// - Spent, `capped`'s jobs wait for the next day (00:00 UTC); `flex`'s
///   run on, borrowing all they use.
/// - Day 1, 14:00: `owner` returns with four 1×8 jobs of 4 hours (its 32
///   GPUs), and reclaims them from the borrowers.
///
/// The seed varies times and durations.
pub fn budget(seed: u64) -> (Cluster, Workload) {
    let cluster = scenario_cluster(BUDGET_CLUSTER, "budget scenario");
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6275_6467);
    let checkpoint = Some(CheckpointPolicy {
        interval_s: 1800,
        duration_s: 60,
    });
    let mut items = Vec::new();
    for day in 0..BUDGET_DAYS {
        for (tenant, jobs, every_s) in BUDGET_STREAMS {
            for k in 0..jobs {
                items.push(WorkloadItem {
                    at: Timestamp::from_secs(
                        day * 86_400 + 8 * 3600 + k * every_s + rng.gen_range(0..60),
                    ),
                    kind: WorkloadKind::Submit {
                        spec: job(tenant, 1, "node", checkpoint),
                        duration_s: rng.gen_range(3600..=10_800),
                    },
                });
            }
        }
    }
    for _ in 0..4 {
        items.push(WorkloadItem {
            at: Timestamp::from_secs(BUDGET_OWNER_RETURNS_S),
            kind: WorkloadKind::Submit {
                spec: job("owner", 1, "node", checkpoint),
                duration_s: 4 * 3600,
            },
        });
    }
    scenario(
        cluster,
        items,
        format!(
            "budget scenario (seed {seed}): on 64 GPUs, capped (budget {BUDGET_GPU_HOURS} GPU-h a day, wait) submits 16 × 1×8 jobs every 15 min and flex ({BUDGET_GPU_HOURS} GPU-h a day, borrow-only) 24 every 10 min, from 08:00 on {BUDGET_DAYS} days, 60–180 min each; owner (32 nominal, no budget) returns on day 1 at 14:00 with 4 × 1×8 jobs of 4 h"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaim_scenario_is_well_formed() {
        let (c, w) = reclaim(1);
        assert_eq!(c.gpus, 512);
        assert_eq!(w.items.len(), 118);
        assert_eq!(reclaim(1).1, w);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_maintenance_scenario_runs_every_operation_and_replays() {
        use crate::Report;
        let (c, w) = maintenance(1);
        let sim = run_recorded(&c, w);
        let r = Report::build(&sim, String::new());
        let o = r.operations.expect("operations reported");
        // Every operation took effect: none named a missing tenant or node.
        assert_eq!((o.queue_changes, o.node_evictions, o.ignored), (6, 4, 0));
        // The stopped queue's running jobs and the evicted nodes' jobs were
        // evicted, most of them after a checkpoint on request.
        assert!(
            o.evicted_from_stopped_queues > 0 && o.evicted_from_nodes > 0,
            "{o:?}"
        );
        assert!(
            o.stopped_on_checkpoint * 2 > o.evicted_from_stopped_queues + o.evicted_from_nodes,
            "{o:?}"
        );
        // research's submissions while it drained were refused.
        assert!(o.refused > 0, "{o:?}");
        // Every job the workload submitted ended, refused ones aside.
        assert_eq!(r.jobs_unfinished, 0);
        assert_eq!(r.jobs_rejected, o.refused);
        let replayed = crate::replay(sim.log()).unwrap();
        assert_eq!(replayed.state_hash(), sim.state().state_hash());
    }

    /// The pipeline scenario run to its end, keeping every event.
    fn run_pipeline(seed: u64) -> crate::Simulator {
        let (c, w) = pipeline(seed);
        run_recorded(&c, w)
    }

    /// A scenario run to its end, keeping every event.
    #[allow(clippy::unwrap_used)]
    fn run_recorded(c: &Cluster, w: Workload) -> crate::Simulator {
        use crate::{SimOptions, Simulator};
        let opts = SimOptions {
            cycle: c.cycle,
            until: None,
            record_events: true,
            restore_ms: 0,
        };
        let mut sim = Simulator::new(c, w, opts).unwrap();
        sim.run(&mut |_| {}).unwrap();
        sim
    }

    #[test]
    fn the_pipeline_scenario_numbers_its_jobs_as_documented() {
        use gpusched_model::JobId;
        let (c, w) = pipeline(1);
        assert_eq!(c.gpus, 512);
        assert_eq!(w, pipeline(1).1);
        assert_ne!(w.items, pipeline(2).1.items);
        let jobs: Vec<(&JobSpec, bool)> = w
            .items
            .iter()
            .filter_map(|i| i.kind.submission().map(|(s, _, fails)| (s, fails)))
            .collect();
        assert_eq!(jobs.len(), PIPELINES * 4 + ARRAY_TASKS as usize);
        assert_eq!(jobs.iter().filter(|j| j.1).count(), FAILING_PREPS);
        // Job n is the n-th submission: pipeline 0 is jobs 1–4, the array
        // jobs 5–204, pipeline k ≥ 1 jobs 201 + 4k to 204 + 4k.
        let job = |n: u64| jobs[n as usize - 1].0;
        for k in 0..PIPELINES as u64 {
            let prep = if k == 0 { 1 } else { 201 + 4 * k };
            assert_eq!(job(prep).after_ok, vec![]);
            assert_eq!(job(prep + 1).after_ok, vec![JobId(prep)]);
            assert_eq!(job(prep + 2).after_ok, vec![JobId(prep + 1)]);
            assert_eq!(job(prep + 3).after, vec![JobId(prep + 2)]);
            assert!((prep..prep + 4).all(|n| job(n).tenant == "research"));
        }
        for (index, n) in (5..5 + u64::from(ARRAY_TASKS)).enumerate() {
            let a = job(n).array.expect("an array task");
            assert_eq!((a.array, a.index), (5, index as u32));
            assert_eq!(a.max_running, Some(ARRAY_MAX_RUNNING));
            assert_eq!(job(n).tenant, "batch");
        }
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_pipeline_scenario_gates_jobs_and_replays() {
        use crate::Report;
        use gpusched_core::{Phase, State};
        use gpusched_events::{Event, Outcome};
        use gpusched_model::JobId;
        let sim = run_pipeline(1);
        let r = Report::build(&sim, String::new());
        let g = r.gates.clone().expect("gates reported");
        assert!(r.operations.is_none());
        // Trains, evals and cleanups named dependencies and waited for them.
        assert_eq!(g.dependent_jobs, 3 * PIPELINES as u64);
        assert_eq!(g.waited_for_dependencies, g.dependent_jobs);
        // A failed prep cancels its train, and that its eval; cleanups run.
        assert_eq!(g.jobs_failed, FAILING_PREPS as u64);
        assert_eq!(g.cancelled_by_failed_dependency, 2 * FAILING_PREPS as u64);
        assert_eq!(
            g.started,
            g.dependent_jobs - g.cancelled_by_failed_dependency
        );
        assert_eq!((g.rejected, r.jobs_unfinished), (0, 0));
        let a = &g.arrays[..];
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].array, a[0].tasks, a[0].succeeded), (5, 200, 200));
        // The limit holds, and binds: the cluster had room for more.
        assert_eq!(a[0].peak_holding_quota, u64::from(ARRAY_MAX_RUNNING));
        assert_eq!(a[0].peak_running, u64::from(ARRAY_MAX_RUNNING));

        // Replayed event by event: no dependent is admitted before its
        // dependencies succeeded (after_ok) or ended (after); no more than
        // 16 of the array's tasks hold quota at once.
        let log = sim.log();
        let mut s = State::new();
        let mut peak = 0;
        for e in log {
            if let Event::JobAdmitted { job, .. } = e {
                let spec = &s.job(*job).unwrap().spec;
                for d in &spec.after_ok {
                    assert_eq!(s.job(*d).unwrap().phase, Phase::Succeeded, "{job} admitted");
                }
                for d in &spec.after {
                    assert!(s.job(*d).unwrap().phase.is_terminal(), "{job} admitted");
                }
            }
            s.apply(e).unwrap();
            let holding = (5..5 + u64::from(ARRAY_TASKS))
                .filter(|&n| s.job(JobId(n)).is_some_and(|j| j.phase.holds_quota()))
                .count() as u64;
            assert!(
                holding <= u64::from(ARRAY_MAX_RUNNING),
                "{holding} at {e:?}"
            );
            assert!(s
                .array_slots(5)
                .is_none_or(|a| a.taken <= ARRAY_MAX_RUNNING));
            peak = peak.max(holding);
        }
        assert_eq!(peak, a[0].peak_holding_quota);
        s.check_invariants().unwrap();
        assert_eq!(s.state_hash(), sim.state().state_hash());

        // Each failed prep's train was cancelled by JobDependencyFailed
        // naming it, and that train's eval naming the train.
        let failed: Vec<JobId> = log
            .iter()
            .filter_map(|e| match e {
                Event::JobFinished {
                    job,
                    outcome: Outcome::Failed,
                    ..
                } => Some(*job),
                _ => None,
            })
            .collect();
        assert_eq!(failed.len(), FAILING_PREPS);
        let cancelled = |job: JobId, dependency: JobId| {
            log.iter().any(|e| {
                matches!(e, Event::JobDependencyFailed { job: j, dependency: d, .. }
                    if *j == job && *d == dependency)
            })
        };
        for prep in failed {
            let (train, eval, cleanup) = (JobId(prep.0 + 1), JobId(prep.0 + 2), JobId(prep.0 + 3));
            assert_eq!(s.job(train).unwrap().spec.after_ok, vec![prep]);
            assert!(
                cancelled(train, prep),
                "train {train} of failed prep {prep}"
            );
            assert!(
                cancelled(eval, train),
                "eval {eval} of cancelled train {train}"
            );
            assert_eq!(s.job(train).unwrap().first_started_at, None);
            assert_eq!(s.job(cleanup).unwrap().phase, Phase::Succeeded);
        }
    }

    #[test]
    fn the_pipeline_scenario_is_deterministic() {
        use crate::Report;
        let report = |sim: &crate::Simulator| {
            let mut v = serde_json::to_value(Report::build(sim, String::new())).ok();
            // Wall-clock measurements vary from run to run.
            if let Some(m) = v.as_mut().and_then(|v| v.as_object_mut()) {
                for k in ["wall_s", "decisions_per_s", "cycle", "victim_search"] {
                    m.remove(k);
                }
            }
            v
        };
        let (a, b) = (run_pipeline(1), run_pipeline(1));
        assert_eq!(a.log(), b.log());
        assert_eq!(report(&a), report(&b));
        assert!(report(&a).is_some_and(|r| r["gates"].is_object()));
        assert_ne!(a.state().state_hash(), run_pipeline(2).state().state_hash());
    }
}
