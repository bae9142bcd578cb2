//! The node agent service. With `--simulate` it plays a cluster: it
//! registers the cluster file's nodes and runs the jobs bound to them in
//! scaled real time ([`SimulatedAgent`]).
//!
//! For real nodes it holds the parts that run processes: `process` (the
//! operating-system side: worker processes in their own process groups,
//! their logs, checkpoint markers, orphan records) and `protocol` (what an
//! agent and the node relay say to each other over NATS).
//!
//! Owns: `NodeAdded`, `JobStarted`, `JobCheckpointed`, `JobFinished` for
//! its nodes. Must never: decide where or whether a job runs, or signal a
//! process it cannot prove is its worker.

pub mod gpus;
pub mod node;
pub mod node_health;
pub mod process;
pub mod relay;
pub mod relay_service;
pub mod simulated;

pub use gpusched_bus::node as protocol;
pub use gpusched_bus::node_net as net;

/// Lease and consumer name.
pub const SERVICE: &str = "agent";

use anyhow::Context;
use gpusched_events::Event;
use gpusched_sim::Cluster;
pub use simulated::{AgentConfig, SimulatedAgent};
use std::path::Path;

/// The cluster an agent simulates: a TOML file, or the demo cluster.
pub fn load_cluster(path: Option<&Path>) -> anyhow::Result<Cluster> {
    match path {
        Some(p) => Cluster::load(p).with_context(|| format!("--cluster {}", p.display())),
        None => Ok(Cluster::demo()),
    }
}

/// The simulated agent's configuration for every node of `cluster`.
pub fn agent_config(cluster: &Cluster, time_scale: f64, default_runtime_s: u64) -> AgentConfig {
    AgentConfig {
        nodes: cluster
            .events
            .iter()
            .filter_map(|e| match e {
                Event::NodeAdded { spec, .. } => Some(spec.clone()),
                _ => None,
            })
            .collect(),
        time_scale,
        default_runtime_s,
    }
}
