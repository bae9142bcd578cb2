//! gpusched events: every fact and decision, named in the past tense.
//!
//! Owns: the `Event` enum, the reasons a job waits or is refused
//! (`PendingReason`, `RejectReason`) and which stage may write which kind
//! (`Event::producer`).
//!
//! Must never: change state (that is `gpusched-core`'s `State::apply`),
//! perform I/O, or reorder or remove enum variants: encodings by position
//! (postcard) depend on the order, so new variants are only ever appended.

pub mod binary;

use gpusched_model::{
    CohortSpec, Gpus, JobId, JobSpec, NodeId, NodeSpec, Place, TenantSpec, Timestamp,
};
use serde::{Deserialize, Serialize};
use std::fmt;

/// GPUs of one job on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Assignment {
    /// The node.
    pub node: NodeId,
    /// GPUs taken on it (a whole number of workers).
    pub gpus: Gpus,
}

/// Why a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Ran to completion.
    Succeeded,
    /// Exited with an error.
    Failed,
    /// Stopped because its user cancelled it (after a final checkpoint
    /// when it checkpoints).
    Cancelled,
    /// Stopped by its agent for running past its declared maximum runtime
    /// (after a checkpoint when it checkpoints). The job has ended.
    TimedOut,
}

/// How one worker of a job ended, as its node agent saw it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerExit {
    /// The worker's rank in the gang.
    pub rank: u32,
    /// Its exit code, if it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

impl fmt::Display for WorkerExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "worker {} exited with code {c}", self.rank),
            (None, Some(s)) => write!(f, "worker {} was killed by signal {s}", self.rank),
            (None, None) => write!(f, "worker {} ended", self.rank),
        }
    }
}

/// Why a job holding quota or GPUs went back to its queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum RequeueReason {
    /// A node it ran on was lost.
    NodeLost {
        /// The lost node.
        node: NodeId,
    },
    /// Its tenant's queue was stopped while it was admitted and not yet
    /// bound: it gives its quota back and waits in the queue.
    QueueStopped {
        /// The tenant.
        tenant: String,
    },
}

/// Why a job is not running yet. Data, not prose: `explain` renders it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PendingReason {
    /// The tenant's own limit in its flavor stops it: usage plus the job
    /// would exceed nominal plus borrowing limit.
    QuotaExceeded {
        /// Flavor (the job's most preferred).
        flavor: String,
        /// GPUs the tenant uses in that flavor.
        used: Gpus,
        /// The tenant's nominal quota there.
        nominal: Gpus,
        /// GPUs it may still borrow (borrowing limit left, capped by what the cohort lends).
        borrowable: Gpus,
        /// GPUs the job needs.
        need: Gpus,
    },
    /// The cohort has no more lendable quota in the flavor.
    CohortExhausted {
        /// Flavor (the job's most preferred).
        flavor: String,
        /// Cohort name.
        cohort: String,
        /// GPUs the tenant uses in that flavor.
        used: Gpus,
        /// The tenant's nominal quota there.
        nominal: Gpus,
        /// GPUs the cohort can still lend.
        lendable_left: Gpus,
        /// GPUs the job needs.
        need: Gpus,
    },
    /// Admitted, but no domain of the asked level has room for the gang now.
    NoDomainFits {
        /// Flavor it was admitted to.
        flavor: String,
        /// Topology level asked.
        level: String,
        /// Workers × GPUs per worker.
        workers: u32,
        /// GPUs per worker.
        gpus_per_worker: Gpus,
        /// Most free GPUs in any one domain of that level.
        largest_free: Gpus,
    },
    /// Strict FIFO: waiting behind the tenant's blocked head.
    BehindHead {
        /// The blocked head of the queue.
        head: JobId,
    },
    /// Not in its tenant's queue yet: jobs it depends on have not ended
    /// as it requires.
    WaitingForJobs {
        /// Those that must still succeed (`after_ok`).
        after_ok: Vec<JobId>,
        /// Those that must still end, however (`after`).
        after: Vec<JobId>,
    },
    /// A task of an array with a limit: as many of its tasks as the limit
    /// allows are queued or running; it joins the queue when one ends.
    ArrayLimit {
        /// The array.
        array: u64,
        /// Its limit (`%N`).
        limit: u32,
    },
    /// A job it must run after (`after_ok`) ended without succeeding: it
    /// will never run, and is being cancelled.
    DependencyFailed {
        /// That job.
        dependency: JobId,
    },
    /// The tenant spent its GPU-hour budget in the flavor for this period,
    /// and its policy is to wait for the next.
    BudgetSpent {
        /// Flavor (the job's most preferred).
        flavor: String,
        /// GPU-hours the budget allows per period.
        gpu_hours: u64,
        /// The period: `day`, `week` or `month`.
        period: String,
        /// When the next period begins.
        renews_at: Timestamp,
    },
}

