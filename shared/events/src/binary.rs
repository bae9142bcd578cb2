//! The binary form of events, for formats that write by position
//! (postcard): what the bus carries between services.
//!
//! `Event` and the reasons inside it are internally tagged serde enums
//! (`#[serde(tag = "type")]`), the readable JSON form the log stores and
//! the API serves. Reading a tagged enum back needs `deserialize_any`,
//! which a positional format cannot offer, and its skipped empty fields
//! would shift every field after them. This module describes the same
//! types a second time for serde's `remote` derive, untagged and with every
//! field written: the variant's index, then its fields in order. A reading
//! follower decodes each event straight into its fields, with no
//! intermediate buffer of untyped values.
//!
//! The descriptions are checked by the compiler against the real types: a
//! variant or field added to `Event` (or to a reason) and not here, or
//! named differently, fails to compile. The order of variants is the wire
//! format, as `Event`'s own rule says: new variants are only appended, here
//! at the same place as there; the tests pin each variant's index.
//!
//! A positional form cannot tell an old layout from a new one: an event
//! written with one field fewer would be read with the next event's bytes
//! in its place. So the form has a number, [`FORM`], which whoever carries
//! events writes beside them and checks before reading them. Any change
//! to the layout (a field added to a variant, a variant appended) bumps
//! it, and the checked-in message of every kind
//! (`shared/events/fixtures/log-v5.bus`, tested by the bus crate) fails
//! until it does. A reader of another form must refuse the message and
//! read those events from the log (docs/extending.md).
//!
//! Owns: [`FORM`] and [`events`], a `#[serde(with)]` module for a sequence
//! of events. Must never: be used for JSON (use `Event`'s derived form),
//! reorder a variant or field, or change without a new [`FORM`].

use crate::{
    Assignment, CheckpointRef, Event, EvictionCause, Outcome, PendingReason, PreemptionCause,
    QueueState, RejectReason, RequeueReason, Victim, WorkerExit,
};
use gpusched_model::{
    positional::job_spec, CohortSpec, Gpus, JobId, JobSpec, NodeId, NodeSpec, TenantSpec, Timestamp,
};
use serde::{Deserialize, Serialize};

/// The number of the binary form's layout. Bumped with every change to
/// it; readers refuse a form they do not know.
pub const FORM: u16 = 5;

#[derive(Serialize, Deserialize)]
#[serde(remote = "WorkerExit")]
struct WorkerExitDef {
    rank: u32,
    code: Option<i32>,
    signal: Option<i32>,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "RequeueReason")]
enum RequeueReasonDef {
    NodeLost { node: NodeId },
    QueueStopped { tenant: String },
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "PendingReason")]
enum PendingReasonDef {
    QuotaExceeded {
        flavor: String,
        used: Gpus,
        nominal: Gpus,
        borrowable: Gpus,
        need: Gpus,
    },
    CohortExhausted {
        flavor: String,
        cohort: String,
        used: Gpus,
        nominal: Gpus,
        lendable_left: Gpus,
        need: Gpus,
    },
    NoDomainFits {
        flavor: String,
        level: String,
        workers: u32,
        gpus_per_worker: Gpus,
        largest_free: Gpus,
    },
    BehindHead {
        head: JobId,
    },
    WaitingForJobs {
        after_ok: Vec<JobId>,
        after: Vec<JobId>,
    },
    ArrayLimit {
        array: u64,
        limit: u32,
    },
    DependencyFailed {
        dependency: JobId,
    },
    BudgetSpent {
        flavor: String,
        gpu_hours: u64,
        period: String,
        renews_at: Timestamp,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "RejectReason")]
