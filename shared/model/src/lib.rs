//! The gpusched domain model: the nouns every other crate speaks.
//!
//! Owns: identifiers, time, node, tenant (queue) and job specifications,
//! priority classes and topology requirements, plus the field-level
//! validation of a specification on its own.
//!
//! Must never: hold scheduler state, perform I/O, read a clock, or decide
//! anything. Decisions live in `gpusched-core`; facts and decisions travel
//! as `gpusched-events`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

mod array;
mod budget;
pub mod positional;
pub use array::{
    parse_array_indices, parse_array_set, ArrayIndicesError, ArraySet, ArrayTask, MAX_ARRAY_INDEX,
    MAX_ARRAY_TASKS,
};
pub use budget::{Budget, BudgetPeriod, WhenSpent, MAX_BUDGET_GPU_HOURS};

/// A count of GPUs.
pub type Gpus = u32;

/// A job's identity, unique for the life of an event log.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A node's identity: its position in the order nodes were added.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The node's position, usable as a vector index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// A point in time, in milliseconds. Real services use milliseconds since the
/// Unix epoch; the simulator uses milliseconds of virtual time since its start.
/// The core never reads a clock: time is always passed in.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// A timestamp from whole seconds.
    pub fn from_secs(s: u64) -> Self {
        Timestamp(s.saturating_mul(1000))
    }
    /// Whole seconds, rounded down.
    pub fn as_secs(self) -> u64 {
        self.0 / 1000
    }
    /// Seconds as a float.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
    /// This time plus `s` seconds.
    pub fn plus_secs(self, s: u64) -> Self {
        Timestamp(self.0.saturating_add(s.saturating_mul(1000)))
    }
}

/// The topology level a gang must fit inside.
///
/// `Any` means anywhere in one flavor's pool, `Node` means a single node;
/// the levels in between are named by the cluster's topology (by default
/// `rack` then `block`).
pub const LEVEL_ANY: &str = "any";
/// The innermost topology level: one node.
pub const LEVEL_NODE: &str = "node";

/// A topology level as messages name it: [`LEVEL_ANY`] is the whole
/// cluster, [`LEVEL_NODE`] one node, any other level a domain by its name
/// (`rack`). The one place a level becomes words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place<'a> {
    /// The whole cluster (one flavor's pool).
    Cluster,
    /// One node.
    Node,
    /// One domain of a named level.
    Level(&'a str),
}

impl<'a> Place<'a> {
    /// The place a gang of `level` must fit inside.
    pub fn of(level: &'a str) -> Self {
        match level {
            LEVEL_ANY => Place::Cluster,
            LEVEL_NODE => Place::Node,
            l => Place::Level(l),
        }
    }

    /// Where a gang must fit, after its GPU count: `anywhere in the
    /// cluster`, `on one node`, `in one rack`.
    pub fn within(self) -> String {
        match self {
            Place::Cluster => "anywhere in the cluster".to_string(),
            Place::Node => "on one node".to_string(),
            Place::Level(l) => format!("in one {l}"),
        }
    }

    /// Where it fits nowhere: `nowhere in the cluster`, `on no node`, `in
    /// no rack`.
    pub fn nowhere(self) -> String {
        match self {
            Place::Cluster => "nowhere in the cluster".to_string(),
            Place::Node => "on no node".to_string(),
            Place::Level(l) => format!("in no {l}"),
        }
    }

    /// One domain of it, as a subject: `the whole cluster`, `one node`,
    /// `one rack`.
    pub fn one(self) -> String {
        match self {
            Place::Cluster => "the whole cluster".to_string(),
            Place::Node => "one node".to_string(),
            Place::Level(l) => format!("one {l}"),
        }
    }
}

/// Default topology level names, outermost first (the node level is implied).
pub const DEFAULT_LEVELS: [&str; 2] = ["rack", "block"];

/// How a tenant's queue treats a head it cannot admit.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum QueueingMode {
    /// A blocked head blocks every job behind it.
    #[default]
    StrictFifo,
    /// A job behind a blocked head may pass it when it fits.
    BestEffortFifo,
}