impl PendingReason {
    /// A short stable name of the reason's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            PendingReason::QuotaExceeded { .. } => "quota_exceeded",
            PendingReason::CohortExhausted { .. } => "cohort_exhausted",
            PendingReason::NoDomainFits { .. } => "no_domain_fits",
            PendingReason::BehindHead { .. } => "behind_head",
            PendingReason::WaitingForJobs { .. } => "waiting_for_jobs",
            PendingReason::ArrayLimit { .. } => "array_limit",
            PendingReason::DependencyFailed { .. } => "dependency_failed",
            PendingReason::BudgetSpent { .. } => "budget_spent",
        }
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::QuotaExceeded { flavor, used, nominal, borrowable, need } => write!(
                f,
                "quota exceeded in {flavor}: uses {used} of nominal {nominal}, may borrow {borrowable} more, needs {need}"
            ),
            PendingReason::CohortExhausted { flavor, cohort, used, nominal, lendable_left, need } => write!(
                f,
                "cohort {cohort} has {lendable_left} GPUs of {flavor} left to lend; tenant uses {used} of nominal {nominal}, needs {need}"
            ),
            PendingReason::NoDomainFits { flavor, level, workers, gpus_per_worker, largest_free } => {
                let place = Place::of(level);
                let (within, one) = (place.within(), place.one());
                write!(
                    f,
                    "no room for {workers}×{gpus_per_worker} GPUs of {flavor} {within}; {one} has at most {largest_free} free"
                )
            }
            PendingReason::BehindHead { head } => write!(f, "strict FIFO: behind blocked head job {head}"),
            PendingReason::WaitingForJobs { after_ok, after } => {
                let list = |jobs: &[JobId]| {
                    let names: Vec<String> = jobs.iter().map(|j| format!("job {j}")).collect();
                    names.join(", ")
                };
                match (after_ok.is_empty(), after.is_empty()) {
                    (false, true) => write!(f, "waits for {} to succeed (after_ok)", list(after_ok)),
                    (true, _) => write!(f, "waits for {} to end (after)", list(after)),
                    (false, false) => write!(
                        f,
                        "waits for {} to succeed (after_ok) and {} to end (after)",
                        list(after_ok),
                        list(after)
                    ),
                }
            }
            PendingReason::ArrayLimit { array, limit } => write!(
                f,
                "array {array} is at its limit of tasks queued or running at once (%{limit}); this task joins the queue when one of them ends"
            ),
            PendingReason::DependencyFailed { dependency } => write!(
                f,
                "job {dependency}, which it runs after (after_ok), ended without succeeding; this job will never run and is being cancelled"
            ),
            PendingReason::BudgetSpent { flavor, gpu_hours, period, .. } => write!(
                f,
                "budget spent: the tenant used its {gpu_hours} GPU-hours of {flavor} for this {period}; it waits for the next {period}"
            ),
        }
    }
}

