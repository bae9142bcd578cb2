//! Recovery: requeues the jobs of lost nodes.
//!
//! Owns: the decision that a gang with any worker on a lost node loses all
//! its GPUs and goes back to its queue, and the count of work lost.
//!
//! Must never: touch jobs on healthy nodes.

use crate::state::State;
use gpusched_events::{Event, RequeueReason};
use gpusched_model::{NodeId, Timestamp};

/// Requeue decisions for every job holding GPUs on a lost node.
pub fn decide(state: &State, now: Timestamp) -> Vec<Event> {
    let mut out = Vec::new();
    for id in state.orphaned() {
        let Some(job) = state.job(id) else { continue };
        if !job.phase.holds_gpus() {
            continue;
        }
        let lost_node = job
            .assignments
            .iter()
            .map(|a| a.node)
            .find(|n| {
                state
                    .nodes()
                    .get(n.index())
                    .is_some_and(|node| node.status == crate::state::NodeStatus::Lost)
            })
            .unwrap_or(NodeId(u32::MAX));
        // Work since the last complete checkpoint (or the run's start) is
        // lost; a bound job that never started lost nothing.
        let lost_gpu_ms = job.spec.total_gpus() as u64 * job.unsaved_ms(now);
        out.push(Event::JobRequeued {
            job: id,
            reason: RequeueReason::NodeLost { node: lost_node },
            lost_gpu_ms,
            at: now,
        });
    }
    out
}