/// A tenant's quota in one GPU flavor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FlavorQuota {
    /// GPU flavor name, e.g. `h100-80g`.
    #[schema(min_length = 1)]
    pub flavor: String,
    /// GPUs the tenant is entitled to.
    #[schema(value_type = u32, format = Int64, maximum = 1_000_000_u64)]
    pub nominal: Gpus,
    /// GPUs the tenant may use above nominal, borrowed from its cohort;
    /// `None` is unlimited (bounded by the cohort).
    #[serde(default)]
    #[schema(value_type = Option<u32>, format = Int64, maximum = 1_000_000_u64)]
    pub borrowing_limit: Option<Gpus>,
    /// GPUs of its nominal quota the tenant lends to its cohort when idle;
    /// `None` lends all of it.
    #[serde(default)]
    #[schema(value_type = Option<u32>, format = Int64, maximum = 1_000_000_u64)]
    pub lending_limit: Option<Gpus>,
    /// GPU-hours the tenant may use of this flavor per calendar period;
    /// `None` is no budget.
    #[serde(default)]
    pub budget: Option<Budget>,
}

impl FlavorQuota {
    /// A quota of `nominal` GPUs of `flavor`, with every other field as a
    /// configuration that leaves it out gets it (borrowing and lending
    /// unlimited, no budget).
    pub fn new(flavor: impl Into<String>, nominal: Gpus) -> Self {
        FlavorQuota {
            flavor: flavor.into(),
            nominal,
            borrowing_limit: None,
            lending_limit: None,
            budget: None,
        }
    }

    /// The part of nominal quota lendable to the cohort.
    pub fn lendable(&self) -> Gpus {
        self.lending_limit
            .map_or(self.nominal, |l| l.min(self.nominal))
    }
}

/// A tenant: one queue with quotas inside a cohort.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Unique tenant name.
    #[schema(min_length = 1)]
    pub name: String,
    /// Cohort sharing unused quota; `None` neither lends nor borrows.
    #[serde(default)]
    pub cohort: Option<String>,
    /// Fair-share weight among borrowers (> 0).
    #[serde(default = "default_weight")]
    #[schema(exclusive_minimum = 0.0, default = 1.0)]
    pub weight: f64,
    /// Strict or best-effort FIFO.
    #[serde(default)]
    pub queueing: QueueingMode,
    /// Quota per flavor; a flavor not listed cannot be used by this tenant.
    #[serde(default)]
    pub quotas: Vec<FlavorQuota>,
    /// Whether a higher-priority job of this tenant may evict a lower one.
    #[serde(default = "default_true")]
    pub priority_preemption: bool,
}

fn default_weight() -> f64 {
    1.0
}
fn default_true() -> bool {
    true
}

/// The longest usage half-life a cohort may have: ten years, in seconds.
pub const MAX_USAGE_HALF_LIFE_S: u64 = 10 * 366 * 24 * 3600;

/// A cohort's own settings (its members name it in `TenantSpec.cohort`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CohortSpec {
    /// The cohort's name, as its tenants give it.
    #[schema(min_length = 1)]
    pub name: String,
    /// Seconds over which a member's past GPU use counts half as much:
    /// borrowers are served lowest decayed use per weight first. `0` (the
    /// default) orders them by the share they borrow now.
    #[serde(default)]
    #[schema(maximum = 316_224_000_u64)]
    pub usage_half_life_s: u64,
}

impl CohortSpec {
    /// Field-level checks.
    pub fn check_fields(&self) -> Result<(), FieldError> {
        if self.name.trim().is_empty() {
            return Err(FieldError::new("name", "must not be empty"));
        }
        if self.usage_half_life_s > MAX_USAGE_HALF_LIFE_S {
            return Err(FieldError::new(
                "usage_half_life_s",
                "must be at most 316224000 (ten years)",
            ));
        }
        Ok(())
    }
}

/// A named priority value, as in Kubernetes PriorityClass or Slurm QOS.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorityClass {
    /// Class name, e.g. `production`.
    pub name: String,
    /// Priority value; higher runs first.
    pub value: i32,
}

/// A node as registered by its agent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Unique node name.
    pub name: String,
    /// GPU flavor of every GPU on the node.
    pub flavor: String,
    /// GPUs on the node.
    pub gpus: Gpus,
    /// Topology path, outermost level first (e.g. `["rack-3", "block-1"]`),
    /// one entry per configured level.
    pub path: Vec<String>,
}

/// How a job checkpoints.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointPolicy {
    /// Seconds between checkpoint starts.
    #[schema(minimum = 1)]
    pub interval_s: u64,
    /// Seconds one checkpoint takes to complete.
    pub duration_s: u64,
}