/// Why a submission was refused. Every variant names what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RejectReason {
    /// A field broke a rule.
    InvalidField {
        /// The field.
        field: String,
        /// The rule.
        rule: String,
    },
    /// No such tenant.
    UnknownTenant {
        /// The name given.
        tenant: String,
    },
    /// No such flavor in the cluster or tenant.
    UnknownFlavor {
        /// The name given.
        flavor: String,
    },
    /// No such topology level.
    UnknownLevel {
        /// The name given.
        level: String,
    },
    /// The gang fits in no domain of the asked level in any acceptable flavor,
    /// even with the whole cluster idle.
    GangTooLarge {
        /// Level asked.
        level: String,
        /// GPUs asked.
        need: Gpus,
        /// The most a single domain of that level could hold for this shape.
        largest_domain: Gpus,
    },
    /// The job needs more than the tenant may ever use in any acceptable flavor.
    ExceedsQuotaLimit {
        /// GPUs asked.
        need: Gpus,
        /// The tenant's nominal + borrowing limit in its best flavor.
        limit: Gpus,
    },
    /// The same job id was submitted twice.
    DuplicateJob,
    /// The tenant's queue is draining or stopped: it takes no new jobs.
    QueueClosed {
        /// The tenant.
        tenant: String,
        /// Its queue's state.
        state: QueueState,
    },
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::InvalidField { field, rule } => write!(f, "{field}: {rule}"),
            RejectReason::UnknownTenant { tenant } => {
                write!(f, "tenant: unknown tenant {tenant:?}")
            }
            RejectReason::UnknownFlavor { flavor } => {
                write!(f, "flavors: unknown flavor {flavor:?}")
            }
            RejectReason::UnknownLevel { level } => write!(f, "topology: unknown level {level:?}"),
            RejectReason::GangTooLarge {
                level,
                need,
                largest_domain,
            } => {
                let place = Place::of(level);
                let (nowhere, one) = (place.nowhere(), place.one());
                write!(
                    f,
                    "workers: a gang of {need} GPUs fits {nowhere}; {one} holds at most {largest_domain} for this shape"
                )
            }
            RejectReason::ExceedsQuotaLimit { need, limit } => write!(
                f,
                "workers: gang of {need} GPUs exceeds the tenant's quota limit of {limit}"
            ),
            RejectReason::DuplicateJob => write!(f, "job id already used"),
            RejectReason::QueueClosed { tenant, state } => write!(
                f,
                "tenant: queue {tenant} is {state} and takes no new jobs until it is released"
            ),
        }
    }
}

/// Why a preemption was planned.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PreemptionCause {
    /// A quota owner reclaims quota lent to borrowers in its cohort.
    Reclaim {
        /// The owner's tenant.
        tenant: String,
        /// The flavor reclaimed.
        flavor: String,
        /// GPUs of lent quota that had to be freed.
        quota_deficit: Gpus,
    },
    /// A higher-priority job of the same tenant evicts lower ones.
    Priority {
        /// The tenant.
        tenant: String,
        /// The flavor.
        flavor: String,
    },
    /// A reservation's nodes are needed now; preemptible backfill leaves.
    Reservation,
}

/// What a tenant's queue lets through, as its admin last set it.
///
/// | state | new submissions | queued jobs admitted | running jobs |
/// |---|---|---|---|
/// | `open` | accepted | yes | run |
/// | `held` | accepted | no | run |
/// | `draining` | refused | no | run to their end |
/// | `stopped` | refused | no | evicted with the checkpoint protocol, borrowed ones first |
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Jobs are admitted (every queue starts so).
    #[default]
    Open,
    /// Nothing new is admitted; submissions still queue.
    Held,
    /// Nothing new is admitted or accepted; running jobs finish.
    Draining,
    /// As draining, and running jobs are evicted.
    Stopped,
}

impl QueueState {
    /// Whether queued jobs may be admitted.
    pub fn admits(self) -> bool {
        self == QueueState::Open
    }
    /// Whether new submissions are accepted into the queue.
    pub fn accepts(self) -> bool {
        matches!(self, QueueState::Open | QueueState::Held)
    }
    /// Its name, as the API and the log write it.
    pub fn name(self) -> &'static str {
        match self {
            QueueState::Open => "open",
            QueueState::Held => "held",
            QueueState::Draining => "draining",
            QueueState::Stopped => "stopped",
        }
    }
}

impl fmt::Display for QueueState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why running jobs are evicted with no job to make room for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum EvictionCause {
    /// The tenant's queue was stopped.
    QueueStopped {
        /// The tenant.
        tenant: String,
    },
    /// The node is being emptied for maintenance.
    NodeEvicted {
        /// The node.
        node: NodeId,
    },
}

/// One victim of a planned preemption.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Victim {
    /// The victim job.
    pub job: JobId,
    /// When it is stopped at the latest (it stops earlier on a complete checkpoint).
    pub deadline: Timestamp,
    /// Expected GPU-milliseconds of work lost, as costed.
    pub expected_lost_gpu_ms: u64,
    /// The cost the planner charged (lost work + restart + thrash penalty).
    pub cost: u64,
}

/// A complete checkpoint a job can resume from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckpointRef {
    /// Milliseconds of work it captures.
    pub progress_ms: u64,
    /// Where it is stored.
    pub uri: String,
}

/// The thing an event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Aggregate {
    /// A job.
    Job(JobId),
    /// A node.
    Node(NodeId),
    /// A tenant, by name.
    Tenant(String),
    /// A cohort, by name.
    Cohort(String),
    /// Cluster-wide configuration (the topology levels).
    Cluster,
}

