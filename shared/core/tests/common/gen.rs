//! The property suites' generators, written once: random clusters of two
//! flavors (`a`, `b`) in racks and blocks, tenants with quotas, and jobs.
//!
//! Each suite keeps its own distribution (`properties.rs` weighs fair
//! share and larger quotas, `preemption_properties.rs` priority
//! preemption, checkpoints and max runtimes): it passes the strategies
//! that differ, and a suite that does not vary a field passes `Just` its
//! default, which draws nothing, so each suite's cases (and its saved
//! regression seeds) stay what they were.

use super::{job, tenant, Driver};
use gpusched_events::{Event, QueueState};
use gpusched_model::{CheckpointPolicy, JobSpec};
use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;

/// The topology levels a job may ask for, by `JobGen::topology`.
pub const TOPOLOGIES: [&str; 4] = ["node", "block", "rack", "any"];

/// One flavor's quota of a tenant.
#[derive(Clone, Debug)]
pub struct QuotaGen {
    pub nominal: u32,
    pub borrowing: Option<u32>,
    pub lending: Option<u32>,
}

/// A tenant: `t{i}` by its place in the suite's list.
#[derive(Clone, Debug)]
pub struct TenantGen {
    pub cohort: Option<u8>,
    pub weight: u8,
    pub best_effort: bool,
    pub priority_preemption: bool,
    pub a: QuotaGen,
    pub b: Option<QuotaGen>,
}

/// A cluster of `racks` × `blocks_per_rack` × `nodes_per_block` nodes.
#[derive(Clone, Debug)]
pub struct ClusterGen {
    pub racks: u32,
    pub blocks_per_rack: u32,
    pub nodes_per_block: u32,
    /// Per block: GPUs per node (4 or 8) and whether its flavor is `b`.
    pub blocks: Vec<(u32, bool)>,
}

/// A job of tenant `t{tenant % tenants}`.
#[derive(Clone, Debug)]
pub struct JobGen {
    pub tenant: usize,
    pub workers: u32,
    pub gpw: u32,
    pub topology: usize,
    pub priority: i32,
    /// 0: any flavor; 1: `a` only; 2: `b`, then `a`.
    pub flavors: u8,
    pub preemptible: bool,
    /// (interval, duration) in seconds.
    pub checkpoint: Option<(u64, u64)>,
    pub max_runtime_s: Option<u64>,
}

/// A quota: nominal and borrowing limit from these ranges (the limit may be
/// absent), the lending limit as `lending` draws it.
pub fn quota(
    nominal: std::ops::RangeInclusive<u32>,
    borrowing: std::ops::RangeInclusive<u32>,
    lending: BoxedStrategy<Option<u32>>,
) -> impl Strategy<Value = QuotaGen> {
    (nominal, proptest::option::of(borrowing), lending).prop_map(|(nominal, borrowing, lending)| {
        QuotaGen {
            nominal,
            borrowing,
            lending,
        }
    })
}

/// How a suite draws its tenants.
pub struct TenantMix {
    /// In cohort `c0` or `c1` with this probability, else in none.
    pub in_cohort: f64,
    pub weight: BoxedStrategy<u8>,
    pub priority_preemption: BoxedStrategy<bool>,
    pub quota: BoxedStrategy<QuotaGen>,
    /// The chance of a quota in flavor `b` too.
    pub second_flavor: f64,
}

/// A tenant drawn from `mix`.
pub fn tenant_gen(mix: TenantMix) -> impl Strategy<Value = TenantGen> {
    (
        proptest::option::weighted(mix.in_cohort, 0u8..2),
        mix.weight,
        any::<bool>(),
        mix.priority_preemption,
        mix.quota.clone(),
        proptest::option::weighted(mix.second_flavor, mix.quota),
    )
        .prop_map(
            |(cohort, weight, best_effort, priority_preemption, a, b)| TenantGen {
                cohort,
                weight,
                best_effort,
                priority_preemption,
                a,
                b,
            },
        )
}

/// A cluster: 1–2 racks, 1–`max_blocks` blocks a rack, 1–`max_nodes`
/// nodes a block; a block is of flavor `b` with probability `flavor_b`.
pub fn cluster_gen(
    max_blocks: u32,
    max_nodes: u32,
    flavor_b: f64,
) -> impl Strategy<Value = ClusterGen> {
    (
        1u32..=2,
        1u32..=max_blocks,
        1u32..=max_nodes,
        proptest::collection::vec(
            (
                prop_oneof![Just(4u32), Just(8u32)],
                proptest::bool::weighted(flavor_b),
            ),
            6,
        ),
    )
        .prop_map(
            |(racks, blocks_per_rack, nodes_per_block, blocks)| ClusterGen {
                racks,
                blocks_per_rack,
                nodes_per_block,
                blocks,
            },
        )
}

/// What a job needs besides its shape, as a suite draws it.
pub struct JobExtras {
    pub preemptible: BoxedStrategy<bool>,
    pub checkpoint: BoxedStrategy<Option<(u64, u64)>>,
    pub max_runtime_s: BoxedStrategy<Option<u64>>,
}

impl JobExtras {
    /// Preemptible, no checkpoint, no declared max runtime: draws nothing.
    pub fn none() -> Self {
        JobExtras {
            preemptible: Just(true).boxed(),
            checkpoint: Just(None).boxed(),
            max_runtime_s: Just(None).boxed(),
        }
    }
}