/// What a user submits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Tenant (queue) the job runs under.
    #[schema(min_length = 1)]
    pub tenant: String,
    /// Priority; higher runs first within a tenant.
    #[serde(default)]
    pub priority: i32,
    /// Workers in the gang (all start together or none does).
    #[schema(minimum = 1, format = Int64, maximum = 4_294_967_295_u64)]
    pub workers: u32,
    /// GPUs each worker needs on one node.
    #[schema(value_type = u32, minimum = 1, format = Int64, maximum = 4_294_967_295_u64)]
    pub gpus_per_worker: Gpus,
    /// Acceptable flavors, most preferred first; empty means the tenant's
    /// flavors in the tenant's order.
    #[serde(default)]
    pub flavors: Vec<String>,
    /// Topology level the whole gang must fit inside (`node`, a level name
    /// such as `block` or `rack`, or `any`).
    #[serde(default = "default_topology")]
    pub topology: String,
    /// Whether the job may be preempted.
    #[serde(default = "default_true")]
    pub preemptible: bool,
    /// Checkpoint policy, if the job checkpoints.
    #[serde(default)]
    pub checkpoint: Option<CheckpointPolicy>,
    /// Declared maximum runtime in seconds, if any.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_runtime_s: Option<u64>,
    /// What each worker runs: the program and its arguments (argv). Empty
    /// for a job played by a simulated agent; a real node agent fails a job
    /// without one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment added to each worker's (gpusched's own variables win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory of each worker on its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The signal that asks the job for a checkpoint (`SIGUSR1` when unset):
    /// a name such as `SIGUSR2` or `USR2`, or a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_signal: Option<String>,
    /// Its place in a job array, when it is one of an array's tasks. The
    /// gateway sets it when it writes an array's tasks; a job submitted on
    /// its own may not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayTask>,
    /// Jobs of the same tenant that must all have succeeded before this
    /// one may be admitted; if one ends otherwise, this job is cancelled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<u64>, max_items = 64)]
    pub after_ok: Vec<JobId>,
    /// Jobs of the same tenant that must all have ended, however, before
    /// this one may be admitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<u64>, max_items = 64)]
    pub after: Vec<JobId>,
}

/// Most dependencies (`after_ok` and `after` together) one job may name.
pub const MAX_DEPENDENCIES: usize = 64;

/// How a job depends on another.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DependencyKind {
    /// The other job must succeed (`after_ok`).
    AfterOk,
    /// The other job must end, however (`after`).
    After,
}

impl DependencyKind {
    /// The spec field that names it.
    pub fn field(self) -> &'static str {
        match self {
            DependencyKind::AfterOk => "after_ok",
            DependencyKind::After => "after",
        }
    }
}

impl JobSpec {
    /// A gang of `workers` × `gpus_per_worker` GPUs for `tenant`, every
    /// other field as a submission that leaves it out gets it (priority 0,
    /// the tenant's flavors, topology `any`, preemptible, no checkpoints,
    /// no command).
    pub fn new(tenant: impl Into<String>, workers: u32, gpus_per_worker: Gpus) -> Self {
        JobSpec {
            tenant: tenant.into(),
            priority: 0,
            workers,
            gpus_per_worker,
            flavors: Vec::new(),
            topology: default_topology(),
            preemptible: true,
            checkpoint: None,
            max_runtime_s: None,
            command: Vec::new(),
            env: BTreeMap::new(),
            working_dir: None,
            checkpoint_signal: None,
            array: None,
            after_ok: Vec::new(),
            after: Vec::new(),
        }
    }

    /// Its dependencies, `after_ok` first, each with how it depends.
    pub fn dependencies(&self) -> impl Iterator<Item = (JobId, DependencyKind)> + '_ {
        let ok = self.after_ok.iter().map(|&j| (j, DependencyKind::AfterOk));
        ok.chain(self.after.iter().map(|&j| (j, DependencyKind::After)))
    }
}

/// Signal names a job may ask to be checkpointed with, and their numbers
/// (Linux).
pub const CHECKPOINT_SIGNALS: [(&str, i32); 6] = [
    ("SIGUSR1", 10),
    ("SIGUSR2", 12),
    ("SIGHUP", 1),
    ("SIGINT", 2),
    ("SIGTERM", 15),
    ("SIGQUIT", 3),
];

/// The checkpoint signal's number, from a name (`SIGUSR2`, `USR2`,
/// `sigusr2`) or a number; `None` when it is not one jobs may use.
pub fn checkpoint_signal_number(spec: Option<&str>) -> Option<i32> {
    let Some(raw) = spec else {
        return Some(CHECKPOINT_SIGNALS[0].1);
    };
    let name = raw.trim().to_ascii_uppercase();
    if let Ok(n) = name.parse::<i32>() {
        return CHECKPOINT_SIGNALS
            .iter()
            .find(|(_, num)| *num == n)
            .map(|(_, num)| *num);
    }
    let full = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    CHECKPOINT_SIGNALS
        .iter()
        .find(|(n, _)| *n == full)
        .map(|(_, num)| *num)
}