/// Which part of gpusched may write an event kind (docs/architecture.md, "Crates").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Producer {
    /// Operator configuration (tenants, topology).
    Admin,
    /// The API gateway (submissions, cancellations).
    Gateway,
    /// Validation against policy and cluster shape.
    Admission,
    /// Quota ledger and fair-share order.
    Quota,
    /// The only GPU allocator.
    Placement,
    /// Victim choice and eviction.
    Preemption,
    /// Node agents: facts, not decisions.
    Agent,
}

/// Everything that ever changes scheduler state.
///
/// Variants are only appended, never reordered or removed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Event {
    /// Topology level names, outermost first; the node level is implied.
    /// Must come before the first node.
    TopologyConfigured {
        /// Level names, e.g. `["rack", "block"]`.
        levels: Vec<String>,
    },
    /// A tenant was created or its configuration replaced.
    TenantConfigured {
        /// The full configuration.
        spec: TenantSpec,
    },
    /// A node joined the cluster.
    NodeAdded {
        /// Its id: the number of nodes added before it.
        node: NodeId,
        /// What the agent reported.
        spec: NodeSpec,
        /// When.
        at: Timestamp,
    },
    /// No new work may be placed on the node.
    NodeCordoned {
        /// The node.
        node: NodeId,
    },
    /// The node takes new work again.
    NodeUncordoned {
        /// The node.
        node: NodeId,
    },
    /// Cordoned for maintenance; running jobs finish, then it stays empty.
    NodeDrained {
        /// The node.
        node: NodeId,
    },
    /// The node is gone; its jobs must be requeued.
    NodeLost {
        /// The node.
        node: NodeId,
        /// When it was noticed.
        at: Timestamp,
    },
    /// A user submitted a job.
    JobSubmitted {
        /// The job's id.
        job: JobId,
        /// What was asked.
        spec: JobSpec,
        /// When.
        at: Timestamp,
    },
    /// The job passed validation and joined its tenant's queue.
    JobAccepted {
        /// The job.
        job: JobId,
    },
    /// The job was refused at submission.
    JobRejected {
        /// The job.
        job: JobId,
        /// Why.
        reason: RejectReason,
    },
    /// Quota was charged to the job in a flavor.
    JobAdmitted {
        /// The job.
        job: JobId,
        /// The flavor chosen.
        flavor: String,
        /// GPUs of the charge above the tenant's nominal quota.
        borrowed: Gpus,
        /// When.
        at: Timestamp,
    },
    /// A stage could not move the job on; `explain` reads this.
    JobPending {
        /// The job.
        job: JobId,
        /// Why.
        reason: PendingReason,
        /// When.
        at: Timestamp,
    },
    /// GPUs on specific nodes were allocated to the whole gang.
    JobBound {
        /// The job.
        job: JobId,
        /// GPUs per node.
        assignments: Vec<Assignment>,
        /// Backfilled onto nodes reserved for this job: it either ends before
        /// the reservation starts or is preemptible and leaves when it does.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        backfill_for: Option<JobId>,
        /// When.
        at: Timestamp,
    },
    /// The agent started every worker.
    JobStarted {
        /// The job.
        job: JobId,
        /// When.
        at: Timestamp,
    },
    /// The job exited.
    JobFinished {
        /// The job.
        job: JobId,
        /// How.
        outcome: Outcome,
        /// When.
        at: Timestamp,
        /// How its workers ended, where real node agents ran them (empty for
        /// a simulated agent).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        exits: Vec<WorkerExit>,
        /// Why it failed, in words, when that is more than exit codes (a
        /// command that could not start).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The user cancelled the job.
    JobCancelled {
        /// The job.
        job: JobId,
        /// When.
        at: Timestamp,
    },
    /// The user cancelled a job holding GPUs; its agent stops it (after a
    /// final checkpoint when it checkpoints) and reports
    /// `JobFinished { outcome: Cancelled }`. The GPUs stay held until then.
    JobCancelRequested {
        /// The job.
        job: JobId,
        /// When.
        at: Timestamp,
    },
    /// The job lost its GPUs and went back to its queue.
    JobRequeued {
        /// The job.
        job: JobId,
        /// Why.
        reason: RequeueReason,
        /// GPU-milliseconds of work lost (since the last complete checkpoint).
        lost_gpu_ms: u64,
        /// When.
        at: Timestamp,
    },
    /// The agent reports a complete checkpoint (a partial one is never reported).
    JobCheckpointed {
        /// The job.
        job: JobId,
        /// Milliseconds of work the checkpoint captures.
        progress_ms: u64,
        /// Where it is stored.
        uri: String,
        /// When it completed.
        at: Timestamp,
    },
    /// Victims were chosen to make room for a beneficiary; each gets a
    /// checkpoint request and stops at its deadline or on a complete checkpoint.
    PreemptionPlanned {
        /// The job that needs the room.
        beneficiary: JobId,
        /// Why.
        cause: PreemptionCause,
        /// The victims.
        victims: Vec<Victim>,
        /// GPUs held for the beneficiary once the victims are gone (empty when
        /// only quota, not room, was missing).
        reserve: Vec<Assignment>,
        /// When.
        at: Timestamp,
    },
    /// A victim was stopped and requeued; it resumes from `resume_from`.
    JobPreempted {
        /// The job.
        job: JobId,
        /// GPU-milliseconds of work lost since its last complete checkpoint.
        lost_gpu_ms: u64,
        /// The complete checkpoint it will resume from, if any.
        resume_from: Option<CheckpointRef>,
        /// When.
        at: Timestamp,
    },
    /// Nodes are held for a blocked job from `start` (when the running jobs'
    /// declared max runtimes guarantee it; `None`: not guaranteed).
    ReservationMade {
        /// The job.
        job: JobId,
        /// GPUs held per node.
        assignments: Vec<Assignment>,
        /// Guaranteed start, if any.
        start: Option<Timestamp>,
        /// When.
        at: Timestamp,
    },
    /// A lost node's agent registered again: the node takes work again,
    /// empty (its old jobs were requeued when it was lost).
    NodeRejoined {
        /// The node.
        node: NodeId,
        /// When.
        at: Timestamp,
    },
    /// An admin set a tenant's queue's state (hold, release, drain, stop).
    QueueStateSet {
        /// The tenant.
        tenant: String,
        /// The queue's new state.
        state: QueueState,
        /// When.
        at: Timestamp,
    },
    /// For maintenance: the node is cordoned and every job on it is
    /// evicted with the checkpoint protocol; it stays cordoned once empty.
    NodeEvicted {
        /// The node.
        node: NodeId,
        /// When.
        at: Timestamp,
    },
    /// Running jobs are evicted with no job waiting on them (a stopped
    /// queue, a node emptied for maintenance): each gets a checkpoint
    /// request and stops at its deadline or on a complete checkpoint, then
    /// goes back to its queue.
    EvictionPlanned {
        /// Why.
        cause: EvictionCause,
        /// The victims.
        victims: Vec<Victim>,
        /// When.
        at: Timestamp,
    },
    /// A job that waited on another (`after_ok`) is cancelled because that
    /// one ended without succeeding: it can never become eligible.
    JobDependencyFailed {
        /// The job cancelled.
        job: JobId,
        /// The job it waited on.
        dependency: JobId,
        /// When.
        at: Timestamp,
    },
    /// A cohort's own settings were set or replaced (its members are the
    /// tenants that name it).
    CohortConfigured {
        /// The settings.
        spec: CohortSpec,
        /// When: members' decayed use is brought up to this time under the
        /// old half-life before the new one applies.
        at: Timestamp,
    },
    /// A tenant's GPU-hours in a flavor reached its budget for the period:
    /// its budget's policy (`when_spent`) applies to its jobs there until
    /// the period ends.
    BudgetSpent {
        /// The tenant.
        tenant: String,
        /// The flavor.
        flavor: String,
        /// The start of the period whose budget was spent.
        period_start: Timestamp,
        /// When.
        at: Timestamp,
    },
    /// A new period began for a tenant whose budget in a flavor was spent:
    /// its jobs there are served as before.
    BudgetRenewed {
        /// The tenant.
        tenant: String,
        /// The flavor.
        flavor: String,
        /// The start of the new period.
        period_start: Timestamp,
        /// When.
        at: Timestamp,
    },
}

