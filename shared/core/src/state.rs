//! Scheduler state and `State::apply`, the only way it changes.
//!
//! Owns: jobs and their phase, nodes, tenants with their queues and quota
//! usage, cohorts, the capacity index, and the versions that tell a cycle
//! what changed since it last looked.
//!
//! Must never: decide anything, read a clock, or accept an illegal
//! transition. `apply` checks an event completely before it changes
//! anything, so a refused event leaves the state untouched.

use crate::capacity::{cell, CapacityIndex, FlavorIdx};
use crate::quota_gpus::QuotaGpus;
use gpusched_events::{
    Assignment, CheckpointRef, Event, EvictionCause, Outcome, PendingReason, PreemptionCause,
    QueueState, RejectReason, RequeueReason, Victim,
};
use gpusched_model::{
    CohortSpec, FieldError, FlavorQuota, Gpus, JobId, JobSpec, NodeId, NodeSpec, TenantSpec,
    Timestamp, WhenSpent, LEVEL_ANY, LEVEL_NODE,
};
use rustc_hash::FxHashMap;

mod budget;
mod gates;
mod usage;
pub use budget::BudgetLedger;
pub use gates::{ArraySlots, Dependency};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
pub use usage::{mean_life_ms, DecayedUse};

/// Index of a tenant in the state's tenant table.
pub type TenantIdx = u32;
/// Index of a cohort in the state's cohort table.
pub type CohortIdx = u32;

/// Where a job is in its life (docs/architecture.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Submitted, not yet validated.
    Submitted,
    /// In its tenant's queue.
    Queued,
    /// Quota charged, waiting for GPUs.
    Admitted,
    /// GPUs allocated, not yet started.
    Bound,
    /// Running on its GPUs.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished with an error.
    Failed,
    /// Cancelled by its user.
    Cancelled,
    /// Refused at submission.
    Rejected,
    /// Chosen as a victim: checkpointing or waiting for its deadline.
    Preempting,
}

impl Phase {
    /// All phases, in order.
    pub const ALL: [Phase; 10] = [
        Phase::Submitted,
        Phase::Queued,
        Phase::Admitted,
        Phase::Bound,
        Phase::Running,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Cancelled,
        Phase::Rejected,
        Phase::Preempting,
    ];

    /// Its lowercase name, as the API, the CLI and explain write it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Submitted => "submitted",
            Phase::Queued => "queued",
            Phase::Admitted => "admitted",
            Phase::Bound => "bound",
            Phase::Running => "running",
            Phase::Succeeded => "succeeded",
            Phase::Failed => "failed",
            Phase::Cancelled => "cancelled",
            Phase::Rejected => "rejected",
            Phase::Preempting => "preempting",
        }
    }

    /// Whether the job has ended for good.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Phase::Succeeded | Phase::Failed | Phase::Cancelled | Phase::Rejected
        )
    }

    /// Whether the job holds GPUs.
    pub fn holds_gpus(self) -> bool {
        matches!(self, Phase::Bound | Phase::Running | Phase::Preempting)
    }

    /// Whether the job holds quota.
    pub fn holds_quota(self) -> bool {
        matches!(
            self,
            Phase::Admitted | Phase::Bound | Phase::Running | Phase::Preempting
        )
    }
}

/// A job's place in a queue: priority first, then order of arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QueueKey {
    /// Higher priority sorts first.
    pub priority: Reverse<i32>,
    /// Submit order (tenant queues) or admission order (placement queues).
    pub order: u64,
    /// The job.
    pub job: JobId,
}

/// A job as the scheduler knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// What was asked.
    #[serde(with = "gpusched_model::positional::job_spec")]
    pub spec: JobSpec,
    /// Where it is.
    pub phase: Phase,
    /// Its tenant, once accepted.
    pub tenant: Option<TenantIdx>,
    /// Topology level number, once accepted.
    pub level: u8,
    /// Acceptable flavors in preference order, once accepted.
    pub flavors: Vec<FlavorIdx>,
    /// Submit order.
    pub order: u64,
    /// When submitted.
    pub submitted_at: Timestamp,
    /// Flavor charged while admitted, bound or running.
    pub flavor: Option<FlavorIdx>,
    /// GPUs above nominal at admission.
    pub borrowed: Gpus,
    /// Placement order key while admitted.
    pub admit_order: u64,
    /// GPUs per node while bound or running.
    pub assignments: Vec<Assignment>,
    /// When it last started.
    pub started_at: Option<Timestamp>,
    /// When it first started.
    pub first_started_at: Option<Timestamp>,
    /// When it ended.
    pub ended_at: Option<Timestamp>,
    /// Times it started.
    pub starts: u32,
    /// Times it was requeued.
    pub requeues: u32,
    /// GPU-milliseconds of work lost to requeues.
    pub lost_gpu_ms: u64,
    /// The last reason a stage gave for not moving it on.
    #[serde(with = "crate::snapshot::json")]
    pub last_reason: Option<PendingReason>,
    /// Why it was rejected.
    #[serde(with = "crate::snapshot::json")]
    pub rejection: Option<RejectReason>,
    /// Its last complete checkpoint, kept across runs.
    pub last_checkpoint: Option<Checkpoint>,
    /// Work done when the current (or next) run starts, from its checkpoint.
    pub resume_progress_ms: u64,
    /// When it was last preempted.
    pub preempted_at: Option<Timestamp>,
    /// Times it was preempted.
    pub preemptions: u32,
    /// While preempting: the deadline and the beneficiary (`None`: evicted
    /// with no job to make room for, from a stopped queue or a node emptied
    /// for maintenance).
    pub preempt: Option<(Timestamp, Option<JobId>)>,
    /// When it was last chosen as a victim: only a checkpoint completed
    /// since then makes it ready to stop (one completed before, reported
    /// late, saved work but did not stop it).
    pub chosen_at: Option<Timestamp>,
    /// While bound or running on nodes reserved for another job: that job.
    pub backfill_for: Option<JobId>,
    /// When its user asked to cancel it while it held GPUs; it stops (after
    /// a final checkpoint when it checkpoints) and never runs again.
    pub cancel_requested: Option<Timestamp>,
    /// While queued: the jobs it depends on that have not ended yet.
    pub waiting_on: BTreeSet<JobId>,
    /// The `after_ok` dependency that ended without succeeding, which
    /// cancels it (kept once it is cancelled, for `explain`).
    pub failed_dependency: Option<JobId>,
    /// Holds one of its array's slots (a task of an array with a limit,
    /// from when it joins its tenant's queue until it ends).
    pub array_slot: bool,
}

/// The node of each worker of a gang, by rank: the workers of the first
/// assignment are ranks 0…k−1, those of the next follow, and so on. The one
/// rule every part (node relay, agents, the API's logs) numbers ranks by.
pub fn worker_nodes(assignments: &[Assignment], gpus_per_worker: Gpus) -> Vec<NodeId> {
    let per = gpus_per_worker.max(1);
    assignments
        .iter()
        .flat_map(|a| std::iter::repeat_n(a.node, (a.gpus / per) as usize))
        .collect()
}

/// A complete checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Work it captures, ms.
    pub progress_ms: u64,
    /// Where it is stored.
    pub uri: String,
    /// When it completed.
    pub at: Timestamp,
    /// Flavor it was taken on: the job resumes only on this flavor.
    pub flavor: FlavorIdx,
}

/// Nodes held for a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// GPUs held per node.
    pub assignments: Vec<Assignment>,
    /// Guaranteed start, if any.
    pub start: Option<Timestamp>,
    /// When made.
    pub made_at: Timestamp,
    /// Made for a preemption's beneficiary (else for a blocked job).
    pub for_preemption: bool,
    /// A job on its nodes ended: the start may be earlier now.
    pub stale: bool,
    /// Jobs backfilled onto its nodes.
    pub backfill: BTreeSet<JobId>,
}

impl Job {
    /// The GPUs it charges to its tenant's quota: all its workers' GPUs.
    pub fn quota_gpus(&self) -> QuotaGpus {
        QuotaGpus::from(self.spec.total_gpus())
    }

    /// Wall time since which this run's work is not in a complete
    /// checkpoint (the run's start, or the capture point of a checkpoint
    /// taken in this run). `None` unless running.
    pub fn safe_point(&self) -> Option<Timestamp> {
        let started = self.started_at?;
        let captured = self
            .last_checkpoint
            .as_ref()
            .map_or(0, |c| c.progress_ms.saturating_sub(self.resume_progress_ms));
        Some(Timestamp(started.0 + captured))
    }

    /// Work (ms) this run has done that no complete checkpoint holds.
    pub fn unsaved_ms(&self, now: Timestamp) -> u64 {
        self.safe_point().map_or(0, |s| now.millis_since(s))
    }

    /// The checkpoint a restart resumes from.
    pub fn resume_from(&self) -> Option<CheckpointRef> {
        self.last_checkpoint.as_ref().map(|c| CheckpointRef {
            progress_ms: c.progress_ms,
            uri: c.uri.clone(),
        })
    }
}

impl Job {
    pub(crate) fn queue_key(&self) -> QueueKey {
        QueueKey {
            priority: Reverse(self.spec.priority),
            order: self.order,
            job: self.id,
        }
    }
    fn placement_key(&self) -> QueueKey {
        QueueKey {
            priority: Reverse(self.spec.priority),
            order: self.admit_order,
            job: self.id,
        }
    }
}

/// A node's scheduling status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Takes work.
    Ready,
    /// Takes no new work.
    Cordoned,
    /// Takes no new work; emptied for maintenance.
    Drained,
    /// Gone.
    Lost,
    /// Takes no new work; its jobs are evicted with the checkpoint protocol
    /// for maintenance, and it stays out of service once empty.
    Evicted,
}

impl NodeStatus {
    /// Whether a node of this status may be set to `to` by an operator or
    /// by the loss of its agent: cordoned when ready; drained when ready or
    /// cordoned; evicted when in any status but lost; ready again
    /// (uncordoned) when cordoned, drained or evicted; lost once. A lost
    /// node comes back only by rejoining, which is not this rule. The one
    /// place for it: the log's check and the gateway's answer both ask here.
    pub fn may_be_set_to(self, to: NodeStatus) -> bool {
        use NodeStatus::{Cordoned, Drained, Evicted, Lost, Ready};
        match to {
            Ready => matches!(self, Cordoned | Drained | Evicted),
            Cordoned => self == Ready,
            Drained => matches!(self, Ready | Cordoned),
            Evicted => matches!(self, Ready | Cordoned | Drained),
            Lost => self != Lost,
        }
    }
}

/// A node as the scheduler knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// What the agent reported.
    pub spec: NodeSpec,
    /// Its flavor.
    pub flavor: FlavorIdx,
    /// Its status.
    pub status: NodeStatus,
    /// Jobs holding GPUs on it.
    pub jobs: Vec<JobId>,
    /// The job it is reserved for, if any.
    pub reserved_for: Option<JobId>,
}

/// A tenant's quota in one flavor, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Nominal GPUs.
    pub nominal: QuotaGpus,
    /// Borrowing limit (`None`: unlimited within the cohort).
    pub borrowing_limit: Option<QuotaGpus>,
    /// GPUs of nominal that may be lent.
    pub lendable: QuotaGpus,
}

impl Quota {
    /// Nominal GPUs that are never lent.
    pub fn guaranteed(&self) -> QuotaGpus {
        self.nominal - self.lendable
    }

    /// A tenant's quota in a flavor as configured; past a spent budget
    /// whose policy is borrow-only, none of it is its own: it lends all of
    /// its nominal quota and borrows whatever it uses, up to the limit it
    /// had.
    fn resolve(q: &FlavorQuota, borrow_only: bool) -> Quota {
        let nominal = QuotaGpus::from(q.nominal);
        let borrowing_limit = q.borrowing_limit.map(QuotaGpus::from);
        if borrow_only {
            return Quota {
                nominal: QuotaGpus::ZERO,
                borrowing_limit: borrowing_limit.map(|b| nominal + b),
                lendable: nominal,
            };
        }
        Quota {
            nominal,
            borrowing_limit,
            lendable: QuotaGpus::from(q.lendable()),
        }
    }
}

/// A tenant: its configuration, queue and usage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    /// Its configuration.
    pub spec: TenantSpec,
    /// Its cohort.
    pub cohort: Option<CohortIdx>,
    /// Quota per flavor index (`None`: flavor not usable).
    pub quotas: Vec<Option<Quota>>,
    /// Flavors with quota, in the order configured.
    pub flavor_order: Vec<FlavorIdx>,
    /// GPUs charged per flavor index.
    pub usage: Vec<QuotaGpus>,
    /// Queued jobs, by priority then submit order.
    pub pending: BTreeSet<QueueKey>,
    /// Bumped whenever something could unblock its queue from its own side.
    pub version: u64,
    /// What its queue lets through (set by its admin; open at first).
    pub queue: QueueState,
    /// Its jobs holding quota (admitted, bound, running or preempting).
    pub holding: BTreeSet<JobId>,
    /// Its past use, decayed with its cohort's half-life (empty without one).
    #[serde(default)]
    pub decayed: DecayedUse,
    /// GPU-hour budget ledgers per flavor index (`None`: no budget there).
    #[serde(default)]
    pub budgets: Vec<Option<BudgetLedger>>,
}

