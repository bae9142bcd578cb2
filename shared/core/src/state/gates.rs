//! Gates a queued job passes before it joins its tenant's queue: its
//! dependencies (`after_ok`, `after`) and its array's limit on tasks at
//! once (`%N`).
//!
//! Owns: the dependency index (a job → the queued jobs waiting for it to
//! end), the queued jobs whose `after_ok` dependency ended otherwise (the
//! admission stage cancels each with `JobDependencyFailed`), and each
//! limited array's slots: a task takes a slot when it joins its tenant's
//! queue and gives it back only when it ends, so at most `N` of an
//! array's tasks are queued for quota or hold it at once (a requeued task
//! keeps its slot).
//!
//! Must never: admit, charge or cancel a job itself; it only decides when
//! a queued job joins its tenant's queue. A dependency must have been
//! submitted before its dependent (a lower submit order), so no cycle can
//! form.

use super::{ApplyError, Phase, QueueKey, State};
use gpusched_model::{ArrayTask, DependencyKind, JobId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What a job being accepted waits for.
#[derive(Debug, Default)]
pub(super) struct Waits {
    /// Dependencies not ended yet.
    on: BTreeSet<JobId>,
    /// The first `after_ok` dependency that ended without succeeding.
    failed: Option<JobId>,
}

/// The gates' indexes (part of [`State`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Gates {
    /// A job → queued jobs waiting for it to end.
    dependents: BTreeMap<JobId, BTreeSet<JobId>>,
    /// Queued jobs whose `after_ok` dependency ended without succeeding.
    failed: BTreeSet<JobId>,
    /// Arrays with a limit, by array id.
    arrays: BTreeMap<u64, ArraySlots>,
}

/// One limited array's slots.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArraySlots {
    /// At most this many tasks queued for quota or holding it (`%N`).
    pub limit: u32,
    /// Tasks holding a slot.
    pub taken: u32,
    /// Tasks ready but for a slot, by priority then submit order.
    pub waiting: BTreeSet<QueueKey>,
}

/// What one dependency is to a job of `tenant` ([`State::dependency`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dependency {
    /// Not ended yet: the job waits for it.
    Pending,
    /// Ended as required: nothing to wait for.
    Met,
    /// An `after_ok` dependency that ended in this phase, not succeeded:
    /// the job can never run.
    Failed(Phase),
    /// No job of the tenant has this id.
    NotOfTenant,
    /// Submitted after the job (or is the job): waiting on it could close
    /// a cycle.
    NotEarlier,
}

impl State {
    /// What job `dep` is, as a dependency of kind `kind`, to a job of
    /// `tenant` submitted at `order` (`None`: not submitted yet, so any
    /// job is earlier). The one rule admission and `apply` both read.
    pub fn dependency(
        &self,
        tenant: &str,
        order: Option<u64>,
        dep: JobId,
        kind: DependencyKind,
    ) -> Dependency {
        let Some(d) = self.jobs.get(&dep).filter(|d| d.spec.tenant == tenant) else {
            return Dependency::NotOfTenant;
        };
        if order.is_some_and(|o| d.order >= o) {
            return Dependency::NotEarlier;
        }
        match d.phase {
            p if !p.is_terminal() => Dependency::Pending,
            p if kind == DependencyKind::AfterOk && p != Phase::Succeeded => Dependency::Failed(p),
            _ => Dependency::Met,
        }
    }

    /// Checks each dependency of a job about to be accepted is an earlier
    /// job of its tenant; returns those it must wait for and the first
    /// `after_ok` one that already ended without succeeding. Changes
    /// nothing.
    pub(super) fn check_dependencies(&self, id: JobId) -> Result<Waits, ApplyError> {
        let j = self.jobs.get(&id).ok_or(ApplyError::UnknownJob(id))?;
        let mut waits = Waits::default();
        for (dep, kind) in j.spec.dependencies() {
            match self.dependency(&j.spec.tenant, Some(j.order), dep, kind) {
                Dependency::Pending => {
                    waits.on.insert(dep);
                }
                Dependency::Failed(_) => {
                    waits.failed.get_or_insert(dep);
                }
                Dependency::Met => {}
                Dependency::NotOfTenant | Dependency::NotEarlier => {
                    return Err(ApplyError::BadDependency {
                        job: id,
                        dependency: dep,
                    })
                }
            }
        }
        Ok(waits)
    }