/// Every event kind ([`Event::kind`]), in the order the variants are
/// declared: `KINDS[i]` is the kind whose binary form has variant index
/// `i` (`binary`'s tests check both). Only appended to, like `Event`.
pub const KINDS: [&str; 30] = [
    "topology_configured",
    "tenant_configured",
    "node_added",
    "node_cordoned",
    "node_uncordoned",
    "node_drained",
    "node_lost",
    "job_submitted",
    "job_accepted",
    "job_rejected",
    "job_admitted",
    "job_pending",
    "job_bound",
    "job_started",
    "job_finished",
    "job_cancelled",
    "job_cancel_requested",
    "job_requeued",
    "job_checkpointed",
    "preemption_planned",
    "job_preempted",
    "reservation_made",
    "node_rejoined",
    "queue_state_set",
    "node_evicted",
    "eviction_planned",
    "job_dependency_failed",
    "cohort_configured",
    "budget_spent",
    "budget_renewed",
];

/// The kinds that end a job for good ([`Event::ends_job`]).
pub const ENDING_KINDS: [&str; 4] = [
    "job_finished",
    "job_cancelled",
    "job_rejected",
    "job_dependency_failed",
];

impl Event {
    /// The stage allowed to write this kind (docs/architecture.md, "Crates").
    pub fn producer(&self) -> Producer {
        use Event::*;
        match self {
            TopologyConfigured { .. }
            | TenantConfigured { .. }
            | NodeCordoned { .. }
            | NodeUncordoned { .. }
            | NodeDrained { .. }
            | QueueStateSet { .. }
            | NodeEvicted { .. }
            | CohortConfigured { .. } => Producer::Admin,
            NodeAdded { .. }
            | NodeLost { .. }
            | NodeRejoined { .. }
            | JobStarted { .. }
            | JobFinished { .. } => Producer::Agent,
            JobSubmitted { .. } | JobCancelled { .. } | JobCancelRequested { .. } => {
                Producer::Gateway
            }
            JobAccepted { .. } | JobRejected { .. } | JobDependencyFailed { .. } => {
                Producer::Admission
            }
            JobAdmitted { .. } | BudgetSpent { .. } | BudgetRenewed { .. } => Producer::Quota,
            JobPending { reason, .. } => match reason {
                PendingReason::NoDomainFits { .. } => Producer::Placement,
                _ => Producer::Quota,
            },
            JobBound { .. } => Producer::Placement,
            JobRequeued { .. }
            | PreemptionPlanned { .. }
            | JobPreempted { .. }
            | EvictionPlanned { .. } => Producer::Preemption,
            JobCheckpointed { .. } => Producer::Agent,
            ReservationMade { .. } => Producer::Placement,
        }
    }

