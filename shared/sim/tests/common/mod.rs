//! What the simulator's test files share.
#![allow(dead_code, clippy::unwrap_used)]

use gpusched_sim::{Cluster, SimOptions, Simulator, Workload};

/// Runs `w` on `cluster` to its end, keeping every event.
pub fn run(cluster: &Cluster, w: Workload) -> Simulator {
    let opts = SimOptions {
        cycle: cluster.cycle,
        until: None,
        record_events: true,
        restore_ms: 0,
    };
    let mut sim = Simulator::new(cluster, w, opts).unwrap();
    sim.run(&mut |_| {}).unwrap();
    sim
}
