//! The benches' cluster and jobs: 10,000 nodes (40 racks × 10 blocks × 25
//! nodes × 8 GPUs), four tenants in one cohort, a deterministic job mix.
#![allow(dead_code)]

use gpusched_core::State;
use gpusched_events::Event;
use gpusched_model::{
    FlavorQuota, JobId, JobSpec, NodeId, NodeSpec, QueueingMode, TenantSpec, Timestamp,
};

pub const TENANTS: usize = 4;

pub fn job(i: u64, tenant: usize) -> JobSpec {
    // Deterministic size mix: mostly small, some 8-GPU, some 2×8 and 4×8 block gangs.
    let (workers, gpw, topology) = match i % 20 {
        0..=9 => (1, 1, "node"),
        10..=13 => (1, 2, "node"),
        14..=15 => (1, 4, "node"),
        16..=17 => (1, 8, "node"),
        18 => (2, 8, "block"),
        _ => (4, 8, "block"),
    };
    JobSpec {
        priority: (i % 3) as i32,
        topology: topology.into(),
        ..JobSpec::new(format!("team-{tenant}"), workers, gpw)
    }
}

pub fn cluster() -> State {
    let mut s = State::new();
    let mut id = 0;
    for r in 0..40 {
        for b in 0..10 {
            for n in 0..25 {
                let e = Event::NodeAdded {
                    node: NodeId(id),
                    spec: NodeSpec::new(
                        format!("r{r}-b{b}-n{n}"),
                        "h100-80g",
                        8,
                        &[&format!("r{r}"), &format!("b{b}")],
                    ),
                    at: Timestamp(0),
                };
                s.apply(&e).expect("node");
                id += 1;
            }
        }
    }
    for t in 0..TENANTS {
        let e = Event::TenantConfigured {
            spec: TenantSpec {
                cohort: Some("org".into()),
                queueing: if t % 2 == 0 {
                    QueueingMode::BestEffortFifo
                } else {
                    QueueingMode::StrictFifo
                },
                ..TenantSpec::new(
                    format!("team-{t}"),
                    vec![FlavorQuota::new("h100-80g", 20_000)],
                )
            },
        };
        s.apply(&e).expect("tenant");
    }
    s
}

pub fn submit(s: &mut State, next: &mut u64, n: usize) {
    for _ in 0..n {
        let i = *next;
        *next += 1;
        let spec = job(i, (i % TENANTS as u64) as usize);
        s.apply(&Event::JobSubmitted {
            job: JobId(i),
            spec,
            at: Timestamp(0),
        })
        .expect("submit");
        s.apply(&Event::JobAccepted { job: JobId(i) })
            .expect("accept");
    }
}