    /// A short stable name of the kind, e.g. `job_bound`.
    pub fn kind(&self) -> &'static str {
        use Event::*;
        match self {
            TopologyConfigured { .. } => "topology_configured",
            TenantConfigured { .. } => "tenant_configured",
            NodeAdded { .. } => "node_added",
            NodeCordoned { .. } => "node_cordoned",
            NodeUncordoned { .. } => "node_uncordoned",
            NodeDrained { .. } => "node_drained",
            NodeLost { .. } => "node_lost",
            JobSubmitted { .. } => "job_submitted",
            JobAccepted { .. } => "job_accepted",
            JobRejected { .. } => "job_rejected",
            JobAdmitted { .. } => "job_admitted",
            JobPending { .. } => "job_pending",
            JobBound { .. } => "job_bound",
            JobStarted { .. } => "job_started",
            JobFinished { .. } => "job_finished",
            JobCancelled { .. } => "job_cancelled",
            JobCancelRequested { .. } => "job_cancel_requested",
            JobRequeued { .. } => "job_requeued",
            JobCheckpointed { .. } => "job_checkpointed",
            PreemptionPlanned { .. } => "preemption_planned",
            JobPreempted { .. } => "job_preempted",
            ReservationMade { .. } => "reservation_made",
            NodeRejoined { .. } => "node_rejoined",
            QueueStateSet { .. } => "queue_state_set",
            NodeEvicted { .. } => "node_evicted",
            EvictionPlanned { .. } => "eviction_planned",
            JobDependencyFailed { .. } => "job_dependency_failed",
            CohortConfigured { .. } => "cohort_configured",
            BudgetSpent { .. } => "budget_spent",
            BudgetRenewed { .. } => "budget_renewed",
        }
    }

    /// What this event is about. Exhaustive on purpose: a new variant does
    /// not compile until its aggregate is chosen.
    pub fn aggregate(&self) -> Aggregate {
        use Event::*;
        match self {
            TopologyConfigured { .. } => Aggregate::Cluster,
            TenantConfigured { spec } => Aggregate::Tenant(spec.name.clone()),
            CohortConfigured { spec, .. } => Aggregate::Cohort(spec.name.clone()),
            NodeAdded { node, .. }
            | NodeCordoned { node }
            | NodeUncordoned { node }
            | NodeDrained { node }
            | NodeLost { node, .. }
            | NodeRejoined { node, .. }
            | NodeEvicted { node, .. } => Aggregate::Node(*node),
            QueueStateSet { tenant, .. }
            | BudgetSpent { tenant, .. }
            | BudgetRenewed { tenant, .. } => Aggregate::Tenant(tenant.clone()),
            EvictionPlanned { cause, .. } => match cause {
                EvictionCause::QueueStopped { tenant } => Aggregate::Tenant(tenant.clone()),
                EvictionCause::NodeEvicted { node } => Aggregate::Node(*node),
            },
            JobSubmitted { job, .. }
            | JobAccepted { job }
            | JobRejected { job, .. }
            | JobAdmitted { job, .. }
            | JobPending { job, .. }
            | JobBound { job, .. }
            | JobStarted { job, .. }
            | JobFinished { job, .. }
            | JobCancelled { job, .. }
            | JobCancelRequested { job, .. }
            | JobRequeued { job, .. }
            | JobCheckpointed { job, .. }
            | JobPreempted { job, .. }
            | ReservationMade { job, .. }
            | JobDependencyFailed { job, .. } => Aggregate::Job(*job),
            PreemptionPlanned { beneficiary, .. } => Aggregate::Job(*beneficiary),
        }
    }

    /// Whether this event ends its job for good: finished, cancelled (by
    /// its user or for a failed dependency) or rejected.
    pub fn ends_job(&self) -> bool {
        ENDING_KINDS.contains(&self.kind())
    }

    /// When this event happened, if it carries a time.
    pub fn at(&self) -> Option<Timestamp> {
        use Event::*;
        match self {
            NodeAdded { at, .. }
            | NodeLost { at, .. }
            | NodeRejoined { at, .. }
            | JobSubmitted { at, .. }
            | JobAdmitted { at, .. }
            | JobPending { at, .. }
            | JobBound { at, .. }
            | JobStarted { at, .. }
            | JobFinished { at, .. }
            | JobCancelled { at, .. }
            | JobCancelRequested { at, .. }
            | JobRequeued { at, .. }
            | JobCheckpointed { at, .. }
            | PreemptionPlanned { at, .. }
            | JobPreempted { at, .. }
            | ReservationMade { at, .. }
            | QueueStateSet { at, .. }
            | NodeEvicted { at, .. }
            | EvictionPlanned { at, .. }
            | JobDependencyFailed { at, .. }
            | CohortConfigured { at, .. }
            | BudgetSpent { at, .. }
            | BudgetRenewed { at, .. } => Some(*at),
            TopologyConfigured { .. }
            | TenantConfigured { .. }
            | NodeCordoned { .. }
            | NodeUncordoned { .. }
            | NodeDrained { .. }
            | JobAccepted { .. }
            | JobRejected { .. } => None,
        }
    }

    /// The job this event is about, if any.
    pub fn job(&self) -> Option<JobId> {
        match self.aggregate() {
            Aggregate::Job(j) => Some(j),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_tagged_and_readable() {
        let e = Event::JobBound {
            job: JobId(7),
            assignments: vec![Assignment {
                node: NodeId(3),
                gpus: 8,
            }],
            backfill_for: None,
            at: Timestamp(1000),
        };
        let s = serde_json::to_string(&e).unwrap();
        assert_eq!(
            s,
            r#"{"type":"job_bound","job":7,"assignments":[{"node":3,"gpus":8}],"at":1000}"#
        );
        let back: Event = serde_json::from_str(&s).unwrap();
        assert_eq!(back, e);
        assert_eq!(e.kind(), "job_bound");
        assert_eq!(e.producer(), Producer::Placement);
    }

    #[test]
    fn reasons_render_their_numbers() {
        let r = PendingReason::QuotaExceeded {
            flavor: "h100".into(),
            used: 16,
            nominal: 16,
            borrowable: 0,
            need: 8,
        };
        let s = r.to_string();
        assert!(
            s.contains("16 of nominal 16") && s.contains("needs 8"),
            "{s}"
        );
    }
}