impl Tenant {
    /// Quota in a flavor.
    pub fn quota(&self, f: FlavorIdx) -> Option<Quota> {
        self.quotas.get(f as usize).copied().flatten()
    }
    /// GPUs charged in a flavor.
    pub fn used(&self, f: FlavorIdx) -> QuotaGpus {
        self.usage.get(f as usize).copied().unwrap_or_default()
    }
    /// Its nominal quota in a flavor (0 where it has none).
    pub fn nominal(&self, f: FlavorIdx) -> QuotaGpus {
        self.quota(f).map_or(QuotaGpus::ZERO, |q| q.nominal)
    }
    /// The most GPUs it may hold in a flavor: its nominal quota alone in
    /// no cohort, else nominal plus its borrowing limit
    /// ([`QuotaGpus::UNLIMITED`] without one); 0 where it has no quota there.
    pub fn limit(&self, f: FlavorIdx) -> QuotaGpus {
        let Some(q) = self.quota(f) else {
            return QuotaGpus::ZERO;
        };
        match self.cohort {
            None => q.nominal,
            Some(_) => q
                .borrowing_limit
                .map_or(QuotaGpus::UNLIMITED, |b| q.nominal + b),
        }
    }
    /// GPUs it holds in a flavor past [`Tenant::limit`]: quota taken back
    /// (the tenant reconfigured) while its jobs held it. Admission never
    /// adds to it; the jobs holding it run on.
    pub fn over_limit(&self, f: FlavorIdx) -> QuotaGpus {
        self.used(f) - self.limit(f)
    }
    /// GPUs of `used` drawn from the cohort's lendable pool.
    pub fn pool_draw(&self, f: FlavorIdx, used: QuotaGpus) -> QuotaGpus {
        used - self.quota(f).map_or(QuotaGpus::ZERO, |q| q.guaranteed())
    }
    /// What it draws from a cohort's pool now, in every flavor it has a
    /// quota or usage in (the part of its usage past its guaranteed quota;
    /// all of it where it has no quota).
    fn pool_draws(&self) -> Vec<(usize, QuotaGpus)> {
        let flavors = self.quotas.len().max(self.usage.len());
        (0..flavors)
            .map(|f| (f, self.pool_draw(f as FlavorIdx, self.used(f as FlavorIdx))))
            .collect()
    }
    /// Its GPU-hour budget in a flavor, if it has one.
    pub fn budget(&self, f: FlavorIdx) -> Option<&BudgetLedger> {
        self.budgets.get(f as usize).and_then(Option::as_ref)
    }
    /// Whether its budget in `f` is spent and its jobs there wait: its
    /// policy says so, or it is borrow-only but the tenant is in no cohort
    /// (there is no one to borrow from).
    pub fn budget_holds(&self, f: FlavorIdx) -> bool {
        self.budget(f).is_some_and(|b| {
            b.is_spent() && (b.budget.when_spent == WhenSpent::Wait || self.spec.cohort.is_none())
        })
    }
    /// Whether its budget in `f` is spent and its jobs there may only
    /// borrow: none of its nominal quota is its own until the period ends.
    pub fn budget_borrows_only(&self, f: FlavorIdx) -> bool {
        self.budget(f).is_some_and(|b| {
            b.is_spent()
                && b.budget.when_spent == WhenSpent::BorrowOnly
                && self.spec.cohort.is_some()
        })
    }
}

/// Tenants sharing their lendable quota.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cohort {
    /// Its name.
    pub name: String,
    /// Its tenants.
    pub members: Vec<TenantIdx>,
    /// Lendable GPUs per flavor (sum of members' lendable quota).
    pub pool_capacity: Vec<QuotaGpus>,
    /// GPUs drawn from the pool per flavor (usage above each member's guaranteed part).
    pub pool_used: Vec<QuotaGpus>,
    /// Bumped whenever quota is released or reconfigured in it.
    pub version: u64,
    /// Seconds after which a member's past use counts half (0: not kept).
    pub usage_half_life_s: u64,
    /// When its own settings were last set (`CohortConfigured`), if ever.
    pub configured_at: Option<Timestamp>,
}

impl Cohort {
    /// The usage half-life in milliseconds (0: not kept).
    pub fn half_life_ms(&self) -> u64 {
        self.usage_half_life_s.saturating_mul(1000)
    }
    /// Lendable GPUs in a flavor.
    pub fn capacity(&self, f: FlavorIdx) -> QuotaGpus {
        self.pool_capacity
            .get(f as usize)
            .copied()
            .unwrap_or_default()
    }
    /// Drawn GPUs in a flavor.
    pub fn used(&self, f: FlavorIdx) -> QuotaGpus {
        self.pool_used.get(f as usize).copied().unwrap_or_default()
    }
    /// GPUs drawn in a flavor past what its members lend: quota a lender
    /// took back (its budget renewed, its lending limit lowered) while
    /// borrowers held it. Admission never adds to it; it shrinks as the
    /// borrowers finish, or as a returning owner reclaims it from them.
    pub fn over_lent(&self, f: FlavorIdx) -> QuotaGpus {
        self.used(f) - self.capacity(f)
    }
    /// Whether the pool, with `drawn` GPUs of flavor `f` drawn, can lend
    /// `more`: drawing nothing is always allowed (an over-lent pool does
    /// not hold back a member within its guaranteed part).
    pub fn can_lend(&self, f: FlavorIdx, drawn: QuotaGpus, more: QuotaGpus) -> bool {
        more.is_zero() || drawn + more <= self.capacity(f)
    }
}