    /// On acceptance: records what the job waits for (checked by
    /// [`State::check_dependencies`]), and lets it join its tenant's queue
    /// when that is nothing.
    pub(super) fn gate_accepted(&mut self, id: JobId, waits: Waits) {
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if waits.failed.is_some() {
            j.failed_dependency = waits.failed;
            self.gates.failed.insert(id);
            return;
        }
        for dep in &waits.on {
            self.gates.dependents.entry(*dep).or_default().insert(id);
        }
        let done = waits.on.is_empty();
        j.waiting_on = waits.on;
        if done {
            self.make_eligible(id);
        }
    }

    /// The job joins its tenant's queue, or its array's wait for a slot.
    fn make_eligible(&mut self, id: JobId) {
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        let key = j.queue_key();
        if let Some((array, limit)) = limited_array(j.spec.array) {
            let slots = self.gates.arrays.entry(array).or_insert(ArraySlots {
                limit,
                taken: 0,
                waiting: BTreeSet::new(),
            });
            if slots.taken >= slots.limit {
                slots.waiting.insert(key);
                return;
            }
            slots.taken += 1;
            j.array_slot = true;
        }
        if let Some(t) = j.tenant {
            let tenant = &mut self.tenants[t as usize];
            tenant.pending.insert(key);
            tenant.version += 1;
        }
    }

    /// The job ended: it waits for nothing more, gives back its array
    /// slot, and what waited for it moves on (or fails).
    pub(super) fn gate_ended(&mut self, id: JobId, phase: Phase) {
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        let waiting = std::mem::take(&mut j.waiting_on);
        let (key, array, had_slot) = (
            j.queue_key(),
            limited_array(j.spec.array),
            std::mem::take(&mut j.array_slot),
        );
        self.stop_waiting(id, &waiting);
        self.gates.failed.remove(&id);
        if let Some((array, _)) = array {
            self.leave_array(array, key, had_slot);
        }
        for d in self.gates.dependents.remove(&id).unwrap_or_default() {
            self.dependency_ended(d, id, phase);
        }
    }

    /// `job` no longer waits on `deps`.
    fn stop_waiting(&mut self, job: JobId, deps: &BTreeSet<JobId>) {
        for dep in deps {
            if let Some(set) = self.gates.dependents.get_mut(dep) {
                set.remove(&job);
                if set.is_empty() {
                    self.gates.dependents.remove(dep);
                }
            }
        }
    }

    /// A task of a limited array ended: its slot (if it had one) goes to
    /// the first task waiting for one.
    fn leave_array(&mut self, array: u64, key: QueueKey, had_slot: bool) {
        let Some(slots) = self.gates.arrays.get_mut(&array) else {
            return;
        };
        if !had_slot {
            slots.waiting.remove(&key);
        } else {
            slots.taken = slots.taken.saturating_sub(1);
            if let Some(next) = slots.waiting.pop_first() {
                self.make_eligible(next.job);
            }
        }
        if let Some(slots) = self.gates.arrays.get(&array) {
            if slots.taken == 0 && slots.waiting.is_empty() {
                self.gates.arrays.remove(&array);
            }
        }
    }