/// A job: 1–4 workers of 1, 2, 4 or 8 GPUs, priority 0–`max_priority`.
pub fn job_gen(max_priority: i32, extras: JobExtras) -> impl Strategy<Value = JobGen> {
    (
        (
            0usize..8,
            1u32..=4,
            prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
            0usize..4,
            0i32..=max_priority,
            prop_oneof![6 => Just(0u8), 1 => Just(1), 1 => Just(2)],
        ),
        (extras.preemptible, extras.checkpoint, extras.max_runtime_s),
    )
        .prop_map(
            |(
                (tenant, workers, gpw, topology, priority, flavors),
                (preemptible, checkpoint, max_runtime_s),
            )| JobGen {
                tenant,
                workers,
                gpw,
                topology,
                priority,
                flavors,
                preemptible,
                checkpoint,
                max_runtime_s,
            },
        )
}

impl JobGen {
    /// The job's specification among `tenants` tenants.
    pub fn spec(&self, tenants: usize) -> JobSpec {
        let mut spec = job(
            &format!("t{}", self.tenant % tenants),
            self.workers,
            self.gpw,
            TOPOLOGIES[self.topology],
        );
        spec.priority = self.priority;
        spec.preemptible = self.preemptible;
        spec.checkpoint = self
            .checkpoint
            .map(|(interval_s, duration_s)| CheckpointPolicy {
                interval_s,
                duration_s,
            });
        spec.max_runtime_s = self.max_runtime_s;
        spec.flavors = match self.flavors {
            0 => vec![],
            1 => vec!["a".into()],
            _ => vec!["b".into(), "a".into()],
        };
        spec
    }
}

/// Builds the cluster (rack/block topology) and the tenants `t0`, `t1`, …
pub fn setup(d: &mut Driver, c: &ClusterGen, tenants: &[TenantGen]) {
    d.apply(Event::TopologyConfigured {
        levels: vec!["rack".into(), "block".into()],
    });
    for r in 0..c.racks {
        for b in 0..c.blocks_per_rack {
            let (gpus, flavor_b) = c.blocks[(r * c.blocks_per_rack + b) as usize];
            let flavor = if flavor_b { "b" } else { "a" };
            for _ in 0..c.nodes_per_block {
                d.add_node(&format!("r{r}"), &format!("b{b}"), gpus, flavor);
            }
        }
    }
    for (i, t) in tenants.iter().enumerate() {
        let mut tb = tenant(&format!("t{i}")).weight(t.weight as f64);
        tb.0.priority_preemption = t.priority_preemption;
        if let Some(c) = t.cohort {
            tb = tb.cohort(&format!("c{c}"));
        }
        if t.best_effort {
            tb = tb.best_effort();
        }
        for (flavor, q) in [("a", Some(&t.a)), ("b", t.b.as_ref())] {
            let Some(q) = q else { continue };
            tb = tb.quota(flavor, q.nominal);
            if let Some(l) = q.borrowing {
                tb = tb.borrowing(l);
            }
            if let Some(l) = q.lending {
                tb = tb.lending(l);
            }
        }
        d.tenant(tb);
    }
}

/// The queue states an admin may set, by index.
pub const QUEUE_STATES: [QueueState; 4] = [
    QueueState::Open,
    QueueState::Held,
    QueueState::Draining,
    QueueState::Stopped,
];

/// An admin's operation, drawn by the suites that mix them in.
#[derive(Clone, Copy, Debug)]
pub enum AdminOp {
    /// Tenant `t{0 % n}`'s queue to `QUEUE_STATES[1 % 4]`.
    Queue(usize, usize),
    /// Node `0 % nodes` evicted for maintenance.
    Evict(usize),
}

/// Admin operations, queue changes three times as often as evictions.
pub fn admin_op_gen() -> impl Strategy<Value = AdminOp> {
    prop_oneof![
        3 => (any::<usize>(), 0usize..4).prop_map(|(t, s)| AdminOp::Queue(t, s)),
        1 => any::<usize>().prop_map(AdminOp::Evict),
    ]
}

/// Applies an admin operation. A queue set to the state it is in is not
/// written (the gateway answers 409); an eviction of a node already
/// evicted or lost must be refused without changing anything.
pub fn admin(d: &mut Driver, tenants: usize, op: AdminOp) {
    match op {
        AdminOp::Queue(t, s) => {
            let name = format!("t{}", t % tenants.max(1));
            let state = QUEUE_STATES[s % 4];
            let now = d.state.tenant_idx(&name).map(|i| d.state.tenant(i).queue);
            if now.is_some_and(|q| q != state) {
                let at = d.now;
                d.apply(Event::QueueStateSet {
                    tenant: name,
                    state,
                    at,
                });
            }
        }
        AdminOp::Evict(n) => {
            let nodes = d.state.nodes().len().max(1);
            let at = d.now;
            let _ = d.try_apply(Event::NodeEvicted {
                node: gpusched_model::NodeId((n % nodes) as u32),
                at,
            });
        }
    }
}

/// The `sel`-th of `v`, wrapping; `None` when `v` is empty.
pub fn pick<T: Copy>(v: &[T], sel: usize) -> Option<T> {
    (!v.is_empty()).then(|| v[sel % v.len()])
}