/// An event the state refused; nothing was changed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ApplyError {
    /// No such job.
    #[error("unknown job {0}")]
    UnknownJob(JobId),
    /// The job id is taken.
    #[error("job {0} already exists")]
    DuplicateJob(JobId),
    /// The event is not legal from the job's phase.
    #[error("job {job}: {event} is illegal in phase {from:?}")]
    IllegalTransition {
        /// The job.
        job: JobId,
        /// Its phase.
        from: Phase,
        /// The event kind.
        event: &'static str,
    },
    /// No such node.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// The event is not legal for the node's status.
    #[error("node {node}: {event} is illegal in status {from:?}")]
    IllegalNodeTransition {
        /// The node.
        node: NodeId,
        /// Its status.
        from: NodeStatus,
        /// The event kind.
        event: &'static str,
    },
    /// No such tenant.
    #[error("unknown tenant {0:?}")]
    UnknownTenant(String),
    /// No such flavor, or not acceptable here.
    #[error("flavor {0:?} is unknown or not acceptable")]
    BadFlavor(String),
    /// A field broke a rule.
    #[error("invalid {0}")]
    Invalid(#[from] FieldError),
    /// A binding that breaks gang, topology or capacity rules.
    #[error("job {job}: bad binding: {why}")]
    BadBinding {
        /// The job.
        job: JobId,
        /// What is wrong.
        why: String,
    },
    /// An admission beyond the tenant's or cohort's limits.
    #[error("job {job}: admission exceeds quota: {why}")]
    QuotaExceeded {
        /// The job.
        job: JobId,
        /// Which limit.
        why: String,
    },
    /// A resume that is not from the job's last complete checkpoint, or on
    /// another flavor than the checkpoint's.
    #[error("job {job}: may resume only from its last complete checkpoint on the same flavor")]
    IncompatibleResume {
        /// The job.
        job: JobId,
    },
    /// A preemption that breaks the rules.
    #[error("job {job}: bad preemption: {why}")]
    BadPreemption {
        /// The job.
        job: JobId,
        /// What is wrong.
        why: String,
    },
    /// A reservation that breaks the rules.
    #[error("job {job}: bad reservation: {why}")]
    BadReservation {
        /// The job.
        job: JobId,
        /// What is wrong.
        why: String,
    },
    /// Topology may only be configured before the first node.
    #[error("topology cannot change once nodes exist")]
    TopologyFixed,
    /// The tenant's queue does not let this through (a job accepted while
    /// it is draining or stopped, or admitted while it is not open).
    #[error("queue {tenant} is {state}")]
    QueueClosed {
        /// The tenant.
        tenant: String,
        /// Its queue's state.
        state: QueueState,
    },
    /// A dependency that is not an earlier job of the same tenant, or a
    /// `JobDependencyFailed` naming a dependency that did not fail the job.
    #[error("job {job}: job {dependency} is not a dependency it may have or that failed it")]
    BadDependency {
        /// The dependent job.
        job: JobId,
        /// The dependency named.
        dependency: JobId,
    },
    /// A budget event that does not match the budget: the tenant has no
    /// budget in the flavor, or it is already in the standing the event
    /// sets.
    #[error("tenant {tenant:?}, flavor {flavor:?}: {event}: {why}")]
    BadBudget {
        /// The tenant.
        tenant: String,
        /// The flavor.
        flavor: String,
        /// The event kind.
        event: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

/// Preemptible running jobs of one tenant and flavor, by latest safe point first.
type VictimIndex = BTreeSet<(Reverse<Timestamp>, JobId)>;

/// Counts of jobs per phase.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseCounts([u64; 10]);

impl PhaseCounts {
    /// Jobs in a phase.
    pub fn get(&self, p: Phase) -> u64 {
        self.0[p as usize]
    }
    fn mv(&mut self, from: Option<Phase>, to: Phase) {
        if let Some(f) = from {
            self.0[f as usize] -= 1;
        }
        self.0[to as usize] += 1;
    }
}

/// Everything the scheduler knows, built only by `apply`.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct State {
    applied: u64,
    levels: Vec<String>,
    flavors: Vec<String>,
    #[serde(with = "crate::snapshot::sorted_map")]
    flavor_by_name: FxHashMap<String, FlavorIdx>,
    capacity: CapacityIndex,
    nodes: Vec<Node>,
    #[serde(with = "crate::snapshot::sorted_map")]
    node_by_name: FxHashMap<String, NodeId>,
    tenants: Vec<Tenant>,
    #[serde(with = "crate::snapshot::sorted_map")]
    tenant_by_name: FxHashMap<String, TenantIdx>,
    cohorts: Vec<Cohort>,
    #[serde(with = "crate::snapshot::sorted_map")]
    cohort_by_name: FxHashMap<String, CohortIdx>,
    #[serde(with = "crate::snapshot::sorted_map")]
    jobs: FxHashMap<JobId, Job>,
    awaiting: BTreeSet<(u64, JobId)>,
    unplaced: Vec<BTreeSet<QueueKey>>,
    orphaned: BTreeSet<JobId>,
    capacity_version: Vec<u64>,
    /// Per flavor, bumped whenever something a reservation plan reads there
    /// changes beyond what `capacity_version` counts: a job holding GPUs
    /// there changes phase (GPUs taken, a guaranteed end known or moved by
    /// a victim's deadline), or a node's status or schedulability changes.
    placement_version: Vec<u64>,
    next_order: u64,
    counts: PhaseCounts,
    /// Preemptible running jobs per tenant and flavor, least unsaved work first.
    candidates: Vec<Vec<VictimIndex>>,
    /// Preempting jobs by deadline.
    preempting: BTreeSet<(Timestamp, JobId)>,
    /// Preempting jobs that completed a checkpoint since they were chosen.
    preempt_ready: BTreeSet<JobId>,
    /// Beneficiary → victims still preempting.
    plans: BTreeMap<JobId, BTreeSet<JobId>>,
    /// Reservations by job.
    reservations: BTreeMap<JobId, Reservation>,
    /// Waiting jobs whose last reason preemption might cure.
    wants_preemption: BTreeSet<QueueKey>,
    /// Bumped whenever a job starts running (new victim candidates).
    running_version: u64,
    /// Reclaim beneficiaries not yet admitted → (cohort, flavor): quota
    /// freed there goes to them, not back to borrowers.
    reclaim_holds: BTreeMap<JobId, (CohortIdx, FlavorIdx)>,
    /// Nodes being emptied for maintenance (status `Evicted`).
    evicted_nodes: BTreeSet<NodeId>,
    /// Dependencies and array limits (`gates`).
    gates: gates::Gates,
    /// The latest event time applied: the time decayed use is brought to.
    clock: Timestamp,
}

fn at_mut<T: Clone + Default>(v: &mut Vec<T>, i: usize) -> &mut T {
    if v.len() <= i {
        v.resize(i + 1, T::default());
    }
    &mut v[i]
}

/// A tenant's quotas per flavor index, from its spec (flavors in `order`)
/// and where its budgets stand.
fn resolved_quotas(tenant: &Tenant, order: &[FlavorIdx]) -> Vec<Option<Quota>> {
    let mut quotas = Vec::new();
    for (q, &f) in tenant.spec.quotas.iter().zip(order) {
        let borrow_only = tenant.budget_borrows_only(f);
        *at_mut(&mut quotas, f as usize) = Some(Quota::resolve(q, borrow_only));
    }
    quotas
}

impl State {
    /// An empty state with the default topology levels (`rack`, `block`).
    pub fn new() -> Self {
        let levels: Vec<String> = gpusched_model::DEFAULT_LEVELS
            .iter()
            .map(|s| s.to_string())
            .collect();
        State {
            capacity: CapacityIndex::new(levels.len()),
            levels,
            ..Default::default()
        }
    }

    /// Events applied so far.
    pub fn applied(&self) -> u64 {
        self.applied
    }
    /// The latest event time applied (the log's own clock).
    pub fn clock(&self) -> Timestamp {
        self.clock
    }
    /// The usage half-life of a tenant's cohort in ms (0: none kept).
    pub fn usage_half_life_ms(&self, t: TenantIdx) -> u64 {
        self.tenants[t as usize]
            .cohort
            .map_or(0, |c| self.cohorts[c as usize].half_life_ms())
    }
    /// A tenant's decayed use brought forward to `now` (at least the clock).
    pub fn decayed_use(&self, t: TenantIdx, now: Timestamp) -> DecayedUse {
        let tenant = &self.tenants[t as usize];
        tenant.decayed.at_time(
            &tenant.usage,
            self.usage_half_life_ms(t),
            now.max(self.clock),
        )
    }
    /// A cohort by name.
    pub fn cohort_idx(&self, name: &str) -> Option<CohortIdx> {
        self.cohort_by_name.get(name).copied()
    }
    /// Named topology levels, outermost first.
    pub fn levels(&self) -> &[String] {
        &self.levels
    }
    /// The name of a level number (0 = any, L+1 = node).
    pub fn level_name(&self, level: u8) -> &str {
        match level as usize {
            0 => LEVEL_ANY,
            l if l <= self.levels.len() => &self.levels[l - 1],
            _ => LEVEL_NODE,
        }
    }
    /// The number of a level name.
    pub fn level_number(&self, name: &str) -> Option<u8> {
        if name == LEVEL_ANY {
            return Some(0);
        }
        if name == LEVEL_NODE {
            return Some(self.capacity.node_level());
        }
        self.levels
            .iter()
            .position(|l| l == name)
            .map(|i| (i + 1) as u8)
    }
    /// Flavor names by index.
    pub fn flavors(&self) -> &[String] {
        &self.flavors
    }
    /// A flavor's index.
    pub fn flavor(&self, name: &str) -> Option<FlavorIdx> {
        self.flavor_by_name.get(name).copied()
    }
    /// A flavor's name.
    pub fn flavor_name(&self, f: FlavorIdx) -> &str {
        self.flavors.get(f as usize).map_or("?", |s| s.as_str())
    }
    /// The capacity index.
    pub fn capacity(&self) -> &CapacityIndex {
        &self.capacity
    }
    /// All nodes by id.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    /// A node id by name.
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_by_name.get(name).copied()
    }
    /// All tenants by index.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }
    /// A tenant's index by name.
    pub fn tenant_idx(&self, name: &str) -> Option<TenantIdx> {
        self.tenant_by_name.get(name).copied()
    }
    /// A tenant by index.
    pub fn tenant(&self, t: TenantIdx) -> &Tenant {
        &self.tenants[t as usize]
    }
    /// All cohorts by index.
    pub fn cohorts(&self) -> &[Cohort] {
        &self.cohorts
    }
    /// A cohort by index.
    pub fn cohort(&self, c: CohortIdx) -> &Cohort {
        &self.cohorts[c as usize]
    }
    /// A job.
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }
    /// Every job, in no particular order (sort before showing; never let
    /// this order reach a decision).
    pub fn jobs(&self) -> impl Iterator<Item = &Job> + '_ {
        self.jobs.values()
    }

    /// Number of jobs known.
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }
    /// Jobs per phase.
    pub fn phase_counts(&self) -> &PhaseCounts {
        &self.counts
    }
    /// Submitted jobs awaiting validation, in submit order.
    pub fn awaiting_validation(&self) -> impl Iterator<Item = JobId> + '_ {
        self.awaiting.iter().map(|&(_, j)| j)
    }
    /// Admitted jobs waiting for GPUs in a flavor, in placement order.
    pub fn unplaced(&self, f: FlavorIdx) -> impl Iterator<Item = &QueueKey> + '_ {
        self.unplaced.get(f as usize).into_iter().flatten()
    }
    /// Admitted jobs waiting for GPUs in a flavor, after `after`.
    pub fn unplaced_after(&self, f: FlavorIdx, after: Option<QueueKey>) -> Option<QueueKey> {
        let set = self.unplaced.get(f as usize)?;
        match after {
            None => set.first().copied(),
            Some(k) => set
                .range((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded))
                .next()
                .copied(),
        }
    }
    /// Jobs holding GPUs on lost nodes, awaiting requeue.
    pub fn orphaned(&self) -> impl Iterator<Item = JobId> + '_ {
        self.orphaned.iter().copied()
    }
    /// Bumped whenever GPUs of a flavor are freed, new work needs them, or
    /// an admitted job leaves its placement queue.
    pub fn capacity_version(&self, f: FlavorIdx) -> u64 {
        self.capacity_version.get(f as usize).copied().unwrap_or(0)
    }
    /// Preemptible running jobs of a tenant in a flavor, least unsaved work
    /// (latest safe point) first.
    pub fn victim_candidates(
        &self,
        t: TenantIdx,
        f: FlavorIdx,
    ) -> impl Iterator<Item = JobId> + '_ {
        let by_cost = cell(&self.candidates, t as usize, f as usize);
        by_cost.into_iter().flatten().map(|&(_, j)| j)
    }
    /// Tenants of cohort `c` other than `except` that use more than their
    /// nominal quota of flavor `f`: the borrowers a reclaim may take from.
    pub fn borrowers(&self, c: CohortIdx, f: FlavorIdx, except: TenantIdx) -> Vec<TenantIdx> {
        self.cohort(c)
            .members
            .iter()
            .copied()
            .filter(|&u| u != except)
            .filter(|&u| {
                let tu = self.tenant(u);
                tu.used(f) > tu.nominal(f)
            })
            .collect()
    }

    /// Preempting jobs by deadline.
    pub fn preempting(&self) -> impl Iterator<Item = (Timestamp, JobId)> + '_ {
        self.preempting.iter().copied()
    }
    /// Preempting jobs that completed a checkpoint since they were chosen.
    pub fn preempt_ready(&self) -> impl Iterator<Item = JobId> + '_ {
        self.preempt_ready.iter().copied()
    }
    /// Victims still preempting for a beneficiary.
    pub fn plan(&self, beneficiary: JobId) -> Option<&BTreeSet<JobId>> {
        self.plans.get(&beneficiary)
    }
    /// Every preemption in flight: beneficiary → victims still preempting.
    pub fn plans(&self) -> impl Iterator<Item = (JobId, &BTreeSet<JobId>)> + '_ {
        self.plans.iter().map(|(j, v)| (*j, v))
    }
    /// Reclaim beneficiaries still waiting to be admitted where their
    /// victims freed quota.
    pub fn reclaim_holders(&self) -> impl Iterator<Item = JobId> + '_ {
        self.reclaim_holds.keys().copied()
    }
    /// All reservations.
    pub fn reservations(&self) -> &BTreeMap<JobId, Reservation> {
        &self.reservations
    }
    /// Waiting jobs whose last reason preemption might cure, by priority then order.
    pub fn wants_preemption(&self) -> impl Iterator<Item = JobId> + '_ {
        self.wants_preemption.iter().map(|k| k.job)
    }
    /// Bumped whenever something a reservation plan in flavor `f` reads
    /// changes that [`State::capacity_version`] does not count: a job
    /// holding GPUs there changes phase, or a node's status changes.
    pub fn placement_version(&self, f: FlavorIdx) -> u64 {
        self.placement_version.get(f as usize).copied().unwrap_or(0)
    }
    /// Bumped whenever a job starts running.
    pub fn running_version(&self) -> u64 {
        self.running_version
    }
    /// The flavor a preemption planned for this job freed room in (its
    /// reclaim hold or its reserved nodes): it must be admitted there.
    pub fn planned_flavor(&self, job: JobId) -> Option<FlavorIdx> {
        if let Some(&(_, f)) = self.reclaim_holds.get(&job) {
            return Some(f);
        }
        let r = self.reservations.get(&job).filter(|r| r.for_preemption)?;
        let a = r.assignments.first()?;
        self.nodes.get(a.node.index()).map(|n| n.flavor)
    }
    /// Whether a reclaim in this cohort and flavor waits for the admission
    /// of a beneficiary of another tenant than `t`: borrowing there is held
    /// for it. A tenant's own jobs are not held back by its own reclaim:
    /// the quota freed is the tenant's, and its queue order says which of
    /// its jobs takes it (a head the beneficiary waits behind must be able
    /// to, or neither would ever run).
    pub fn reclaim_held(&self, c: CohortIdx, f: FlavorIdx, t: TenantIdx) -> bool {
        self.reclaim_holds.iter().any(|(j, &(hc, hf))| {
            hc == c && hf == f && self.jobs.get(j).is_some_and(|j| j.tenant != Some(t))
        })
    }
    /// Nodes being emptied for maintenance.
    pub fn evicted_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.evicted_nodes.iter().copied()
    }
    /// Total GPUs allocated to jobs.
    pub fn gpus_in_use(&self) -> u64 {
        (0..self.nodes.len())
            .map(|i| self.capacity.node_used(NodeId(i as u32)) as u64)
            .sum()
    }

    fn intern_flavor(&mut self, name: &str) -> FlavorIdx {
        if let Some(&f) = self.flavor_by_name.get(name) {
            return f;
        }
        let f = self.flavors.len() as FlavorIdx;
        self.flavors.push(name.to_string());
        self.flavor_by_name.insert(name.to_string(), f);
        at_mut(&mut self.unplaced, f as usize);
        at_mut(&mut self.capacity_version, f as usize);
        f
    }

    fn job_mut(&mut self, id: JobId) -> Result<&mut Job, ApplyError> {
        self.jobs.get_mut(&id).ok_or(ApplyError::UnknownJob(id))
    }

    fn expect_phase(
        &self,
        id: JobId,
        ok: &[Phase],
        event: &'static str,
    ) -> Result<&Job, ApplyError> {
        let job = self.jobs.get(&id).ok_or(ApplyError::UnknownJob(id))?;
        if ok.contains(&job.phase) {
            Ok(job)
        } else {
            Err(ApplyError::IllegalTransition {
                job: id,
                from: job.phase,
                event,
            })
        }
    }

    fn set_phase(&mut self, id: JobId, to: Phase) {
        if let Some(job) = self.jobs.get_mut(&id) {
            if job.phase.holds_gpus() || to.holds_gpus() {
                if let Some(f) = job.flavor {
                    *at_mut(&mut self.placement_version, f as usize) += 1;
                }
            }
            self.counts.mv(Some(job.phase), to);
            if let Some(tenant) = job.tenant.and_then(|t| self.tenants.get_mut(t as usize)) {
                if to.holds_quota() {
                    tenant.holding.insert(id);
                } else {
                    tenant.holding.remove(&id);
                }
            }
            job.phase = to;
            if to.is_terminal() {
                self.gate_ended(id, to);
            }
        }
    }

    fn node_checked(&self, n: NodeId) -> Result<&Node, ApplyError> {
        self.nodes.get(n.index()).ok_or(ApplyError::UnknownNode(n))
    }

    /// Changes a tenant's usage in a flavor and keeps its cohort's pool in step.
    fn charge(&mut self, t: TenantIdx, f: FlavorIdx, new_used: QuotaGpus) {
        self.roll_use(t);
        let tenant = &mut self.tenants[t as usize];
        let old_used = tenant.used(f);
        let old_draw = tenant.pool_draw(f, old_used);
        let new_draw = tenant.pool_draw(f, new_used);
        *at_mut(&mut tenant.usage, f as usize) = new_used;
        if new_used < old_used {
            tenant.version += 1;
        }
        if let Some(c) = tenant.cohort {
            let cohort = &mut self.cohorts[c as usize];
            let used = at_mut(&mut cohort.pool_used, f as usize);
            *used = *used + new_draw - old_draw;
            if new_used < old_used {
                cohort.version += 1;
            }
        }
    }

    /// Brings a tenant's decayed use up to the clock under its cohort's
    /// half-life, before its usage or its cohort's half-life changes.
    fn roll_use(&mut self, t: TenantIdx) {
        let h = self.usage_half_life_ms(t);
        let tenant = &mut self.tenants[t as usize];
        tenant.decayed.roll(&tenant.usage, h, self.clock);
        for (f, ledger) in tenant.budgets.iter_mut().enumerate() {
            if let Some(l) = ledger {
                let used = tenant.usage.get(f).copied().unwrap_or_default();
                l.roll(used.get(), self.clock);
            }
        }
    }

    /// Frees a job's GPUs and quota (it must hold them).
    fn release(&mut self, id: JobId) {
        self.forget_preemptible(id);
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let assignments = std::mem::take(&mut job.assignments);
        let (tenant, flavor, phase, total) =
            (job.tenant, job.flavor, job.phase, job.spec.total_gpus());
        job.flavor = None;
        job.borrowed = 0;
        for a in &assignments {
            let raw_free = self.capacity.node_raw_free(a.node);
            self.capacity.set_node_free(a.node, raw_free + a.gpus);
            if let Some(node) = self.nodes.get_mut(a.node.index()) {
                node.jobs.retain(|j| *j != id);
            }
        }
        if let Some(f) = flavor {
            if phase == Phase::Admitted {
                let key = self.jobs[&id].placement_key();
                self.unplaced[f as usize].remove(&key);
            }
            // Freed GPUs, or a job ahead left the placement queue: either
            // may let a parked job behind it be placed.
            *at_mut(&mut self.capacity_version, f as usize) += 1;
            if let Some(t) = tenant {
                let used = self.tenants[t as usize].used(f);
                self.charge(t, f, used - QuotaGpus::from(total));
            }
        }
        self.orphaned.remove(&id);
        if let Some((deadline, beneficiary)) = self.jobs.get_mut(&id).and_then(|j| j.preempt.take())
        {
            self.preempting.remove(&(deadline, id));
            self.preempt_ready.remove(&id);
            if let Some(b) = beneficiary {
                if let Some(victims) = self.plans.get_mut(&b) {
                    victims.remove(&id);
                    if victims.is_empty() {
                        self.plans.remove(&b);
                    }
                }
            }
        }
        if let Some(owner) = self.jobs.get_mut(&id).and_then(|j| j.backfill_for.take()) {
            if let Some(r) = self.reservations.get_mut(&owner) {
                r.backfill.remove(&id);
            }
        }
        // A reservation whose nodes just got GPUs back may start earlier.
        for a in &assignments {
            if let Some(owner) = self.nodes.get(a.node.index()).and_then(|n| n.reserved_for) {
                if let Some(r) = self.reservations.get_mut(&owner) {
                    r.stale = true;
                }
            }
        }
    }

    /// Ends a reclaim hold: borrowing in its cohort and flavor may resume,
    /// so tenants parked there are looked at again.
    fn drop_hold(&mut self, job: JobId) {
        if let Some((c, _)) = self.reclaim_holds.remove(&job) {
            if let Some(cohort) = self.cohorts.get_mut(c as usize) {
                cohort.version += 1;
            }
        }
    }

    /// Ends tenant `t`'s reclaim holds in flavor `f` whose beneficiary no
    /// longer fits within the tenant's nominal quota (its other jobs took
    /// that room): it would borrow like anyone else, and a hold kept for
    /// it would hold the cohort's borrowing for nobody.
    fn drop_holds_past_nominal(&mut self, t: TenantIdx, f: FlavorIdx) {
        let tenant = &self.tenants[t as usize];
        let room = (tenant.nominal(f) - tenant.used(f)).get();
        let past: Vec<JobId> = self
            .reclaim_holds
            .iter()
            .filter(|(_, &(_, hf))| hf == f)
            .filter_map(|(j, _)| self.jobs.get(j))
            .filter(|j| j.tenant == Some(t) && j.spec.total_gpus() > room)
            .map(|j| j.id)
            .collect();
        for j in past {
            self.drop_hold(j);
        }
    }

    /// Takes a running job out of the victim index.
    fn forget_preemptible(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        if let (Some(t), Some(f), Some(sp)) = (job.tenant, job.flavor, job.safe_point()) {
            if let Some(set) = self
                .candidates
                .get_mut(t as usize)
                .and_then(|v| v.get_mut(f as usize))
            {
                set.remove(&(Reverse(sp), id));
            }
        }
    }

    /// Puts a running preemptible job into the victim index.
    fn index_preemptible(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        if job.phase != Phase::Running || !job.spec.preemptible {
            return;
        }
        if let (Some(t), Some(f), Some(sp)) = (job.tenant, job.flavor, job.safe_point()) {
            let v = at_mut(&mut self.candidates, t as usize);
            at_mut(v, f as usize).insert((Reverse(sp), id));
        }
    }

    /// Whether a node takes new work: ready and not reserved.
    fn refresh_schedulable(&mut self, n: NodeId) {
        let Some(node) = self.nodes.get(n.index()) else {
            return;
        };
        let on = node.status == NodeStatus::Ready && node.reserved_for.is_none();
        let f = node.flavor;
        *at_mut(&mut self.placement_version, f as usize) += 1;
        let was = self.capacity.is_schedulable(n);
        self.capacity.set_schedulable(n, on);
        if on && !was {
            *at_mut(&mut self.capacity_version, f as usize) += 1;
        }
    }

    /// Bumps the capacity version of the flavors of these nodes: a
    /// reservation came or went, so what may be placed or backfilled changed.
    fn bump_nodes(&mut self, assignments: &[Assignment]) {
        let mut flavors: Vec<FlavorIdx> = assignments
            .iter()
            .filter_map(|a| self.nodes.get(a.node.index()).map(|n| n.flavor))
            .collect();
        flavors.sort_unstable();
        flavors.dedup();
        for f in flavors {
            *at_mut(&mut self.capacity_version, f as usize) += 1;
        }
    }

    fn release_reservation(&mut self, job: JobId) {
        let Some(r) = self.reservations.remove(&job) else {
            return;
        };
        for a in &r.assignments {
            if let Some(node) = self.nodes.get_mut(a.node.index()) {
                if node.reserved_for == Some(job) {
                    node.reserved_for = None;
                }
            }
            self.refresh_schedulable(a.node);
        }
        self.bump_nodes(&r.assignments);
        for b in r.backfill {
            if let Some(j) = self.jobs.get_mut(&b) {
                j.backfill_for = None;
            }
        }
    }

    /// Returns a job to its tenant's queue after losing its GPUs; it will
    /// resume from its last complete checkpoint, on that checkpoint's flavor.
    /// A job out of its queue and off its GPUs ends as cancelled: it wants
    /// no preemption, holds nothing for itself, and has no reservation.
    fn end_cancelled(&mut self, id: JobId, at: Timestamp) -> Result<(), ApplyError> {
        let qkey = self.job_mut(id)?.queue_key();
        self.wants_preemption.remove(&qkey);
        self.drop_hold(id);
        self.release_reservation(id);
        self.set_phase(id, Phase::Cancelled);
        self.job_mut(id)?.ended_at = Some(at);
        Ok(())
    }

    fn requeue(&mut self, id: JobId, lost_gpu_ms: u64, at: Timestamp) -> Result<(), ApplyError> {
        self.release(id);
        if self.job(id).is_some_and(|j| j.cancel_requested.is_some()) {
            // Its user cancelled it: it leaves instead of queueing again.
            self.job_mut(id)?.lost_gpu_ms += lost_gpu_ms;
            return self.end_cancelled(id, at);
        }
        self.set_phase(id, Phase::Queued);
        let j = self.job_mut(id)?;
        j.lost_gpu_ms += lost_gpu_ms;
        j.started_at = None;
        j.resume_progress_ms = j.last_checkpoint.as_ref().map_or(0, |c| c.progress_ms);
        if let Some(c) = &j.last_checkpoint {
            j.flavors = vec![c.flavor];
        }
        let key = j.queue_key();
        if let Some(t) = j.tenant {
            let tenant = &mut self.tenants[t as usize];
            tenant.pending.insert(key);
            tenant.version += 1;
        }
        Ok(())
    }

    fn detach_tenant(&mut self, t: TenantIdx) {
        let tenant = &self.tenants[t as usize];
        let Some(c) = tenant.cohort else { return };
        let draws = tenant.pool_draws();
        let cohort = &mut self.cohorts[c as usize];
        for (f, draw) in draws {
            *at_mut(&mut cohort.pool_used, f) -= draw;
        }
        cohort.members.retain(|m| *m != t);
        cohort.version += 1;
        self.tenants[t as usize].cohort = None;
        self.recount_pool_capacity(c);
    }

    /// Sets cohort `c`'s pool capacity, in every flavor it has a slot for,
    /// to what its members lend now. Recounted rather than adjusted, and
    /// saturating: an older release's log may hold quotas past
    /// `MAX_QUOTA_GPUS`, and a sum that once saturated is exact again when
    /// a member lends less.
    fn recount_pool_capacity(&mut self, c: CohortIdx) {
        let cohort = &self.cohorts[c as usize];
        let capacity: Vec<QuotaGpus> = (0..cohort.pool_capacity.len())
            .map(|f| self.lent_by_members(cohort, f as FlavorIdx))
            .collect();
        self.cohorts[c as usize].pool_capacity = capacity;
    }

    /// What a cohort's members lend in a flavor, saturating.
    fn lent_by_members(&self, cohort: &Cohort, f: FlavorIdx) -> QuotaGpus {
        cohort
            .members
            .iter()
            .map(|&m| {
                self.tenants[m as usize]
                    .quota(f)
                    .map_or(QuotaGpus::ZERO, |q| q.lendable)
            })
            .sum()
    }

    /// The cohort of this name, created empty if none has it yet.
    fn cohort_named(&mut self, name: &str) -> CohortIdx {
        if let Some(&c) = self.cohort_by_name.get(name) {
            return c;
        }
        let c = self.cohorts.len() as CohortIdx;
        self.cohorts.push(Cohort {
            name: name.to_string(),
            members: Vec::new(),
            pool_capacity: Vec::new(),
            pool_used: Vec::new(),
            version: 0,
            usage_half_life_s: 0,
            configured_at: None,
        });
        self.cohort_by_name.insert(name.to_string(), c);
        c
    }

    fn attach_tenant(&mut self, t: TenantIdx, cohort_name: &str) {
        let c = self.cohort_named(cohort_name);
        let draws = self.tenants[t as usize].pool_draws();
        let cohort = &mut self.cohorts[c as usize];
        for (f, draw) in draws {
            // A slot for each of its flavors, counted below.
            at_mut(&mut cohort.pool_capacity, f);
            *at_mut(&mut cohort.pool_used, f) += draw;
        }
        cohort.members.push(t);
        cohort.version += 1;
        self.tenants[t as usize].cohort = Some(c);
        self.recount_pool_capacity(c);
    }

    /// Applies one event. On error nothing changed.
    pub fn apply(&mut self, ev: &Event) -> Result<(), ApplyError> {
        let clock = self.clock;
        if let Some(at) = ev.at() {
            self.clock = self.clock.max(at);
        }
        if let Err(e) = self.apply_inner(ev) {
            self.clock = clock;
            return Err(e);
        }
        self.applied += 1;
        Ok(())
    }

    fn apply_inner(&mut self, ev: &Event) -> Result<(), ApplyError> {
        match ev {
            Event::TopologyConfigured { levels } => self.on_topology_configured(levels),
            Event::TenantConfigured { spec } => self.on_tenant_configured(spec),
            Event::NodeAdded { node, spec, .. } => self.on_node_added(*node, spec),
            Event::NodeCordoned { node } => {
                self.on_node_cordoned_or_drained(*node, NodeStatus::Cordoned, ev.kind())
            }
            Event::NodeUncordoned { node } => self.on_node_uncordoned(*node, ev.kind()),
            Event::NodeDrained { node } => {
                self.on_node_cordoned_or_drained(*node, NodeStatus::Drained, ev.kind())
            }
            Event::NodeLost { node, .. } => self.on_node_lost(*node, ev.kind()),
            Event::JobSubmitted { job, spec, at } => self.on_job_submitted(*job, spec, *at),
            Event::JobAccepted { job } => self.on_job_accepted(*job, ev.kind()),
            Event::JobRejected { job, reason } => self.on_job_rejected(*job, reason, ev.kind()),
            Event::JobAdmitted {
                job,
                flavor,
                borrowed,
                ..
            } => self.on_job_admitted(*job, flavor, *borrowed, ev.kind()),
            Event::JobPending { job, reason, .. } => self.on_job_pending(*job, reason, ev.kind()),
            Event::JobBound {
                job,
                assignments,
                backfill_for,
                at,
            } => self.on_job_bound(*job, assignments, *backfill_for, *at, ev.kind()),
            Event::JobStarted { job, at } => self.on_job_started(*job, *at, ev.kind()),
            Event::JobFinished {
                job, outcome, at, ..
            } => self.on_job_finished(*job, *outcome, *at, ev.kind()),
            Event::JobCancelled { job, at } => self.on_job_cancelled(*job, *at, ev.kind()),
            Event::JobCancelRequested { job, at } => {
                self.on_job_cancel_requested(*job, *at, ev.kind())
            }
            Event::JobRequeued {
                job,
                reason,
                lost_gpu_ms,
                at,
            } => self.on_job_requeued(*job, reason, *lost_gpu_ms, *at, ev.kind()),
            Event::JobCheckpointed {
                job,
                progress_ms,
                uri,
                at,
            } => self.on_job_checkpointed(*job, *progress_ms, uri, *at, ev.kind()),
            Event::PreemptionPlanned {
                beneficiary,
                victims,
                reserve,
                at,
                cause,
            } => self.on_preemption_planned(*beneficiary, victims, reserve, *at, cause, ev.kind()),
            Event::JobPreempted {
                job,
                lost_gpu_ms,
                resume_from,
                at,
            } => self.on_job_preempted(*job, *lost_gpu_ms, resume_from, *at, ev.kind()),
            Event::ReservationMade {
                job,
                assignments,
                start,
                at,
            } => self.on_reservation_made(*job, assignments, *start, *at, ev.kind()),
            Event::NodeRejoined { node, .. } => self.on_node_rejoined(*node, ev.kind()),
            Event::QueueStateSet { tenant, state, .. } => self.on_queue_state_set(tenant, *state),
            Event::NodeEvicted { node, .. } => {
                self.on_node_cordoned_or_drained(*node, NodeStatus::Evicted, ev.kind())
            }
            Event::EvictionPlanned { cause, victims, at } => {
                self.on_eviction_planned(cause, victims, *at, ev.kind())
            }
            Event::JobDependencyFailed {
                job,
                dependency,
                at,
            } => {
                self.check_dependency_failed(*job, *dependency, ev.kind())?;
                self.end_cancelled(*job, *at)
            }
            Event::CohortConfigured { spec, at } => self.on_cohort_configured(spec, *at),
            Event::BudgetSpent {
                tenant,
                flavor,
                period_start,
                ..
            } => self.on_budget_marked(tenant, flavor, Some(*period_start), ev.kind()),
            Event::BudgetRenewed { tenant, flavor, .. } => {
                self.on_budget_marked(tenant, flavor, None, ev.kind())
            }
        }
    }

    /// Checks no node exists yet and the level names are valid; sets the
    /// topology levels and a fresh capacity index.
    fn on_topology_configured(&mut self, levels: &[String]) -> Result<(), ApplyError> {
        if !self.nodes.is_empty() {
            return Err(ApplyError::TopologyFixed);
        }
        let mut seen = BTreeSet::new();
        for l in levels {
            if l.trim().is_empty() || l == LEVEL_ANY || l == LEVEL_NODE || !seen.insert(l) {
                return Err(FieldError::new(
                    "levels",
                    "names must be unique, non-empty, and not 'any' or 'node'",
                )
                .into());
            }
        }
        self.levels = levels.to_vec();
        self.capacity = CapacityIndex::new(levels.len());
        Ok(())
    }

    /// Checks the spec's fields; creates or replaces the tenant, its quotas
    /// and flavor order, and moves it into its cohort.
    fn on_tenant_configured(&mut self, spec: &TenantSpec) -> Result<(), ApplyError> {
        spec.check_fields()?;
        let t = match self.tenant_by_name.get(&spec.name) {
            Some(&t) => t,
            None => {
                let t = self.tenants.len() as TenantIdx;
                self.tenants.push(Tenant {
                    spec: spec.clone(),
                    cohort: None,
                    quotas: Vec::new(),
                    flavor_order: Vec::new(),
                    usage: Vec::new(),
                    pending: BTreeSet::new(),
                    version: 0,
                    queue: QueueState::Open,
                    holding: BTreeSet::new(),
                    decayed: DecayedUse::default(),
                    budgets: Vec::new(),
                });
                self.tenant_by_name.insert(spec.name.clone(), t);
                t
            }
        };
        self.roll_use(t);
        self.detach_tenant(t);
        let mut order = Vec::new();
        for q in &spec.quotas {
            order.push(self.intern_flavor(&q.flavor));
        }
        let budgets = self.budget_ledgers(t, spec, &order);
        let tenant = &mut self.tenants[t as usize];
        tenant.spec = spec.clone();
        tenant.budgets = budgets;
        tenant.quotas = resolved_quotas(tenant, &order);
        tenant.flavor_order = order;
        tenant.version += 1;
        if let Some(c) = &spec.cohort {
            self.attach_tenant(t, c);
        }
        for f in self.tenants[t as usize].flavor_order.clone() {
            self.drop_holds_past_nominal(t, f);
        }
        // A record kept under another cohort's half-life goes on under this
        // one's (or is dropped, without one).
        self.roll_use(t);
        Ok(())
    }

    /// The budget ledgers of tenant `t` under `spec` (flavors in `order`):
    /// a budget kept with the same period goes on counting (and stays
    /// spent if it was); a new one, or one whose period changed, counts
    /// from the clock.
    fn budget_ledgers(
        &self,
        t: TenantIdx,
        spec: &TenantSpec,
        order: &[FlavorIdx],
    ) -> Vec<Option<BudgetLedger>> {
        let old = &self.tenants[t as usize];
        let mut ledgers = Vec::new();
        for (q, &f) in spec.quotas.iter().zip(order) {
            let Some(budget) = q.budget else { continue };
            let ledger = match old.budget(f) {
                Some(l) if l.budget.period == budget.period => BudgetLedger {
                    budget,
                    ..l.clone()
                },
                _ => BudgetLedger::new(budget, self.clock),
            };
            *at_mut(&mut ledgers, f as usize) = Some(ledger);
        }
        ledgers
    }

    /// Marks tenant `t`'s budget in `f` spent (in the period starting at
    /// `period`) or renewed (`None`); where its policy is borrow-only, its
    /// quota there changes with it.
    fn on_budget_marked(
        &mut self,
        tenant: &str,
        flavor: &str,
        spent_in: Option<Timestamp>,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let t = self
            .tenant_idx(tenant)
            .ok_or_else(|| ApplyError::UnknownTenant(tenant.to_string()))?;
        let bad = |why| ApplyError::BadBudget {
            tenant: tenant.to_string(),
            flavor: flavor.to_string(),
            event: kind,
            why,
        };
        let f = self
            .flavor(flavor)
            .filter(|&f| self.tenants[t as usize].budget(f).is_some())
            .ok_or_else(|| bad("the tenant has no budget in this flavor"))?;
        let spent = self.tenants[t as usize]
            .budget(f)
            .is_some_and(|l| l.is_spent());
        if spent == spent_in.is_some() {
            return Err(bad(if spent {
                "the budget is spent already"
            } else {
                "the budget is not spent"
            }));
        }
        self.roll_use(t);
        self.detach_tenant(t);
        let tenant = &mut self.tenants[t as usize];
        if let Some(Some(l)) = tenant.budgets.get_mut(f as usize) {
            l.spent_in = spent_in;
        }
        tenant.quotas = resolved_quotas(tenant, &tenant.flavor_order.clone());
        tenant.version += 1;
        if let Some(c) = tenant.spec.cohort.clone() {
            self.attach_tenant(t, &c);
        }
        self.drop_holds_past_nominal(t, f);
        Ok(())
    }

    /// Checks the spec; creates the cohort if no tenant named it yet;
    /// brings its members' decayed use up to now under the old half-life,
    /// then sets the new one.
    fn on_cohort_configured(&mut self, spec: &CohortSpec, at: Timestamp) -> Result<(), ApplyError> {
        spec.check_fields()?;
        let c = self.cohort_named(&spec.name);
        for t in self.cohorts[c as usize].members.clone() {
            self.roll_use(t);
        }
        let cohort = &mut self.cohorts[c as usize];
        cohort.usage_half_life_s = spec.usage_half_life_s;
        cohort.configured_at = Some(at);
        cohort.version += 1;
        for t in cohort.members.clone() {
            self.roll_use(t);
        }
        Ok(())
    }

    /// Checks the spec, that the id is the next one and the name is new;
    /// adds the node to the node table and the capacity index.
    fn on_node_added(&mut self, node: NodeId, spec: &NodeSpec) -> Result<(), ApplyError> {
        spec.check_fields(self.levels.len())?;
        if node.index() != self.nodes.len() {
            return Err(FieldError::new("node", "must be the next node id").into());
        }
        if self.node_by_name.contains_key(&spec.name) {
            return Err(FieldError::new("name", "node name already registered").into());
        }
        let f = self.intern_flavor(&spec.flavor);
        self.capacity.add_node(node, f, spec.gpus, &spec.path);
        self.nodes.push(Node {
            spec: spec.clone(),
            flavor: f,
            status: NodeStatus::Ready,
            jobs: Vec::new(),
            reserved_for: None,
        });
        self.node_by_name.insert(spec.name.clone(), node);
        *at_mut(&mut self.capacity_version, f as usize) += 1;
        Ok(())
    }

    /// Checks the node may be cordoned, drained or evicted (`to`) from its
    /// status; sets it (an evicted node joins the index the preemption
    /// stage evicts from), and releases any reservation held on the node.
    fn on_node_cordoned_or_drained(
        &mut self,
        node: NodeId,
        to: NodeStatus,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let n = self.node_checked(node)?;
        if !n.status.may_be_set_to(to) {
            return Err(ApplyError::IllegalNodeTransition {
                node,
                from: n.status,
                event: kind,
            });
        }
        self.nodes[node.index()].status = to;
        if to == NodeStatus::Evicted {
            self.evicted_nodes.insert(node);
        }
        self.refresh_schedulable(node);
        // A reservation cannot start on a node taken out of service.
        if let Some(owner) = self.nodes[node.index()].reserved_for {
            self.release_reservation(owner);
        }
        Ok(())
    }

    /// Checks the node is cordoned or drained; makes it ready again.
    fn on_node_uncordoned(&mut self, node: NodeId, kind: &'static str) -> Result<(), ApplyError> {
        let n = self.node_checked(node)?;
        if !n.status.may_be_set_to(NodeStatus::Ready) {
            return Err(ApplyError::IllegalNodeTransition {
                node,
                from: n.status,
                event: kind,
            });
        }
        let f = n.flavor;
        self.evicted_nodes.remove(&node);
        self.nodes[node.index()].status = NodeStatus::Ready;
        self.refresh_schedulable(node);
        *at_mut(&mut self.capacity_version, f as usize) += 1;
        Ok(())
    }

    /// Checks the node is not already lost; marks it lost, takes it out of
    /// the capacity index, orphans its jobs and releases its reservation.
    fn on_node_lost(&mut self, node: NodeId, kind: &'static str) -> Result<(), ApplyError> {
        let n = self.node_checked(node)?;
        if !n.status.may_be_set_to(NodeStatus::Lost) {
            return Err(ApplyError::IllegalNodeTransition {
                node,
                from: n.status,
                event: kind,
            });
        }
        let f = n.flavor;
        self.capacity.remove_node(node);
        self.evicted_nodes.remove(&node);
        *at_mut(&mut self.placement_version, f as usize) += 1;
        let n = &mut self.nodes[node.index()];
        n.status = NodeStatus::Lost;
        let reserved = n.reserved_for;
        for j in n.jobs.clone() {
            self.orphaned.insert(j);
        }
        if let Some(owner) = reserved {
            self.release_reservation(owner);
        }
        Ok(())
    }

    /// Checks the job id is new; records the job as submitted, awaiting
    /// validation.
    fn on_job_submitted(
        &mut self,
        job: JobId,
        spec: &JobSpec,
        at: Timestamp,
    ) -> Result<(), ApplyError> {
        if self.jobs.contains_key(&job) {
            return Err(ApplyError::DuplicateJob(job));
        }
        let order = self.next_order;
        self.next_order += 1;
        self.jobs.insert(
            job,
            Job {
                id: job,
                spec: spec.clone(),
                phase: Phase::Submitted,
                tenant: None,
                level: 0,
                flavors: Vec::new(),
                order,
                submitted_at: at,
                flavor: None,
                borrowed: 0,
                admit_order: 0,
                assignments: Vec::new(),
                started_at: None,
                first_started_at: None,
                ended_at: None,
                starts: 0,
                requeues: 0,
                lost_gpu_ms: 0,
                last_reason: None,
                rejection: None,
                last_checkpoint: None,
                resume_progress_ms: 0,
                preempted_at: None,
                preemptions: 0,
                preempt: None,
                chosen_at: None,
                backfill_for: None,
                cancel_requested: None,
                waiting_on: BTreeSet::new(),
                failed_dependency: None,
                array_slot: false,
            },
        );
        self.counts.mv(None, Phase::Submitted);
        self.awaiting.insert((order, job));
        Ok(())
    }

    /// Checks the job is submitted with a valid spec, known tenant, level and
    /// flavors; queues it in its tenant's queue.
    fn on_job_accepted(&mut self, job: JobId, kind: &'static str) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Submitted], kind)?;
        j.spec.check_fields()?;
        let t = self
            .tenant_idx(&j.spec.tenant)
            .ok_or_else(|| ApplyError::UnknownTenant(j.spec.tenant.clone()))?;
        let level = self
            .level_number(&j.spec.topology)
            .ok_or_else(|| FieldError::new("topology", "unknown level"))?;
        let tenant = &self.tenants[t as usize];
        if !tenant.queue.accepts() {
            return Err(ApplyError::QueueClosed {
                tenant: tenant.spec.name.clone(),
                state: tenant.queue,
            });
        }
        let flavors = if j.spec.flavors.is_empty() {
            tenant.flavor_order.clone()
        } else {
            let mut v = Vec::with_capacity(j.spec.flavors.len());
            for name in &j.spec.flavors {
                match self.flavor(name) {
                    Some(f) if tenant.quota(f).is_some() => v.push(f),
                    _ => return Err(ApplyError::BadFlavor(name.clone())),
                }
            }
            v
        };
        let order = j.order;
        let waits = self.check_dependencies(job)?;
        self.awaiting.remove(&(order, job));
        self.set_phase(job, Phase::Queued);
        let j = self.job_mut(job)?;
        j.tenant = Some(t);
        j.level = level;
        j.flavors = flavors;
        self.gate_accepted(job, waits);
        Ok(())
    }

    /// Checks the job is submitted; marks it rejected with the reason.
    fn on_job_rejected(
        &mut self,
        job: JobId,
        reason: &RejectReason,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Submitted], kind)?;
        let order = j.order;
        self.awaiting.remove(&(order, job));
        self.set_phase(job, Phase::Rejected);
        self.job_mut(job)?.rejection = Some(reason.clone());
        Ok(())
    }

    /// Checks the admission (`check_job_admitted`); charges the quota and
    /// moves the job from its tenant's queue to the placement queue.
    fn on_job_admitted(
        &mut self,
        job: JobId,
        flavor: &str,
        borrowed: Gpus,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let (f, t, new_used, key) = self.check_job_admitted(job, flavor, kind)?;
        self.tenants[t as usize].pending.remove(&key);
        self.wants_preemption.remove(&key);
        self.drop_hold(job);
        self.charge(t, f, new_used);
        self.drop_holds_past_nominal(t, f);
        let order = self.next_order;
        self.next_order += 1;
        self.set_phase(job, Phase::Admitted);
        let j = self.job_mut(job)?;
        j.flavor = Some(f);
        j.borrowed = borrowed;
        j.admit_order = order;
        j.last_reason = None;
        let pkey = j.placement_key();
        self.unplaced[f as usize].insert(pkey);
        *at_mut(&mut self.capacity_version, f as usize) += 1;
        Ok(())
    }

    /// Checks, changing nothing, that a queued job may be admitted in this
    /// flavor within its tenant's limit and its cohort's pool; returns the
    /// flavor, tenant, the tenant's new usage and the job's queue key.
    fn check_job_admitted(
        &self,
        job: JobId,
        flavor: &str,
        kind: &'static str,
    ) -> Result<(FlavorIdx, TenantIdx, QuotaGpus, QueueKey), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Queued], kind)?;
        let f = self
            .flavor(flavor)
            .filter(|f| j.flavors.contains(f))
            .ok_or_else(|| ApplyError::BadFlavor(flavor.to_string()))?;
        let t = j.tenant.ok_or(ApplyError::UnknownJob(job))?;
        if j.last_checkpoint.as_ref().is_some_and(|c| c.flavor != f) {
            return Err(ApplyError::IncompatibleResume { job });
        }
        let need = j.quota_gpus();
        let tenant = &self.tenants[t as usize];
        if !tenant.pending.contains(&j.queue_key()) {
            return Err(ApplyError::IllegalTransition {
                job,
                from: j.phase,
                event: kind,
            });
        }
        if !tenant.queue.admits() {
            return Err(ApplyError::QueueClosed {
                tenant: tenant.spec.name.clone(),
                state: tenant.queue,
            });
        }
        tenant
            .quota(f)
            .ok_or_else(|| ApplyError::BadFlavor(flavor.to_string()))?;
        let new_used = tenant.used(f) + need;
        let limit = tenant.limit(f);
        if new_used > limit {
            return Err(ApplyError::QuotaExceeded {
                job,
                why: format!("tenant would use {new_used} of limit {limit}"),
            });
        }
        if let Some(c) = tenant.cohort {
            let cohort = &self.cohorts[c as usize];
            let draw = tenant.pool_draw(f, new_used) - tenant.pool_draw(f, tenant.used(f));
            if !cohort.can_lend(f, cohort.used(f), draw) {
                return Err(ApplyError::QuotaExceeded {
                    job,
                    why: format!(
                        "cohort {} would lend {} of {}",
                        cohort.name,
                        cohort.used(f) + draw,
                        cohort.capacity(f)
                    ),
                });
            }
        }
        let key = j.queue_key();
        Ok((f, t, new_used, key))
    }

    /// Checks the job is queued or admitted; records why it waits and whether
    /// preemption could cure that.
    fn on_job_pending(
        &mut self,
        job: JobId,
        reason: &PendingReason,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Queued, Phase::Admitted], kind)?;
        let key = j.queue_key();
        // A job kept out of its tenant's queue (a dependency, its array's
        // limit) is no one preemption should make room for.
        let gated = j.phase == Phase::Queued
            && j.tenant
                .is_none_or(|t| !self.tenants[t as usize].pending.contains(&key));
        let cure = !gated
            && matches!(
                reason,
                PendingReason::CohortExhausted { .. }
                    | PendingReason::QuotaExceeded { .. }
                    | PendingReason::NoDomainFits { .. }
            );
        if cure {
            self.wants_preemption.insert(key);
        } else {
            self.wants_preemption.remove(&key);
        }
        self.job_mut(job)?.last_reason = Some(reason.clone());
        Ok(())
    }

    /// Checks the job is admitted and the binding is valid; allocates its
    /// GPUs on the nodes and drops its own reservation.
    fn on_job_bound(
        &mut self,
        job: JobId,
        assignments: &[Assignment],
        backfill_for: Option<JobId>,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Admitted], kind)?;
        self.check_binding(j, assignments, backfill_for, at)?;
        let f = j.flavor.ok_or(ApplyError::UnknownJob(job))?;
        let key = j.placement_key();
        let qkey = j.queue_key();
        self.unplaced[f as usize].remove(&key);
        self.wants_preemption.remove(&qkey);
        for a in assignments {
            let free = self.capacity.node_raw_free(a.node);
            self.capacity.set_node_free(a.node, free - a.gpus);
            self.nodes[a.node.index()].jobs.push(job);
        }
        self.release_reservation(job);
        if let Some(owner) = backfill_for {
            if let Some(r) = self.reservations.get_mut(&owner) {
                r.backfill.insert(job);
            }
        }
        self.set_phase(job, Phase::Bound);
        let j = self.job_mut(job)?;
        j.assignments = assignments.to_vec();
        j.last_reason = None;
        j.backfill_for = backfill_for;
        Ok(())
    }

    /// Checks the job is bound on its checkpoint's flavor; marks it running
    /// and indexes it as a possible victim.
    fn on_job_started(
        &mut self,
        job: JobId,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Bound], kind)?;
        if let Some(c) = &j.last_checkpoint {
            if j.flavor != Some(c.flavor) {
                return Err(ApplyError::IncompatibleResume { job });
            }
        }
        self.set_phase(job, Phase::Running);
        let j = self.job_mut(job)?;
        j.started_at = Some(at);
        j.first_started_at.get_or_insert(at);
        j.starts += 1;
        self.index_preemptible(job);
        self.running_version += 1;
        Ok(())
    }

    /// Checks the job may end with this outcome from its phase; frees what
    /// it holds and moves it to the matching terminal phase.
    fn on_job_finished(
        &mut self,
        job: JobId,
        outcome: Outcome,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        // From Bound too: a worker that could not start fails the job.
        let legal: &[Phase] = match outcome {
            Outcome::Failed => &[Phase::Bound, Phase::Running, Phase::Preempting],
            _ => &[Phase::Running, Phase::Preempting],
        };
        self.expect_phase(job, legal, kind)?;
        self.release(job);
        let to = match outcome {
            Outcome::Succeeded => Phase::Succeeded,
            Outcome::Failed | Outcome::TimedOut => Phase::Failed,
            Outcome::Cancelled => Phase::Cancelled,
        };
        self.set_phase(job, to);
        self.job_mut(job)?.ended_at = Some(at);
        Ok(())
    }

    /// Checks the job has not ended; takes it out of wherever it waits or
    /// frees what it holds, and ends it as cancelled.
    fn on_job_cancelled(
        &mut self,
        job: JobId,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(
            job,
            &[
                Phase::Submitted,
                Phase::Queued,
                Phase::Admitted,
                Phase::Bound,
                Phase::Running,
                Phase::Preempting,
            ],
            kind,
        )?;
        match j.phase {
            Phase::Submitted => {
                let order = j.order;
                self.awaiting.remove(&(order, job));
            }
            Phase::Queued => {
                let key = j.queue_key();
                if let Some(t) = j.tenant {
                    let tenant = &mut self.tenants[t as usize];
                    tenant.pending.remove(&key);
                    tenant.version += 1;
                }
            }
            _ => self.release(job),
        }
        self.end_cancelled(job, at)?;
        Ok(())
    }

    /// Checks the job runs and no cancellation was requested yet; records
    /// the request (it keeps its GPUs until it finishes).
    fn on_job_cancel_requested(
        &mut self,
        job: JobId,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Running, Phase::Preempting], kind)?;
        if j.cancel_requested.is_some() {
            return Err(FieldError::new("job", "cancellation already requested").into());
        }
        self.job_mut(job)?.cancel_requested = Some(at);
        Ok(())
    }

    /// Checks the job holds GPUs; frees them and requeues it (or ends it
    /// when its cancellation was requested), counting the requeue.
    fn on_job_requeued(
        &mut self,
        job: JobId,
        reason: &RequeueReason,
        lost_gpu_ms: u64,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        match reason {
            RequeueReason::NodeLost { .. } => {
                self.expect_phase(
                    job,
                    &[Phase::Bound, Phase::Running, Phase::Preempting],
                    kind,
                )?;
            }
            RequeueReason::QueueStopped { tenant } => {
                let j = self.expect_phase(job, &[Phase::Admitted], kind)?;
                let t = j.tenant.map(|t| &self.tenants[t as usize]);
                if t.map(|t| (t.spec.name.as_str(), t.queue)) != Some((tenant, QueueState::Stopped))
                {
                    return Err(ApplyError::QueueClosed {
                        tenant: tenant.clone(),
                        state: t.map_or(QueueState::Open, |t| t.queue),
                    });
                }
                // Back in the queue, it holds no nodes and wants no victims.
                let key = j.queue_key();
                self.wants_preemption.remove(&key);
                self.release_reservation(job);
            }
        }
        self.requeue(job, lost_gpu_ms, at)?;
        self.job_mut(job)?.requeues += 1;
        Ok(())
    }

    /// Checks the checkpoint (`check_job_checkpointed`); records it, and
    /// either marks a victim ready to stop or re-indexes a running job.
    fn on_job_checkpointed(
        &mut self,
        job: JobId,
        progress_ms: u64,
        uri: &str,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let (flavor, phase) = self.check_job_checkpointed(job, progress_ms, kind)?;
        self.forget_preemptible(job);
        let j = self.job_mut(job)?;
        j.last_checkpoint = Some(Checkpoint {
            progress_ms,
            uri: uri.to_string(),
            at,
            flavor,
        });
        let since_chosen = self
            .job(job)
            .and_then(|j| j.chosen_at)
            .is_none_or(|c| at >= c);
        if phase == Phase::Preempting {
            if since_chosen {
                self.preempt_ready.insert(job);
            }
        } else {
            self.index_preemptible(job);
        }
        Ok(())
    }

    /// Checks, changing nothing, that the job runs and its progress does not
    /// go back; returns its flavor and phase.
    fn check_job_checkpointed(
        &self,
        job: JobId,
        progress_ms: u64,
        kind: &'static str,
    ) -> Result<(FlavorIdx, Phase), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Running, Phase::Preempting], kind)?;
        if progress_ms < j.resume_progress_ms
            || j.last_checkpoint
                .as_ref()
                .is_some_and(|c| progress_ms < c.progress_ms)
        {
            return Err(FieldError::new("progress_ms", "must not go back").into());
        }
        let flavor = j.flavor.ok_or(ApplyError::UnknownJob(job))?;
        let phase = j.phase;
        Ok((flavor, phase))
    }

    /// Checks the plan (`check_preemption_planned`); marks the victims
    /// preempting, records the plan, and holds the reclaim or the reserve.
    fn on_preemption_planned(
        &mut self,
        beneficiary: JobId,
        victims: &[Victim],
        reserve: &[Assignment],
        at: Timestamp,
        cause: &PreemptionCause,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        self.check_preemption_planned(beneficiary, victims, reserve, kind)?;
        for v in victims {
            self.stop_victim(v, Some(beneficiary), at)?;
        }
        self.plans
            .insert(beneficiary, victims.iter().map(|v| v.job).collect());
        let queued = self
            .jobs
            .get(&beneficiary)
            .is_some_and(|j| j.phase == Phase::Queued);
        if let (PreemptionCause::Reclaim { flavor, .. }, true) = (cause, queued) {
            let c = self
                .jobs
                .get(&beneficiary)
                .and_then(|j| j.tenant)
                .and_then(|t| self.tenants[t as usize].cohort);
            if let (Some(c), Some(f)) = (c, self.flavor(flavor)) {
                self.reclaim_holds.insert(beneficiary, (c, f));
            }
        }
        if !reserve.is_empty() {
            self.reserve(beneficiary, reserve.to_vec(), None, at, true);
        }
        Ok(())
    }

    /// Checks, changing nothing, that the beneficiary waits with no plan in
    /// flight, the victims are distinct running preemptible jobs, and the
    /// reserve is valid.
    fn check_preemption_planned(
        &self,
        beneficiary: JobId,
        victims: &[Victim],
        reserve: &[Assignment],
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let b = self.expect_phase(beneficiary, &[Phase::Queued, Phase::Admitted], kind)?;
        if self.plans.contains_key(&beneficiary) {
            return Err(ApplyError::BadPreemption {
                job: beneficiary,
                why: "a preemption is already in flight for it".into(),
            });
        }
        let b_flavors = b.flavors.clone();
        let mut seen = BTreeSet::new();
        for v in victims {
            let vj = self.expect_phase(v.job, &[Phase::Running], kind)?;
            if !vj.spec.preemptible {
                return Err(ApplyError::BadPreemption {
                    job: v.job,
                    why: "not preemptible".into(),
                });
            }
            if v.job == beneficiary || !seen.insert(v.job) {
                return Err(ApplyError::BadPreemption {
                    job: v.job,
                    why: "listed twice or is the beneficiary".into(),
                });
            }
        }
        if victims.is_empty() {
            return Err(ApplyError::BadPreemption {
                job: beneficiary,
                why: "no victims".into(),
            });
        }
        self.check_reservation(beneficiary, &b_flavors, reserve)?;
        Ok(())
    }

    /// Checks the victim is preempting and resumes from its last complete
    /// checkpoint; requeues it and counts the preemption.
    fn on_job_preempted(
        &mut self,
        job: JobId,
        lost_gpu_ms: u64,
        resume_from: &Option<CheckpointRef>,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Preempting], kind)?;
        if *resume_from != j.resume_from() {
            return Err(ApplyError::IncompatibleResume { job });
        }
        self.requeue(job, lost_gpu_ms, at)?;
        let j = self.job_mut(job)?;
        j.preempted_at = Some(at);
        j.preemptions += 1;
        Ok(())
    }

    /// Checks the job is admitted and may hold these nodes; reserves them
    /// for it.
    fn on_reservation_made(
        &mut self,
        job: JobId,
        assignments: &[Assignment],
        start: Option<Timestamp>,
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Admitted], kind)?;
        let flavors = j.flavor.into_iter().collect::<Vec<_>>();
        if assignments.is_empty() {
            return Err(FieldError::new("assignments", "must not be empty").into());
        }
        self.check_reservation(job, &flavors, assignments)?;
        self.reserve(job, assignments.to_vec(), start, at, false);
        Ok(())
    }

    /// Checks the node is lost and empty; makes it ready again, back in the
    /// capacity index.
    fn on_node_rejoined(&mut self, node: NodeId, kind: &'static str) -> Result<(), ApplyError> {
        let n = self.node_checked(node)?;
        // Back only once it is lost and every job it held has been
        // requeued: it returns empty.
        if n.status != NodeStatus::Lost || !n.jobs.is_empty() {
            return Err(ApplyError::IllegalNodeTransition {
                node,
                from: n.status,
                event: kind,
            });
        }
        let f = n.flavor;
        self.capacity.restore_node(node);
        self.nodes[node.index()].status = NodeStatus::Ready;
        self.refresh_schedulable(node);
        *at_mut(&mut self.capacity_version, f as usize) += 1;
        Ok(())
    }

    /// Sets a tenant's queue state. A queue that stops admitting ends its
    /// jobs' reclaim holds (borrowing in the cohort resumes: nobody of
    /// this tenant will take the room); any change bumps the tenant's
    /// version so its queue is looked at again.
    fn on_queue_state_set(&mut self, tenant: &str, state: QueueState) -> Result<(), ApplyError> {
        let t = self
            .tenant_idx(tenant)
            .ok_or_else(|| ApplyError::UnknownTenant(tenant.to_string()))?;
        let tn = &mut self.tenants[t as usize];
        tn.queue = state;
        tn.version += 1;
        if !state.admits() {
            let of_t = |j: &JobId| self.jobs.get(j).and_then(|j| j.tenant) == Some(t);
            let held: Vec<JobId> = self
                .reclaim_holds
                .keys()
                .filter(|j| of_t(j))
                .copied()
                .collect();
            // Nodes reserved for its queued jobs (by a preemption) go back
            // to work: none of them will be admitted while it is closed.
            let reserved: Vec<JobId> = self
                .reservations
                .keys()
                .filter(|j| of_t(j) && self.jobs.get(j).is_some_and(|j| j.phase == Phase::Queued))
                .copied()
                .collect();
            for j in held {
                self.drop_hold(j);
            }
            for j in reserved {
                self.release_reservation(j);
            }
        }
        Ok(())
    }

    /// Checks the eviction (`check_eviction_planned`); each victim starts
    /// the stop protocol with no beneficiary.
    fn on_eviction_planned(
        &mut self,
        cause: &EvictionCause,
        victims: &[Victim],
        at: Timestamp,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        self.check_eviction_planned(cause, victims, kind)?;
        for v in victims {
            self.stop_victim(v, None, at)?;
        }
        Ok(())
    }

    /// Checks, changing nothing, that the victims are distinct running
    /// jobs, each on the evicted node or of the stopped queue.
    fn check_eviction_planned(
        &self,
        cause: &EvictionCause,
        victims: &[Victim],
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let bad = |job: JobId, why: &str| ApplyError::BadPreemption {
            job,
            why: why.to_string(),
        };
        let first = victims.first().map_or(JobId(0), |v| v.job);
        if victims.is_empty() {
            return Err(bad(first, "an eviction with no victims"));
        }
        let stopped = match cause {
            EvictionCause::QueueStopped { tenant } => {
                let t = self
                    .tenant_idx(tenant)
                    .ok_or_else(|| ApplyError::UnknownTenant(tenant.clone()))?;
                if self.tenants[t as usize].queue != QueueState::Stopped {
                    return Err(bad(first, "its queue is not stopped"));
                }
                Some(t)
            }
            EvictionCause::NodeEvicted { node } => {
                if self.node_checked(*node)?.status != NodeStatus::Evicted {
                    return Err(bad(first, "its node is not being evicted"));
                }
                None
            }
        };
        let mut seen = BTreeSet::new();
        for v in victims {
            let j = self.expect_phase(v.job, &[Phase::Running], kind)?;
            if !seen.insert(v.job) {
                return Err(bad(v.job, "listed twice"));
            }
            let belongs = match (cause, stopped) {
                (_, Some(t)) => j.tenant == Some(t),
                (EvictionCause::NodeEvicted { node }, _) => {
                    j.assignments.iter().any(|a| a.node == *node)
                }
                _ => false,
            };
            if !belongs {
                return Err(bad(v.job, "not of the stopped queue or the evicted node"));
            }
        }
        Ok(())
    }

    /// A running victim starts to stop: out of the victim index, preempting
    /// until its deadline or a complete checkpoint.
    fn stop_victim(
        &mut self,
        v: &Victim,
        beneficiary: Option<JobId>,
        at: Timestamp,
    ) -> Result<(), ApplyError> {
        self.forget_preemptible(v.job);
        self.set_phase(v.job, Phase::Preempting);
        self.preempting.insert((v.deadline, v.job));
        let j = self.job_mut(v.job)?;
        j.preempt = Some((v.deadline, beneficiary));
        j.chosen_at = Some(at);
        Ok(())
    }

    /// Checks that `job` may hold these nodes: present, of an acceptable
    /// flavor, one flavor, not held for another job.
    fn check_reservation(
        &self,
        job: JobId,
        flavors: &[FlavorIdx],
        assignments: &[Assignment],
    ) -> Result<(), ApplyError> {
        let bad = |why: String| ApplyError::BadReservation { job, why };
        let mut flavor = None;
        let mut seen = BTreeSet::new();
        for a in assignments {
            let n = self.node_checked(a.node)?;
            if !seen.insert(a.node) {
                return Err(bad(format!("node {} listed twice", a.node)));
            }
            if n.status == NodeStatus::Lost {
                return Err(bad(format!("node {} is lost", a.node)));
            }
            if n.reserved_for.is_some_and(|o| o != job) {
                return Err(bad(format!("node {} is held for another job", a.node)));
            }
            if !flavors.contains(&n.flavor) || flavor.is_some_and(|f| f != n.flavor) {
                return Err(bad(format!("node {} has the wrong flavor", a.node)));
            }
            if a.gpus == 0 || a.gpus > n.spec.gpus {
                return Err(bad(format!("{} GPUs asked on {}", a.gpus, a.node)));
            }
            flavor = Some(n.flavor);
        }
        Ok(())
    }

    fn reserve(
        &mut self,
        job: JobId,
        assignments: Vec<Assignment>,
        start: Option<Timestamp>,
        at: Timestamp,
        for_preemption: bool,
    ) {
        let backfill = self
            .reservations
            .get(&job)
            .map(|r| r.backfill.clone())
            .unwrap_or_default();
        self.release_reservation(job);
        for a in &assignments {
            self.nodes[a.node.index()].reserved_for = Some(job);
            self.refresh_schedulable(a.node);
        }
        self.bump_nodes(&assignments);
        // Backfill still on these nodes stays attached to the reservation.
        let mut kept = BTreeSet::new();
        for b in backfill {
            let on_nodes = self.jobs.get(&b).is_some_and(|j| {
                j.phase.holds_gpus()
                    && j.assignments
                        .iter()
                        .any(|x| assignments.iter().any(|a| a.node == x.node))
            });
            if on_nodes {
                kept.insert(b);
                if let Some(j) = self.jobs.get_mut(&b) {
                    j.backfill_for = Some(job);
                }
            }
        }
        self.reservations.insert(
            job,
            Reservation {
                assignments,
                start,
                made_at: at,
                for_preemption,
                stale: false,
                backfill: kept,
            },
        );
    }

    fn check_binding(
        &self,
        j: &Job,
        assignments: &[Assignment],
        backfill_for: Option<JobId>,
        at: Timestamp,
    ) -> Result<(), ApplyError> {
        let bad = |why: String| ApplyError::BadBinding { job: j.id, why };
        let g = j.spec.gpus_per_worker;
        let total: u64 = assignments.iter().map(|a| a.gpus as u64).sum();
        if total != j.spec.total_gpus() as u64 {
            return Err(bad(format!(
                "{total} GPUs bound, gang needs {}",
                j.spec.total_gpus()
            )));
        }
        let mut domain = None;
        let mut seen = BTreeSet::new();
        for a in assignments {
            let n = self.node_checked(a.node)?;
            if !seen.insert(a.node) {
                return Err(bad(format!("node {} listed twice", a.node)));
            }
            if a.gpus == 0 || a.gpus % g != 0 {
                return Err(bad(format!(
                    "{} GPUs on {} is not a whole number of workers",
                    a.gpus, a.node
                )));
            }
            if Some(n.flavor) != j.flavor {
                return Err(bad(format!(
                    "node {} is not of the admitted flavor",
                    a.node
                )));
            }
            match (n.reserved_for, backfill_for) {
                _ if n.status != NodeStatus::Ready => {
                    return Err(bad(format!("node {} is not ready", a.node)));
                }
                (Some(owner), _) if owner == j.id => {}
                (Some(owner), Some(b)) if owner == b => {
                    let r = self.reservations.get(&owner);
                    let ends_before = match (r.and_then(|r| r.start), j.spec.max_runtime_s) {
                        (Some(start), Some(max)) => at.plus_secs(max) <= start,
                        _ => false,
                    };
                    if !(j.spec.preemptible || ends_before) {
                        return Err(bad(format!(
                            "backfill on {} must end before job {owner}'s reservation starts or be preemptible",
                            a.node
                        )));
                    }
                }
                (Some(owner), _) => {
                    return Err(bad(format!("node {} is held for job {owner}", a.node)));
                }
                (None, Some(_)) => {
                    return Err(bad(format!(
                        "backfill onto {}, which is not reserved",
                        a.node
                    )));
                }
                (None, None) => {}
            }
            if self.capacity.node_raw_free(a.node) < a.gpus {
                return Err(bad(format!(
                    "node {} has {} GPUs free, {} asked",
                    a.node,
                    self.capacity.node_raw_free(a.node),
                    a.gpus
                )));
            }
            let d = self.capacity.node_domain(a.node, j.level);
            if domain.is_some() && domain != d {
                return Err(bad(format!(
                    "gang spans more than one {}",
                    self.level_name(j.level)
                )));
            }
            domain = d;
        }
        Ok(())
    }

    /// A hash of the state that matters, stable across runs and machines:
    /// jobs and their phases and allocations, nodes, tenants' usage. Built
    /// from the same events in the same order it is always the same.
    pub fn state_hash(&self) -> String {
        // Pieces are gathered in a buffer and hashed in large blocks (the
        // same bytes as hashing each piece as it comes, many times faster).
        let mut h = blake3::Hasher::new();
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        let mut put = |b: &[u8]| {
            buf.extend_from_slice(&(b.len() as u64).to_le_bytes());
            buf.extend_from_slice(b);
            if buf.len() >= 1 << 16 {
                h.update(&buf);
                buf.clear();
            }
        };
        for l in &self.levels {
            put(l.as_bytes());
        }
        for n in &self.nodes {
            put(n.spec.name.as_bytes());
            put(self.flavor_name(n.flavor).as_bytes());
            put(&[n.status as u8]);
            put(&n.spec.gpus.to_le_bytes());
        }
        for (i, _) in self.nodes.iter().enumerate() {
            put(&self.capacity.node_used(NodeId(i as u32)).to_le_bytes());
        }
        for t in &self.tenants {
            put(t.spec.name.as_bytes());
            // Only a queue an admin changed: older states hash as they did.
            if t.queue != QueueState::Open {
                put(t.queue.name().as_bytes());
            }
            for (f, u) in t.usage.iter().enumerate() {
                if !u.is_zero() {
                    put(self.flavor_name(f as FlavorIdx).as_bytes());
                    put(&u.get().to_le_bytes());
                }
            }
        }
        // Budgets only where set: older states hash as they did.
        for t in &self.tenants {
            for (f, l) in t.budgets.iter().enumerate() {
                let Some(l) = l else { continue };
                put(t.spec.name.as_bytes());
                put(self.flavor_name(f as FlavorIdx).as_bytes());
                put(&l.budget.gpu_hours.to_le_bytes());
                put(l.budget.period.name().as_bytes());
                put(l.budget.when_spent.name().as_bytes());
                put(&l.period_start.0.to_le_bytes());
                put(&l.used_gpu_ms.to_le_bytes());
                put(&l.at.0.to_le_bytes());
                put(&l.spent_in.map_or(u64::MAX, |p| p.0).to_le_bytes());
            }
        }
        // Cohorts' own settings only where set: older states hash as they
        // did.
        for c in &self.cohorts {
            let Some(at) = c.configured_at else { continue };
            put(c.name.as_bytes());
            put(&c.usage_half_life_s.to_le_bytes());
            put(&at.0.to_le_bytes());
            if c.usage_half_life_s == 0 {
                continue;
            }
            for &t in &c.members {
                let d = &self.tenants[t as usize].decayed;
                put(&d.at.0.to_le_bytes());
                for v in &d.gpu_ms {
                    put(&v.to_bits().to_le_bytes());
                }
            }
        }
        let mut ids: Vec<&JobId> = self.jobs.keys().collect();
        ids.sort_unstable();
        for id in ids {
            let j = &self.jobs[id];
            put(&id.0.to_le_bytes());
            put(&[j.phase as u8]);
            put(j.spec.tenant.as_bytes());
            put(&j.spec.total_gpus().to_le_bytes());
            put(&j.starts.to_le_bytes());
            put(&j.requeues.to_le_bytes());
            put(&j.lost_gpu_ms.to_le_bytes());
            put(&j.submitted_at.0.to_le_bytes());
            for t in [j.first_started_at, j.started_at, j.ended_at] {
                put(&t.map_or(u64::MAX, |t| t.0).to_le_bytes());
            }
            if let Some(f) = j.flavor {
                put(self.flavor_name(f).as_bytes());
            }
            for a in &j.assignments {
                put(&a.node.0.to_le_bytes());
                put(&a.gpus.to_le_bytes());
            }
            put(&j.resume_progress_ms.to_le_bytes());
            put(&j.preemptions.to_le_bytes());
            if let Some(c) = &j.last_checkpoint {
                put(&c.progress_ms.to_le_bytes());
                put(c.uri.as_bytes());
            }
            if let Some((deadline, b)) = j.preempt {
                put(&deadline.0.to_le_bytes());
                put(&b.map_or(u64::MAX, |b| b.0).to_le_bytes());
            }
            put(&j.backfill_for.map_or(0, |b| b.0 + 1).to_le_bytes());
            put(&j.cancel_requested.map_or(u64::MAX, |t| t.0).to_le_bytes());
            // Gates only where set: older states hash as they did.
            for dep in &j.waiting_on {
                put(&dep.0.to_le_bytes());
            }
            if let Some(dep) = j.failed_dependency {
                put(b"failed");
                put(&dep.0.to_le_bytes());
            }
            if j.array_slot {
                put(b"slot");
            }
        }
        for (job, r) in &self.reservations {
            put(&job.0.to_le_bytes());
            put(&r.start.map_or(u64::MAX, |t| t.0).to_le_bytes());
            put(&[r.for_preemption as u8]);
            for a in &r.assignments {
                put(&a.node.0.to_le_bytes());
                put(&a.gpus.to_le_bytes());
            }
        }
        h.update(&buf);
        h.finalize().to_hex()[..32].to_string()
    }

    /// Decayed use: finite, not negative, never ahead of the clock, and
    /// kept only under a cohort with a half-life.
    fn check_decayed_use(&self) -> Result<(), String> {
        for (ti, t) in self.tenants.iter().enumerate() {
            let d = &t.decayed;
            if d.at > self.clock {
                return Err(format!(
                    "tenant {}: decayed use ahead of the clock",
                    t.spec.name
                ));
            }
            if self.usage_half_life_ms(ti as TenantIdx) == 0 && !d.gpu_ms.is_empty() {
                return Err(format!(
                    "tenant {}: decayed use kept without a half-life",
                    t.spec.name
                ));
            }
            if let Some(v) = d.gpu_ms.iter().find(|v| !v.is_finite() || **v < 0.0) {
                return Err(format!("tenant {}: decayed use {v}", t.spec.name));
            }
        }
        Ok(())
    }

    fn check_budgets(&self) -> Result<(), String> {
        for t in &self.tenants {
            for (f, l) in t.budgets.iter().enumerate() {
                let Some(l) = l else { continue };
                let name = &t.spec.name;
                if l.at > self.clock || l.period_start > l.at {
                    return Err(format!("tenant {name}: budget ledger ahead of the clock"));
                }
                if l.period_start != l.budget.period.start_of(l.at) {
                    return Err(format!("tenant {name}: budget counted in the wrong period"));
                }
                let own = t.nominal(f as FlavorIdx);
                if t.budget_borrows_only(f as FlavorIdx) && !own.is_zero() {
                    return Err(format!(
                        "tenant {name}: spent borrow-only budget but {own} GPUs of its own"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Recomputes allocations and quota usage from the jobs and checks the
    /// rules of docs/architecture.md, "The rules the core keeps" (1–3). O(state): for tests and replay checks.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.capacity.check_consistency()?;
        let mut node_used = vec![0u64; self.nodes.len()];
        let mut usage: FxHashMap<(TenantIdx, FlavorIdx), u64> = FxHashMap::default();
        for j in self.jobs.values() {
            if j.phase.holds_gpus() {
                let mut domain = None;
                let mut total = 0u64;
                for a in &j.assignments {
                    node_used[a.node.index()] += a.gpus as u64;
                    total += a.gpus as u64;
                    if a.gpus % j.spec.gpus_per_worker != 0 {
                        return Err(format!("job {} has a partial worker", j.id));
                    }
                    let d = self.capacity.node_domain(a.node, j.level);
                    if domain.is_some() && domain != d {
                        return Err(format!("job {} spans two domains", j.id));
                    }
                    domain = d;
                }
                if total != j.spec.total_gpus() as u64 {
                    return Err(format!("job {} is not whole: {total} GPUs", j.id));
                }
            } else if !j.assignments.is_empty() {
                return Err(format!("job {} holds GPUs in phase {:?}", j.id, j.phase));
            }
            if j.phase.holds_quota() {
                let (Some(t), Some(f)) = (j.tenant, j.flavor) else {
                    return Err(format!("job {} holds quota without tenant or flavor", j.id));
                };
                *usage.entry((t, f)).or_default() += j.spec.total_gpus() as u64;
            }
        }
        for (i, used) in node_used.iter().enumerate() {
            let n = NodeId(i as u32);
            if *used != self.capacity.node_used(n) as u64 {
                return Err(format!(
                    "node {n}: jobs hold {used}, index says {}",
                    self.capacity.node_used(n)
                ));
            }
            if *used > self.capacity.node_gpus(n) as u64 {
                return Err(format!("node {n} is double-booked"));
            }
        }
        for (ti, t) in self.tenants.iter().enumerate() {
            for f in 0..self.flavors.len() {
                let f = f as FlavorIdx;
                let used = usage.get(&(ti as TenantIdx, f)).copied().unwrap_or(0);
                if used != u64::from(t.used(f).get()) {
                    return Err(format!(
                        "tenant {} usage drifted in {}",
                        t.spec.name,
                        self.flavor_name(f)
                    ));
                }
                // Past its limit only where quota was taken back while in
                // use (`Tenant::over_limit`); admission never goes past it.
                if t.quota(f).is_none() && used > 0 {
                    return Err(format!("tenant {} uses an unlisted flavor", t.spec.name));
                }
            }
        }
        for c in &self.cohorts {
            for f in 0..self.flavors.len() {
                let f = f as FlavorIdx;
                let drawn: u64 = c
                    .members
                    .iter()
                    .map(|&m| {
                        let t = &self.tenants[m as usize];
                        u64::from(t.pool_draw(f, t.used(f)).get())
                    })
                    .sum();
                // Drawn past capacity only where a lender took quota back
                // while it was lent (`Cohort::over_lent`); admission never
                // draws past it.
                if drawn != u64::from(c.used(f).get()) {
                    return Err(format!("cohort {} pool drifted", c.name));
                }
                let lent = self.lent_by_members(c, f);
                if c.capacity(f) != lent {
                    return Err(format!(
                        "cohort {} holds {} GPUs of flavor {f}, its members lend {lent}",
                        c.name,
                        c.capacity(f),
                    ));
                }
            }
        }
        for (ti, t) in self.tenants.iter().enumerate() {
            let holding = self
                .jobs
                .values()
                .filter(|j| j.tenant == Some(ti as TenantIdx) && j.phase.holds_quota())
                .count();
            let indexed = t
                .holding
                .iter()
                .filter(|j| self.jobs.get(j).is_some_and(|j| j.phase.holds_quota()))
                .count();
            if holding != t.holding.len() || indexed != holding {
                return Err(format!("tenant {} holding index drifted", t.spec.name));
            }
        }
        for (job, r) in &self.reservations {
            let phase = self.jobs.get(job).map(|j| j.phase);
            let ok = if r.for_preemption {
                matches!(phase, Some(Phase::Queued | Phase::Admitted))
            } else {
                phase == Some(Phase::Admitted)
            };
            if !ok {
                return Err(format!("job {job} holds a reservation in phase {phase:?}"));
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let listed = self.evicted_nodes.contains(&NodeId(i as u32));
            if listed != (n.status == NodeStatus::Evicted) {
                return Err(format!("node {i}: evicted index drifted"));
            }
        }
        self.check_gates()?;
        self.check_decayed_use()?;
        self.check_budgets()?;
        let counted: u64 = Phase::ALL.iter().map(|p| self.counts.get(*p)).sum();
        if counted != self.jobs.len() as u64 {
            return Err("phase counts drifted".into());
        }
        Ok(())
    }
}
