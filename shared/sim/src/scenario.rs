//! Built-in scenarios: a cluster and a workload that show one behaviour.
//!
//! Owns: `reclaim` — a borrower fills an idle cluster with long,
//! checkpointing training jobs; three hours later the quota owner returns
//! and must reclaim its share by preemption. `maintenance` — the same two
//! tenants while an admin holds, drains and stops their queues and evicts
//! nodes for maintenance.
//!
//! Must never: decide anything about scheduling.

use crate::cluster::Cluster;
use crate::workload::{Workload, WorkloadItem, WorkloadKind};
use gpusched_events::QueueState;
use gpusched_model::{CheckpointPolicy, JobSpec, Timestamp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The reclaim scenario's cluster: 512 H100s (2 racks × 4 blocks × 8 nodes
/// × 8 GPUs); tenants `research` (the owner) and `batch` (the borrower),
/// 256 GPUs nominal each, in one cohort.
pub const RECLAIM_CLUSTER: &str = r#"
[topology]
levels = ["rack", "block"]

[scheduler]
max_heads = 256
reservations = 4

[[node_group]]
flavor = "h100-80g"
shape = [2, 4]
nodes_per_leaf = 8
gpus_per_node = 8

[[tenant]]
name = "research"
cohort = "lab"
queueing = "best-effort-fifo"
quotas = [{ flavor = "h100-80g", nominal = 256 }]

[[tenant]]
name = "batch"
cohort = "lab"
queueing = "best-effort-fifo"
quotas = [{ flavor = "h100-80g", nominal = 256 }]
"#;

fn job(
    tenant: &str,
    workers: u32,
    topology: &str,
    checkpoint: Option<CheckpointPolicy>,
) -> JobSpec {
    JobSpec {
        tenant: tenant.into(),
        priority: 0,
        workers,
        gpus_per_worker: 8,
        flavors: vec![],
        topology: topology.into(),
        preemptible: true,
        checkpoint,
        max_runtime_s: None,
        command: Vec::new(),
        env: Default::default(),
        working_dir: None,
        checkpoint_signal: None,
        array: None,
        after_ok: Vec::new(),
        after: Vec::new(),
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
    let cluster = match Cluster::parse(RECLAIM_CLUSTER, "reclaim scenario") {
        Ok(c) => c,
        Err(e) => unreachable!("the reclaim scenario's cluster is checked by tests: {e}"),
    };
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
    items.sort_by_key(|i| i.at);
    let workload = Workload {
        items,
        description: format!(
            "reclaim scenario (seed {seed}): batch fills the idle cluster with 100 × 1×8 GPU, 12 h jobs checkpointing every 20/30/45 min (1 in 5 never); research returns at 3 h with 8 × 1×8 and 2 × 4×8 block gangs, and 8 × 1×8 more at 3.5 h"
        ),
    };
    (cluster, workload)
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
    items.sort_by_key(|i| i.at);
    let workload = Workload {
        items,
        description: format!(
            "maintenance scenario (seed {seed}): batch fills the cluster with 100 × 1×8 GPU, 12 h checkpointing jobs; research submits a 1×8, 1 h job every 5 min for 10 h; research held 1 h–1.5 h, 4 nodes evicted at 2 h, research drained 3 h–3.5 h, batch stopped 5 h–7 h"
        ),
    };
    (cluster, workload)
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
        use crate::{Report, SimOptions, Simulator};
        let (c, w) = maintenance(1);
        let opts = SimOptions {
            cycle: c.cycle,
            until: None,
            record_events: true,
            restore_ms: 0,
        };
        let mut sim = Simulator::new(&c, w, opts).unwrap();
        sim.run(&mut |_| {}).unwrap();
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
}
