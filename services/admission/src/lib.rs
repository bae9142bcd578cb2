//! The admission service: validates submissions against the cluster
//! (flavors, topology, tenants) and accepts or rejects them.
//!
//! Owns: `JobAccepted` and `JobRejected`. Must never: charge quota or
//! place anything.

use gpusched_core::{admission, State};
use gpusched_events::{Event, Producer};
use gpusched_model::Timestamp;
use gpusched_runtime::Decider;

/// Lease and consumer name.
pub const SERVICE: &str = "admission";

/// The admission stage as a decider.
#[derive(Debug)]
pub struct AdmissionStage {
    max_validations: usize,
}

impl AdmissionStage {
    /// Validates at most `max_validations` submissions per cycle.
    pub fn new(max_validations: usize) -> Self {
        AdmissionStage { max_validations }
    }
}

impl Decider for AdmissionStage {
    fn producer(&self) -> Producer {
        Producer::Admission
    }

    fn decide(&mut self, state: &State, now: Timestamp) -> Vec<Event> {
        admission::decide(state, self.max_validations, now)
    }
}