enum RejectReasonDef {
    InvalidField {
        field: String,
        rule: String,
    },
    UnknownTenant {
        tenant: String,
    },
    UnknownFlavor {
        flavor: String,
    },
    UnknownLevel {
        level: String,
    },
    GangTooLarge {
        level: String,
        need: Gpus,
        largest_domain: Gpus,
    },
    ExceedsQuotaLimit {
        need: Gpus,
        limit: Gpus,
    },
    DuplicateJob,
    QueueClosed {
        tenant: String,
        state: QueueState,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "PreemptionCause")]
enum PreemptionCauseDef {
    Reclaim {
        tenant: String,
        flavor: String,
        quota_deficit: Gpus,
    },
    Priority {
        tenant: String,
        flavor: String,
    },
    Reservation,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "EvictionCause")]
enum EvictionCauseDef {
    QueueStopped { tenant: String },
    NodeEvicted { node: NodeId },
}

/// `Event`, variant by variant and field by field, in declaration order.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Event")]
enum EventDef {
    TopologyConfigured {
        levels: Vec<String>,
    },
    TenantConfigured {
        spec: TenantSpec,
    },
    NodeAdded {
        node: NodeId,
        spec: NodeSpec,
        at: Timestamp,
    },
    NodeCordoned {
        node: NodeId,
    },
    NodeUncordoned {
        node: NodeId,
    },
    NodeDrained {
        node: NodeId,
    },
    NodeLost {
        node: NodeId,
        at: Timestamp,
    },
    JobSubmitted {
        job: JobId,
        #[serde(with = "job_spec")]
        spec: JobSpec,
        at: Timestamp,
    },
    JobAccepted {
        job: JobId,
    },
    JobRejected {
        job: JobId,
        #[serde(with = "RejectReasonDef")]
        reason: RejectReason,
    },
    JobAdmitted {
        job: JobId,
        flavor: String,
        borrowed: Gpus,
        at: Timestamp,
    },
    JobPending {
        job: JobId,
        #[serde(with = "PendingReasonDef")]
        reason: PendingReason,
        at: Timestamp,
    },
    JobBound {
        job: JobId,
        assignments: Vec<Assignment>,
        backfill_for: Option<JobId>,
        at: Timestamp,
    },
    JobStarted {
        job: JobId,
        at: Timestamp,
    },
    JobFinished {
        job: JobId,
        outcome: Outcome,
        at: Timestamp,
        #[serde(with = "worker_exits")]
        exits: Vec<WorkerExit>,
        reason: Option<String>,
    },
    JobCancelled {
        job: JobId,
        at: Timestamp,
    },
    JobCancelRequested {
        job: JobId,
        at: Timestamp,
    },
    JobRequeued {
        job: JobId,
        #[serde(with = "RequeueReasonDef")]
        reason: RequeueReason,
        lost_gpu_ms: u64,
        at: Timestamp,
    },
    JobCheckpointed {
        job: JobId,
        progress_ms: u64,
        uri: String,
        at: Timestamp,
    },
    PreemptionPlanned {
        beneficiary: JobId,
        #[serde(with = "PreemptionCauseDef")]
        cause: PreemptionCause,
        victims: Vec<Victim>,
        reserve: Vec<Assignment>,
        at: Timestamp,
    },
    JobPreempted {
        job: JobId,
        lost_gpu_ms: u64,
        resume_from: Option<CheckpointRef>,
        at: Timestamp,
    },
    ReservationMade {
        job: JobId,
        assignments: Vec<Assignment>,
        start: Option<Timestamp>,
        at: Timestamp,
    },
    NodeRejoined {
        node: NodeId,
        at: Timestamp,
    },
    QueueStateSet {
        tenant: String,
        state: QueueState,
        at: Timestamp,
    },
    NodeEvicted {
        node: NodeId,
        at: Timestamp,
    },
    EvictionPlanned {
        #[serde(with = "EvictionCauseDef")]
        cause: EvictionCause,
        victims: Vec<Victim>,
        at: Timestamp,
    },
    JobDependencyFailed {
        job: JobId,
        dependency: JobId,
        at: Timestamp,
    },
    CohortConfigured {
        spec: CohortSpec,
        at: Timestamp,
    },
    BudgetSpent {
        tenant: String,
        flavor: String,
        period_start: Timestamp,
        at: Timestamp,
    },
    BudgetRenewed {
        tenant: String,
        flavor: String,
        period_start: Timestamp,
        at: Timestamp,
    },
}

