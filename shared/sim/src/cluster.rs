//! Cluster files: topology, nodes, tenants and cycle limits in TOML.
//!
//! Owns: parsing a cluster file and turning it into the configuration
//! events (`TopologyConfigured`, `NodeAdded`, `TenantConfigured`) a fresh
//! state is built from. The built-in demo cluster is `docs/clusters/demo.toml`.
//!
//! Must never: decide anything about scheduling.

use gpusched_core::CycleConfig;
use gpusched_events::Event;
use gpusched_model::{CohortSpec, NodeId, NodeSpec, PriorityClass, TenantSpec, Timestamp};
use serde::Deserialize;
use std::path::Path;

/// The built-in demo cluster's TOML.
pub const DEMO_CLUSTER: &str = include_str!("../../../docs/clusters/demo.toml");

/// A cluster file that could not be used; the message names the field.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown or mistyped fields.
    #[error("{source_name}: {message}")]
    Parse {
        /// Where it came from.
        source_name: String,
        /// What the parser said, with the field.
        message: String,
    },
    /// A value breaks a rule.
    #[error("{source_name}: {field}: {rule}")]
    Invalid {
        /// Where it came from.
        source_name: String,
        /// The field.
        field: String,
        /// The rule.
        rule: String,
    },
}

/// Topology section.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySection {
    /// Level names, outermost first.
    pub levels: Vec<String>,
}

/// Scheduler limits section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSection {
    /// K: heads examined per cycle.
    pub max_heads: Option<usize>,
    /// Depth of a best-effort queue searched per cycle.
    pub max_heads_per_tenant: Option<usize>,
    /// Submissions validated per cycle.
    pub max_validations: Option<usize>,
    /// R: blocked jobs holding a reservation at once (0 disables reservations and backfill).
    pub reservations: Option<usize>,
    /// Domains probed when planning one reservation.
    pub reservation_domains: Option<usize>,
    /// Seconds a victim gets before it is stopped.
    pub grace_s: Option<u64>,
    /// A checkpointable victim whose checkpoint takes at most this many
    /// seconds gets the time to complete one (0: never).
    pub max_checkpoint_grace_s: Option<u64>,
    /// Seconds a job runs before it may be preempted.
    pub min_runtime_s: Option<u64>,
    /// W: seconds within which a victim's next checkpoint may be waited for.
    pub wait_window_s: Option<u64>,
    /// Restart cost per GPU, seconds.
    pub restart_cost_s: Option<u64>,
    /// M: victim sets costed per beneficiary.
    pub max_victim_sets: Option<usize>,
    /// Candidate victims looked at per beneficiary.
    pub max_victim_candidates: Option<usize>,
    /// Seconds after which a blocked head of a best-effort queue stops being
    /// passed (0: never).
    pub starvation_s: Option<u64>,
}

/// A regular block of identical nodes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGroup {
    /// GPU flavor.
    pub flavor: String,
    /// Domains per named level, outermost first (e.g. `[racks, blocks per rack]`).
    pub shape: Vec<u32>,
    /// Nodes in each innermost domain.
    pub nodes_per_leaf: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// Node name prefix (default: the flavor).
    pub name_prefix: Option<String>,
}

/// One explicitly listed node.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    /// Name.
    pub name: String,
    /// GPU flavor.
    pub flavor: String,
    /// GPUs.
    pub gpus: u32,
    /// Topology path.
    pub path: Vec<String>,
}

/// A cluster file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Topology levels (default rack, block).
    pub topology: Option<TopologySection>,
    /// Cycle limits.
    #[serde(default)]
    pub scheduler: SchedulerSection,
    /// Regular node groups.
    #[serde(default)]
    pub node_group: Vec<NodeGroup>,
    /// Explicit nodes.
    #[serde(default)]
    pub node: Vec<NodeEntry>,
    /// Priority classes.
    #[serde(default)]
    pub priority_class: Vec<PriorityClass>,
    /// Tenants.
    #[serde(default)]
    pub tenant: Vec<TenantSpec>,
    /// Cohorts' own settings (a cohort its tenants name needs none).
    #[serde(default)]
    pub cohort: Vec<CohortSpec>,
}

