//! What the store derives from an `Event` for its columns: the aggregate it
//! belongs to and the producer's name.
//!
//! Must never: read anything but the event itself. `Event::aggregate` is
//! exhaustive, so a new variant does not compile until its aggregate is chosen.

use gpusched_events::{Aggregate, Event, Producer};

/// Which kind of thing an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AggregateKind {
    /// A job, by its numeric id.
    Job,
    /// A node, by its numeric id.
    Node,
    /// A tenant, by its name.
    Tenant,
    /// Cluster-wide configuration (the topology levels).
    Cluster,
    /// A cohort, by its name.
    Cohort,
}

impl AggregateKind {
    /// The name stored in `events.aggregate_kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            AggregateKind::Job => "job",
            AggregateKind::Node => "node",
            AggregateKind::Tenant => "tenant",
            AggregateKind::Cluster => "cluster",
            AggregateKind::Cohort => "cohort",
        }
    }
}

/// The aggregate an event belongs to: its kind and id (as stored).
pub fn aggregate_of(ev: &Event) -> (AggregateKind, String) {
    match ev.aggregate() {
        Aggregate::Cluster => (AggregateKind::Cluster, "topology".to_string()),
        Aggregate::Tenant(name) => (AggregateKind::Tenant, name),
        Aggregate::Cohort(name) => (AggregateKind::Cohort, name),
        Aggregate::Node(n) => (AggregateKind::Node, n.0.to_string()),
        Aggregate::Job(j) => (AggregateKind::Job, j.0.to_string()),
    }
}

/// The name stored in `events.producer` (the serde name of `Producer`).
pub fn producer_name(p: Producer) -> &'static str {
    match p {
        Producer::Admin => "admin",
        Producer::Gateway => "gateway",
        Producer::Admission => "admission",
        Producer::Quota => "quota",
        Producer::Placement => "placement",
        Producer::Preemption => "preemption",
        Producer::Agent => "agent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::{JobId, NodeId, Timestamp};

    #[test]
    fn producer_names_match_serde() {
        for p in [
            Producer::Admin,
            Producer::Gateway,
            Producer::Admission,
            Producer::Quota,
            Producer::Placement,
            Producer::Preemption,
            Producer::Agent,
        ] {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", producer_name(p)));
        }
    }

    #[test]
    fn aggregates_follow_the_subject() {
        let ev = Event::JobStarted {
            job: JobId(42),
            at: Timestamp(5),
        };
        assert_eq!(aggregate_of(&ev), (AggregateKind::Job, "42".to_string()));
        assert_eq!(ev.job(), Some(JobId(42)));
        let ev = Event::NodeCordoned { node: NodeId(3) };
        assert_eq!(aggregate_of(&ev), (AggregateKind::Node, "3".to_string()));
    }
}