/// A job's worker exits, each with every field written.
mod worker_exits {
    use super::{WorkerExit, WorkerExitDef};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize)]
    struct Out<'a>(#[serde(with = "WorkerExitDef")] &'a WorkerExit);

    #[derive(Deserialize)]
    struct In(#[serde(with = "WorkerExitDef")] WorkerExit);

    pub fn serialize<S: Serializer>(exits: &[WorkerExit], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(exits.iter().map(Out))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<WorkerExit>, D::Error> {
        let exits: Vec<In> = Vec::deserialize(d)?;
        Ok(exits.into_iter().map(|e| e.0).collect())
    }
}

/// A sequence of events in their binary form: `#[serde(with =
/// "gpusched_events::binary::events")]` on a `Vec<Event>` field of a
/// struct that a positional format (postcard) writes.
pub mod events {
    use super::{Event, EventDef};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize)]
    struct Out<'a>(#[serde(with = "EventDef")] &'a Event);

    #[derive(Deserialize)]
    struct In(#[serde(with = "EventDef")] Event);

    /// Writes the events: their count, then each one's variant index and
    /// fields.
    pub fn serialize<S: Serializer>(events: &[Event], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(events.iter().map(Out))
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Event>, D::Error> {
        let events: Vec<In> = Vec::deserialize(d)?;
        Ok(events.into_iter().map(|e| e.0).collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gpusched_model::{ArrayTask, CheckpointPolicy, FlavorQuota};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Batch {
        #[serde(with = "events")]
        events: Vec<Event>,
    }

    /// The wire index of each variant: the position it was declared at.
    /// Exhaustive, so a new variant does not compile until it has one
    /// (appended: the next number).
    fn declared_index(e: &Event) -> u8 {
        use Event::*;
        match e {
            TopologyConfigured { .. } => 0,
            TenantConfigured { .. } => 1,
            NodeAdded { .. } => 2,
            NodeCordoned { .. } => 3,
            NodeUncordoned { .. } => 4,
            NodeDrained { .. } => 5,
            NodeLost { .. } => 6,
            JobSubmitted { .. } => 7,
            JobAccepted { .. } => 8,
            JobRejected { .. } => 9,
            JobAdmitted { .. } => 10,
            JobPending { .. } => 11,
            JobBound { .. } => 12,
            JobStarted { .. } => 13,
            JobFinished { .. } => 14,
            JobCancelled { .. } => 15,
            JobCancelRequested { .. } => 16,
            JobRequeued { .. } => 17,
            JobCheckpointed { .. } => 18,
            PreemptionPlanned { .. } => 19,
            JobPreempted { .. } => 20,
            ReservationMade { .. } => 21,
            NodeRejoined { .. } => 22,
            QueueStateSet { .. } => 23,
            NodeEvicted { .. } => 24,
            EvictionPlanned { .. } => 25,
            JobDependencyFailed { .. } => 26,
            CohortConfigured { .. } => 27,
            BudgetSpent { .. } => 28,
            BudgetRenewed { .. } => 29,
        }
    }

    fn spec(full: bool) -> JobSpec {
        JobSpec {
            tenant: "ml".into(),
            priority: -3,
            workers: 2,
            gpus_per_worker: 8,
            flavors: vec!["h100".into()],
            topology: "block".into(),
            preemptible: false,
            checkpoint: full.then_some(CheckpointPolicy {
                interval_s: 600,
                duration_s: 30,
            }),
            max_runtime_s: full.then_some(3600),
            command: if full {
                vec!["train".into(), "--fast".into()]
            } else {
                vec![]
            },
            env: if full {
                [("A".to_string(), "1".to_string())].into()
            } else {
                Default::default()
            },
            working_dir: full.then(|| "/w".to_string()),
            checkpoint_signal: full.then(|| "SIGUSR2".to_string()),
            array: full.then_some(ArrayTask {
                array: 9,
                index: 4,
                max_running: Some(2),
            }),
            after_ok: if full { vec![JobId(3)] } else { vec![] },
            after: if full {
                vec![JobId(1), JobId(2)]
            } else {
                vec![]
            },
        }
    }

    /// One of every variant (and of every reason), in declaration order,
    /// optional fields both set and empty.
    fn every_kind() -> Vec<Event> {
        let (j, n, t) = (JobId(42), NodeId(7), Timestamp(1_000_123));
        let a = vec![Assignment { node: n, gpus: 8 }];
        vec![
            Event::TopologyConfigured {
                levels: vec!["rack".into(), "block".into()],
            },
            Event::TenantConfigured {
                spec: TenantSpec {
                    name: "ml".into(),
                    cohort: Some("c".into()),
                    weight: 2.5,
                    queueing: gpusched_model::QueueingMode::BestEffortFifo,
                    quotas: vec![FlavorQuota {
                        flavor: "h100".into(),
                        nominal: 16,
                        borrowing_limit: Some(8),
                        lending_limit: None,
                        budget: Some(gpusched_model::Budget {
                            gpu_hours: 500,
                            period: gpusched_model::BudgetPeriod::Month,
                            when_spent: gpusched_model::WhenSpent::BorrowOnly,
                        }),
                    }],
                    priority_preemption: false,
                },
            },
            Event::NodeAdded {
                node: n,
                spec: NodeSpec::new("n7", "h100", 8, &["r0", "b1"]),
                at: t,
            },
            Event::NodeCordoned { node: n },
            Event::NodeUncordoned { node: n },
            Event::NodeDrained { node: n },
            Event::NodeLost { node: n, at: t },
            Event::JobSubmitted {
                job: j,
                spec: spec(true),
                at: t,
            },
            Event::JobSubmitted {
                job: j,
                spec: spec(false),
                at: t,
            },
            Event::JobAccepted { job: j },
            Event::JobRejected {
                job: j,
                reason: RejectReason::InvalidField {
                    field: "workers".into(),
                    rule: "≥ 1".into(),
                },
            },
            Event::JobRejected {
                job: j,
                reason: RejectReason::UnknownTenant { tenant: "x".into() },
            },
            Event::JobRejected {
                job: j,
                reason: RejectReason::UnknownFlavor { flavor: "x".into() },
            },
            Event::JobRejected {
                job: j,
                reason: RejectReason::UnknownLevel { level: "x".into() },
            },
            Event::JobRejected {
                job: j,
                reason: RejectReason::GangTooLarge {
                    level: "rack".into(),
                    need: 64,
                    largest_domain: 32,
                },
            },
            Event::JobRejected {
                job: j,
                reason: RejectReason::ExceedsQuotaLimit { need: 64, limit: 8 },
            },
            Event::JobRejected {
                job: j,
                reason: RejectReason::DuplicateJob,
            },
            Event::JobAdmitted {
                job: j,
                flavor: "h100".into(),
                borrowed: 4,
                at: t,
            },
            Event::JobPending {
                job: j,
                reason: PendingReason::QuotaExceeded {
                    flavor: "h100".into(),
                    used: 1,
                    nominal: 2,
                    borrowable: 3,
                    need: 4,
                },
                at: t,
            },
            Event::JobPending {
                job: j,
                reason: PendingReason::CohortExhausted {
                    flavor: "h100".into(),
                    cohort: "c".into(),
                    used: 1,
                    nominal: 2,
                    lendable_left: 3,
                    need: 4,
                },
                at: t,
            },
            Event::JobPending {
                job: j,
                reason: PendingReason::NoDomainFits {
                    flavor: "h100".into(),
                    level: "block".into(),
                    workers: 2,
                    gpus_per_worker: 8,
                    largest_free: 12,
                },
                at: t,
            },
            Event::JobPending {
                job: j,
                reason: PendingReason::BehindHead { head: JobId(1) },
                at: t,
            },
            Event::JobBound {
                job: j,
                assignments: a.clone(),
                backfill_for: Some(JobId(3)),
                at: t,
            },
            Event::JobBound {
                job: j,
                assignments: a.clone(),
                backfill_for: None,
                at: t,
            },
            Event::JobStarted { job: j, at: t },
            Event::JobFinished {
                job: j,
                outcome: Outcome::Failed,
                at: t,
                exits: vec![
                    WorkerExit {
                        rank: 0,
                        code: Some(1),
                        signal: None,
                    },
                    WorkerExit {
                        rank: 1,
                        code: None,
                        signal: Some(9),
                    },
                ],
                reason: Some("exit 1".into()),
            },
            Event::JobFinished {
                job: j,
                outcome: Outcome::TimedOut,
                at: t,
                exits: vec![],
                reason: None,
            },
            Event::JobCancelled { job: j, at: t },
            Event::JobCancelRequested { job: j, at: t },
            Event::JobRequeued {
                job: j,
                reason: RequeueReason::NodeLost { node: n },
                lost_gpu_ms: 77,
                at: t,
            },
            Event::JobCheckpointed {
                job: j,
                progress_ms: 60_000,
                uri: "s3://c/1".into(),
                at: t,
            },
            Event::PreemptionPlanned {
                beneficiary: j,
                cause: PreemptionCause::Reclaim {
                    tenant: "ml".into(),
                    flavor: "h100".into(),
                    quota_deficit: 8,
                },
                victims: vec![Victim {
                    job: JobId(5),
                    deadline: t,
                    expected_lost_gpu_ms: 10,
                    cost: 20,
                }],
                reserve: a.clone(),
                at: t,
            },
            Event::PreemptionPlanned {
                beneficiary: j,
                cause: PreemptionCause::Priority {
                    tenant: "ml".into(),
                    flavor: "h100".into(),
                },
                victims: vec![],
                reserve: vec![],
                at: t,
            },
            Event::PreemptionPlanned {
                beneficiary: j,
                cause: PreemptionCause::Reservation,
                victims: vec![],
                reserve: vec![],
                at: t,
            },
            Event::JobPreempted {
                job: j,
                lost_gpu_ms: 5,
                resume_from: Some(CheckpointRef {
                    progress_ms: 9,
                    uri: "s3://c/2".into(),
                }),
                at: t,
            },
            Event::JobPreempted {
                job: j,
                lost_gpu_ms: 5,
                resume_from: None,
                at: t,
            },
            Event::ReservationMade {
                job: j,
                assignments: a.clone(),
                start: Some(t),
                at: t,
            },
            Event::ReservationMade {
                job: j,
                assignments: a,
                start: None,
                at: t,
            },
            Event::NodeRejoined { node: n, at: t },
            Event::JobRejected {
                job: j,
                reason: RejectReason::QueueClosed {
                    tenant: "ml".into(),
                    state: QueueState::Draining,
                },
            },
            Event::QueueStateSet {
                tenant: "ml".into(),
                state: QueueState::Stopped,
                at: t,
            },
            Event::NodeEvicted { node: n, at: t },
            Event::JobRequeued {
                job: j,
                reason: RequeueReason::QueueStopped {
                    tenant: "ml".into(),
                },
                lost_gpu_ms: 0,
                at: t,
            },
            Event::EvictionPlanned {
                cause: EvictionCause::QueueStopped {
                    tenant: "ml".into(),
                },
                victims: vec![Victim {
                    job: JobId(5),
                    deadline: t,
                    expected_lost_gpu_ms: 10,
                    cost: 20,
                }],
                at: t,
            },
            Event::EvictionPlanned {
                cause: EvictionCause::NodeEvicted { node: n },
                victims: vec![],
                at: t,
            },
            Event::JobDependencyFailed {
                job: j,
                dependency: JobId(3),
                at: t,
            },
            Event::CohortConfigured {
                spec: CohortSpec {
                    name: "research".into(),
                    usage_half_life_s: 86_400,
                },
                at: t,
            },
            Event::JobPending {
                job: j,
                reason: PendingReason::WaitingForJobs {
                    after_ok: vec![JobId(3)],
                    after: vec![],
                },
                at: t,
            },
            Event::JobPending {
                job: j,
                reason: PendingReason::ArrayLimit { array: 9, limit: 2 },
                at: t,
            },
            Event::JobPending {
                job: j,
                reason: PendingReason::DependencyFailed {
                    dependency: JobId(3),
                },
                at: t,
            },
            Event::BudgetSpent {
                tenant: "ml".into(),
                flavor: "h100".into(),
                period_start: Timestamp(1_000),
                at: t,
            },
            Event::BudgetRenewed {
                tenant: "ml".into(),
                flavor: "h100".into(),
                period_start: Timestamp(2_000),
                at: t,
            },
            Event::JobPending {
                job: j,
                reason: PendingReason::BudgetSpent {
                    flavor: "h100".into(),
                    gpu_hours: 500,
                    period: "month".into(),
                    renews_at: Timestamp(2_000),
                },
                at: t,
            },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        let batch = Batch {
            events: every_kind(),
        };
        let bytes = postcard::to_allocvec(&batch).unwrap();
        let back: Batch = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, batch);
    }

    #[test]
    fn every_variant_keeps_its_declared_index() {
        let events = every_kind();
        let mut seen = std::collections::BTreeSet::new();
        for e in &events {
            let bytes = postcard::to_allocvec(&Batch {
                events: vec![e.clone()],
            })
            .unwrap();
            // A count of 1, then the variant index.
            assert_eq!(bytes[..2], [1, declared_index(e)], "{}", e.kind());
            assert_eq!(
                crate::KINDS.get(declared_index(e) as usize),
                Some(&e.kind())
            );
            seen.insert(declared_index(e));
        }
        let all: std::collections::BTreeSet<u8> = (0..crate::KINDS.len() as u8).collect();
        assert_eq!(seen, all, "every_kind() must hold every variant");
    }

    /// Checked in: the bytes of one event must keep decoding forever.
    #[test]
    fn golden_bytes() {
        let e = Event::JobBound {
            job: JobId(7),
            assignments: vec![Assignment {
                node: NodeId(3),
                gpus: 8,
            }],
            backfill_for: None,
            at: Timestamp(1000),
        };
        let golden: &[u8] = &[
            0x01, // one event
            0x0c, // variant 12: job_bound
            0x07, // job 7
            0x01, 0x03, 0x08, // one assignment: node 3, 8 GPUs
            0x00, // backfill_for: none
            0xe8, 0x07, // at 1000
        ];
        let batch = Batch { events: vec![e] };
        assert_eq!(postcard::to_allocvec(&batch).unwrap(), golden);
        assert_eq!(postcard::from_bytes::<Batch>(golden).unwrap(), batch);
    }

    #[test]
    fn malformed_bytes_are_errors_never_panics() {
        let bytes = postcard::to_allocvec(&Batch {
            events: every_kind(),
        })
        .unwrap();
        for n in 0..bytes.len() {
            assert!(
                postcard::from_bytes::<Batch>(&bytes[..n]).is_err(),
                "prefix of {n} bytes"
            );
        }
        assert!(
            postcard::from_bytes::<Batch>(&[1, 26]).is_err(),
            "unknown variant"
        );
        assert!(postcard::from_bytes::<Batch>(&[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }
}