    /// `dep`, which `job` waited on, ended in `phase`.
    fn dependency_ended(&mut self, job: JobId, dep: JobId, phase: Phase) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.waiting_on.remove(&dep);
        let must_succeed = j.spec.after_ok.contains(&dep);
        if must_succeed && phase != Phase::Succeeded {
            j.failed_dependency = Some(dep);
            let rest = std::mem::take(&mut j.waiting_on);
            self.stop_waiting(job, &rest);
            self.gates.failed.insert(job);
        } else if j.waiting_on.is_empty() {
            self.make_eligible(job);
        }
    }

    /// Checks a `JobDependencyFailed`: the job is queued and `dependency`
    /// is the one that failed it.
    pub(super) fn check_dependency_failed(
        &self,
        job: JobId,
        dependency: JobId,
        kind: &'static str,
    ) -> Result<(), ApplyError> {
        let j = self.expect_phase(job, &[Phase::Queued], kind)?;
        if j.failed_dependency != Some(dependency) {
            return Err(ApplyError::BadDependency { job, dependency });
        }
        Ok(())
    }

    /// Queued jobs whose `after_ok` dependency ended without succeeding,
    /// oldest id first: the admission stage cancels each.
    pub fn dependency_failed(&self) -> impl Iterator<Item = JobId> + '_ {
        self.gates.failed.iter().copied()
    }

    /// A limited array's slots, if it has a limit and a task not ended.
    pub fn array_slots(&self, array: u64) -> Option<&ArraySlots> {
        self.gates.arrays.get(&array)
    }

    /// Checks the gates' indexes against the jobs (for `check_invariants`).
    pub(super) fn check_gates(&self) -> Result<(), String> {
        let mut dependents: BTreeMap<JobId, BTreeSet<JobId>> = BTreeMap::new();
        let mut taken: BTreeMap<u64, u32> = BTreeMap::new();
        for j in self.jobs.values() {
            let waits = !j.waiting_on.is_empty() || j.failed_dependency.is_some();
            if waits && j.phase != Phase::Queued && !j.phase.is_terminal() {
                return Err(format!(
                    "job {} waits on a dependency in {:?}",
                    j.id, j.phase
                ));
            }
            if j.phase.is_terminal() && (!j.waiting_on.is_empty() || j.array_slot) {
                return Err(format!("job {} ended still gated", j.id));
            }
            for dep in &j.waiting_on {
                dependents.entry(*dep).or_default().insert(j.id);
                if self.jobs.get(dep).is_none_or(|d| d.phase.is_terminal()) {
                    return Err(format!("job {} waits on ended job {dep}", j.id));
                }
            }
            let failed = j.phase == Phase::Queued && j.failed_dependency.is_some();
            if failed != self.gates.failed.contains(&j.id) {
                return Err(format!("job {}: failed-dependency index drifted", j.id));
            }
            let limited = limited_array(j.spec.array);
            if let (Some((array, _)), true) = (limited, j.array_slot) {
                *taken.entry(array).or_default() += 1;
            }
            let past_queue = !matches!(j.phase, Phase::Submitted | Phase::Queued);
            if limited.is_some() && past_queue && !j.phase.is_terminal() && !j.array_slot {
                return Err(format!("job {} runs without an array slot", j.id));
            }
            let gated = waits || limited_array(j.spec.array).is_some() && !j.array_slot;
            let in_queue = j
                .tenant
                .is_some_and(|t| self.tenants[t as usize].pending.contains(&j.queue_key()));
            if j.phase == Phase::Queued && gated && in_queue {
                return Err(format!("job {} is in its tenant's queue while gated", j.id));
            }
        }
        if dependents != self.gates.dependents {
            return Err("dependency index drifted".into());
        }
        for (array, slots) in &self.gates.arrays {
            if taken.get(array).copied().unwrap_or(0) != slots.taken || slots.taken > slots.limit {
                return Err(format!("array {array}: slots drifted"));
            }
            if !slots.waiting.is_empty() && slots.taken < slots.limit {
                return Err(format!("array {array}: a slot is free while a task waits"));
            }
        }
        Ok(())
    }
}

/// The array and its limit, when the job is a task of a limited array.
fn limited_array(task: Option<ArrayTask>) -> Option<(u64, u32)> {
    task.and_then(|a| a.max_running.map(|n| (a.array, n)))
}