/// A parsed, checked cluster: the events that build it and its limits.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Configuration events, in order.
    pub events: Vec<Event>,
    /// Tenant names, in file order.
    pub tenants: Vec<String>,
    /// Priority classes.
    pub priority_classes: Vec<PriorityClass>,
    /// Cycle limits.
    pub cycle: CycleConfig,
    /// GPUs per node of the first group or node (for workload derivation).
    pub gpus_per_node: u32,
    /// Nodes in all.
    pub nodes: usize,
    /// GPUs in all.
    pub gpus: u64,
}

impl Cluster {
    /// Reads a cluster file.
    pub fn load(path: &Path) -> Result<Cluster, ClusterError> {
        let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Cluster::parse(&text, &path.display().to_string())
    }

    /// The built-in demo cluster.
    pub fn demo() -> Cluster {
        match Cluster::parse(DEMO_CLUSTER, "built-in demo cluster") {
            Ok(c) => c,
            Err(e) => unreachable!("the built-in demo cluster is checked by tests: {e}"),
        }
    }

    /// Parses cluster TOML.
    pub fn parse(text: &str, source_name: &str) -> Result<Cluster, ClusterError> {
        let file: ClusterFile = toml::from_str(text).map_err(|e| ClusterError::Parse {
            source_name: source_name.to_string(),
            message: e.to_string(),
        })?;
        let invalid = |field: &str, rule: String| ClusterError::Invalid {
            source_name: source_name.to_string(),
            field: field.to_string(),
            rule,
        };
        let levels: Vec<String> = match &file.topology {
            Some(t) => t.levels.clone(),
            None => gpusched_model::DEFAULT_LEVELS
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        let mut events = vec![Event::TopologyConfigured {
            levels: levels.clone(),
        }];
        let mut specs = Vec::new();
        for (gi, g) in file.node_group.iter().enumerate() {
            if g.shape.len() != levels.len() {
                return Err(invalid(
                    &format!("node_group[{gi}].shape"),
                    format!("must have one count per level ({})", levels.join(", ")),
                ));
            }
            if g.shape.contains(&0) || g.nodes_per_leaf == 0 {
                return Err(invalid(
                    &format!("node_group[{gi}].shape"),
                    "counts must be at least 1".into(),
                ));
            }
            let prefix = g.name_prefix.clone().unwrap_or_else(|| g.flavor.clone());
            let leaves: u64 = g.shape.iter().map(|&c| c as u64).product();
            if leaves * g.nodes_per_leaf as u64 > 1_000_000 {
                return Err(invalid(
                    &format!("node_group[{gi}].shape"),
                    "more than 1,000,000 nodes".into(),
                ));
            }
            for leaf in 0..leaves {
                let mut rest = leaf;
                let mut idx = vec![0u64; g.shape.len()];
                for (i, &c) in g.shape.iter().enumerate().rev() {
                    idx[i] = rest % c as u64;
                    rest /= c as u64;
                }
                let path: Vec<String> = levels
                    .iter()
                    .zip(&idx)
                    .map(|(l, i)| format!("{l}-{i}"))
                    .collect();
                for n in 0..g.nodes_per_leaf {
                    let name = format!("{prefix}-{}-node-{n}", path.join("-"));
                    specs.push(NodeSpec {
                        name,
                        flavor: g.flavor.clone(),
                        gpus: g.gpus_per_node,
                        path: path.clone(),
                    });
                }
            }
        }
        for n in &file.node {
            specs.push(NodeSpec {
                name: n.name.clone(),
                flavor: n.flavor.clone(),
                gpus: n.gpus,
                path: n.path.clone(),
            });
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, s) in specs.iter().enumerate() {
            s.check_fields(levels.len())
                .map_err(|e| invalid(&format!("node {}: {}", s.name, e.field), e.rule))?;
            if !names.insert(s.name.clone()) {
                return Err(invalid("node.name", format!("{} is listed twice", s.name)));
            }
            events.push(Event::NodeAdded {
                node: NodeId(i as u32),
                spec: s.clone(),
                at: Timestamp(0),
            });
        }
        let mut tenants = Vec::new();
        for (ti, t) in file.tenant.iter().enumerate() {
            t.check_new()
                .map_err(|e| invalid(&format!("tenant[{ti}].{}", e.field), e.rule))?;
            if tenants.contains(&t.name) {
                return Err(invalid(
                    "tenant.name",
                    format!("{} is listed twice", t.name),
                ));
            }
            tenants.push(t.name.clone());
            events.push(Event::TenantConfigured { spec: t.clone() });
        }
        if tenants.is_empty() {
            return Err(invalid("tenant", "at least one tenant is needed".into()));
        }
        let mut cohorts = std::collections::BTreeSet::new();
        for (ci, c) in file.cohort.iter().enumerate() {
            c.check_fields()
                .map_err(|e| invalid(&format!("cohort[{ci}].{}", e.field), e.rule))?;
            if !cohorts.insert(c.name.as_str()) {
                return Err(invalid(
                    "cohort.name",
                    format!("{} is listed twice", c.name),
                ));
            }
            if !file
                .tenant
                .iter()
                .any(|t| t.cohort.as_deref() == Some(&c.name))
            {
                return Err(invalid(
                    &format!("cohort[{ci}].name"),
                    format!("no tenant is in cohort {}", c.name),
                ));
            }
            events.push(Event::CohortConfigured {
                spec: c.clone(),
                at: Timestamp(0),
            });
        }
        let d = CycleConfig::default();
        let s = &file.scheduler;
        // A setting in seconds, or the default in ms (never wrapping).
        let ms = |secs: Option<u64>, default: u64| secs.map_or(default, |x| x.saturating_mul(1000));
        let at_least_one = |v: Option<usize>, default: usize| v.unwrap_or(default).max(1);
        let p = &d.preemption;
        let cycle = CycleConfig {
            max_heads: at_least_one(s.max_heads, d.max_heads),
            max_heads_per_tenant: at_least_one(s.max_heads_per_tenant, d.max_heads_per_tenant),
            max_validations: at_least_one(s.max_validations, d.max_validations),
            reservations: s.reservations.unwrap_or(d.reservations),
            starvation_ms: ms(s.starvation_s, d.starvation_ms),
            reservation_domains: at_least_one(s.reservation_domains, d.reservation_domains),
            preemption: gpusched_core::PreemptionConfig {
                grace_ms: ms(s.grace_s, p.grace_ms),
                max_checkpoint_grace_ms: ms(s.max_checkpoint_grace_s, p.max_checkpoint_grace_ms),
                min_runtime_ms: ms(s.min_runtime_s, p.min_runtime_ms),
                wait_window_ms: ms(s.wait_window_s, p.wait_window_ms),
                restart_cost_ms: ms(s.restart_cost_s, p.restart_cost_ms),
                max_sets: at_least_one(s.max_victim_sets, p.max_sets),
                max_candidates: at_least_one(s.max_victim_candidates, p.max_candidates),
                ..d.preemption
            },
        };
        Ok(Cluster {
            events,
            tenants,
            priority_classes: file.priority_class.clone(),
            cycle,
            gpus_per_node: specs.first().map_or(8, |s| s.gpus),
            nodes: specs.len(),
            gpus: specs.iter().map(|s| s.gpus as u64).sum(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_cluster_parses() {
        let c = Cluster::demo();
        assert_eq!(c.nodes, 96);
        assert_eq!(c.gpus, 768);
        assert_eq!(c.tenants, vec!["vision", "language", "speech"]);
        let mut s = gpusched_core::State::new();
        for e in &c.events {
            s.apply(e).unwrap();
        }
        assert_eq!(s.nodes().len(), 96);
    }

    #[test]
    fn example_files_parse() {
        for f in ["1250x8.toml", "10k-nodes.toml"] {
            let p = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../docs/clusters")
                .join(f);
            Cluster::load(&p).unwrap();
        }
    }

    #[test]
    fn errors_name_the_field() {
        let e = Cluster::parse("[[node_group]]\nflavor='x'\nshape=[1]\nnodes_per_leaf=1\ngpus_per_node=8\n[[tenant]]\nname='a'\n", "t").unwrap_err();
        assert!(e.to_string().contains("node_group[0].shape"), "{e}");
        let e = Cluster::parse("[[tenant]]\nname='a'\nweight=0\n", "t").unwrap_err();
        assert!(e.to_string().contains("weight"), "{e}");
        let e = Cluster::parse("[[tenant]]\nname='a'\ncolor='red'\n", "t").unwrap_err();
        assert!(e.to_string().contains("color"), "{e}");
    }
}