fn default_topology() -> String {
    LEVEL_ANY.to_string()
}

impl JobSpec {
    /// GPUs the whole gang needs.
    pub fn total_gpus(&self) -> Gpus {
        self.workers.saturating_mul(self.gpus_per_worker)
    }

    /// Field-level checks that need no cluster knowledge.
    pub fn check_fields(&self) -> Result<(), FieldError> {
        if self.tenant.trim().is_empty() {
            return Err(FieldError::new("tenant", "must not be empty"));
        }
        if self.workers == 0 {
            return Err(FieldError::new("workers", "must be at least 1"));
        }
        if self.gpus_per_worker == 0 {
            return Err(FieldError::new("gpus_per_worker", "must be at least 1"));
        }
        if self.workers.checked_mul(self.gpus_per_worker).is_none() {
            return Err(FieldError::new(
                "workers",
                "workers × gpus_per_worker overflows",
            ));
        }
        if let Some(c) = &self.checkpoint {
            if c.interval_s == 0 {
                return Err(FieldError::new(
                    "checkpoint.interval_s",
                    "must be at least 1",
                ));
            }
        }
        if self.max_runtime_s == Some(0) {
            return Err(FieldError::new("max_runtime_s", "must be at least 1"));
        }
        if self.command.first().is_some_and(|c| c.trim().is_empty()) {
            return Err(FieldError::new("command", "the program must not be empty"));
        }
        if self
            .env
            .keys()
            .any(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(FieldError::new(
                "env",
                "names must be non-empty, without '=' or NUL",
            ));
        }
        if checkpoint_signal_number(self.checkpoint_signal.as_deref()).is_none() {
            return Err(FieldError::new(
                "checkpoint_signal",
                "must be one of SIGUSR1, SIGUSR2, SIGHUP, SIGINT, SIGTERM, SIGQUIT",
            ));
        }
        if self.flavors.iter().any(|f| f.trim().is_empty()) {
            return Err(FieldError::new("flavors", "must not contain empty names"));
        }
        if self.array.is_some_and(|a| a.max_running == Some(0)) {
            return Err(FieldError::new("array.max_running", "must be at least 1"));
        }
        self.check_dependency_fields()
    }

    /// At most [`MAX_DEPENDENCIES`], none named twice.
    fn check_dependency_fields(&self) -> Result<(), FieldError> {
        if self.after_ok.len() + self.after.len() > MAX_DEPENDENCIES {
            let field = if self.after_ok.len() > self.after.len() {
                "after_ok"
            } else {
                "after"
            };
            return Err(FieldError::new(
                field,
                &format!("a job may wait on at most {MAX_DEPENDENCIES} jobs"),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (job, kind) in self.dependencies() {
            if !seen.insert(job) {
                return Err(FieldError::new(
                    kind.field(),
                    &format!("job {job} is named twice"),
                ));
            }
        }
        Ok(())
    }
}

/// The most GPUs a quota, borrowing limit or lending limit may name in a
/// new configuration: far above any cluster, and low enough that sums over
/// a cohort's tenants stay within [`Gpus`].
pub const MAX_QUOTA_GPUS: Gpus = 1_000_000;

impl TenantSpec {
    /// A tenant named `name` with `quotas`, with every other field as a
    /// configuration that leaves it out gets it (no cohort, weight 1,
    /// strict FIFO, priority preemption on).
    pub fn new(name: impl Into<String>, quotas: Vec<FlavorQuota>) -> Self {
        TenantSpec {
            name: name.into(),
            cohort: None,
            weight: default_weight(),
            queueing: QueueingMode::default(),
            quotas,
            priority_preemption: default_true(),
        }
    }

    /// [`TenantSpec::check_fields`], and every quota, borrowing limit and
    /// lending limit at most [`MAX_QUOTA_GPUS`]: the checks a new
    /// configuration passes (the gateway, the CLI, cluster files). The log
    /// applies only `check_fields`, so that a configuration an older
    /// release took still replays.
    pub fn check_new(&self) -> Result<(), FieldError> {
        self.check_fields()?;
        for q in &self.quotas {
            let limits = [
                ("quotas.nominal", Some(q.nominal)),
                ("quotas.borrowing_limit", q.borrowing_limit),
                ("quotas.lending_limit", q.lending_limit),
            ];
            for (field, gpus) in limits {
                if gpus.is_some_and(|g| g > MAX_QUOTA_GPUS) {
                    return Err(FieldError::new(
                        field,
                        &format!("must be at most {MAX_QUOTA_GPUS} GPUs"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Field-level checks that need no cluster knowledge.
    pub fn check_fields(&self) -> Result<(), FieldError> {
        if self.name.trim().is_empty() {
            return Err(FieldError::new("name", "must not be empty"));
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return Err(FieldError::new("weight", "must be a finite number > 0"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for q in &self.quotas {
            if !seen.insert(q.flavor.as_str()) {
                return Err(FieldError::new("quotas.flavor", "listed twice"));
            }
            if q.flavor.trim().is_empty() {
                return Err(FieldError::new("quotas.flavor", "must not be empty"));
            }
            if let Some(b) = &q.budget {
                b.check_fields("quotas.budget")?;
            }
        }
        Ok(())
    }
}

impl NodeSpec {
    /// A node `name` of `gpus` GPUs of `flavor` at topology `path`
    /// (outermost level first).
    pub fn new(
        name: impl Into<String>,
        flavor: impl Into<String>,
        gpus: Gpus,
        path: &[&str],
    ) -> Self {
        NodeSpec {
            name: name.into(),
            flavor: flavor.into(),
            gpus,
            path: path.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// Field-level checks against the number of configured topology levels.
    pub fn check_fields(&self, levels: usize) -> Result<(), FieldError> {
        if self.name.trim().is_empty() {
            return Err(FieldError::new("name", "must not be empty"));
        }
        if self.flavor.trim().is_empty() {
            return Err(FieldError::new("flavor", "must not be empty"));
        }
        if self.gpus == 0 {
            return Err(FieldError::new("gpus", "must be at least 1"));
        }
        if self.gpus > MAX_GPUS_PER_NODE {
            return Err(FieldError::new("gpus", "must be at most 64"));
        }
        if self.path.len() != levels {
            return Err(FieldError::new(
                "path",
                "must have one entry per configured topology level",
            ));
        }
        Ok(())
    }
}

/// Largest GPU count of one node the capacity index accepts.
pub const MAX_GPUS_PER_NODE: Gpus = 64;

/// A field that failed validation, and the rule it broke.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct FieldError {
    /// The field's name as the user wrote it.
    pub field: String,
    /// The rule it broke, in lowercase words.
    pub rule: String,
}

impl FieldError {
    /// A new field error.
    pub fn new(field: &str, rule: &str) -> Self {
        FieldError {
            field: field.to_string(),
            rule: rule.to_string(),
        }
    }
}

/// The 64-bit FNV-1a hash of `bytes`: stable across platforms and releases,
/// used to assign trace jobs to tenants and to key idempotent configuration.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            topology: "block".into(),
            ..JobSpec::new("a", 2, 4)
        }
    }

    #[test]
    fn a_new_quota_past_the_bound_names_its_field_but_the_log_still_takes_it() {
        let q = |nominal, borrowing_limit, lending_limit| {
            let quota = FlavorQuota {
                borrowing_limit,
                lending_limit,
                ..FlavorQuota::new("h100", nominal)
            };
            TenantSpec::new("t", vec![quota])
        };
        assert!(q(MAX_QUOTA_GPUS, Some(MAX_QUOTA_GPUS), None)
            .check_new()
            .is_ok());
        for (spec, field) in [
            (q(MAX_QUOTA_GPUS + 1, None, None), "quotas.nominal"),
            (q(8, Some(u32::MAX), None), "quotas.borrowing_limit"),
            (q(8, None, Some(MAX_QUOTA_GPUS + 1)), "quotas.lending_limit"),
        ] {
            assert_eq!(spec.check_new().unwrap_err().field, field);
            assert!(
                spec.check_fields().is_ok(),
                "an older log's {field} replays"
            );
        }
    }

    #[test]
    fn zero_gpus_names_the_field() {
        let mut s = spec();
        s.gpus_per_worker = 0;
        assert_eq!(s.check_fields().unwrap_err().field, "gpus_per_worker");
        let mut s = spec();
        s.workers = 0;
        assert_eq!(s.check_fields().unwrap_err().field, "workers");
        assert!(spec().check_fields().is_ok());
        assert_eq!(spec().total_gpus(), 8);
    }

    #[test]
    fn lendable_is_capped_by_nominal() {
        let q = FlavorQuota {
            lending_limit: Some(20),
            ..FlavorQuota::new("x", 8)
        };
        assert_eq!(q.lendable(), 8);
    }
}
