//! Where every allocated GPU-hour went, and where every waiting one waited:
//! goodput accounting as a fold over the log (docs/goodput.md).
//!
//! Owns: the rule that splits a job's time into its parts, per job, per
//! tenant and overall. A job's GPUs are *allocated* from its binding to
//! the end of that hold (finished, preempted, requeued, cancelled); each
//! allocated GPU-ms is exactly one of:
//!
//! - **useful**: work that survived to completion or to a complete
//!   checkpoint (a run that succeeds: all of it; any other run: the part a
//!   complete checkpoint taken in that run captured);
//! - **recovery**: work *lost* since the last complete checkpoint (a
//!   preemption that did not wait for a checkpoint, a lost node), the
//!   *checkpoint* time a victim spent on request (from its requested
//!   checkpoint's capture to its stop: work done meanwhile is discarded),
//!   and the *restart* time of every resumed run (binding → start);
//! - **startup**: binding → start of a job's first run;
//! - **unsaved at end**: work of a run that failed, timed out or was
//!   cancelled, after its last complete checkpoint.
//!
//! Goodput is useful ÷ allocated. *Capacity wait* is kept apart from both:
//! GPU-ms a job waited (its GPUs × the time from submission, or from its
//! preemption or requeue, to its binding), split by the reason in force
//! ([`WaitReason`]). The three are never folded into one.
//!
//! A run's work is its wall time (a job progresses while it runs, as the
//! agents report checkpoints: by progress, absolute). Holds and waits are
//! counted when they close; [`Goodput::totals`] adds the open ones' closed
//! parts, so a job still running counts nothing of its current run yet.
//!
//! Must never: read a clock (every duration is between two events' own
//! `at`), count a superseded event, or keep more than the jobs not ended
//! (per-job accounts of ended jobs only when asked, for one job's answer).

use std::collections::BTreeMap;

use gpusched_events::{Event, Outcome, PendingReason};
use gpusched_model::{JobId, Timestamp};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// Why a job waited for capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// No stage had given a reason yet: between submission (or admission)
    /// and the next cycle of the stage that holds it.
    Queued,
    /// Its tenant's quota (nominal plus what it may borrow, or its GPU-hour
    /// budget for the period) was used.
    Quota,
    /// Its cohort had nothing left to lend.
    CohortExhausted,
    /// No topology domain had room for the gang.
    NoDomainFits,
    /// Holding a reservation until its nodes free up.
    Reservation,
    /// Strict FIFO: behind a blocked head.
    BehindHead,
    /// Requeued after a preemption or a lost node, until bound again.
    Requeued,
}

impl WaitReason {
    /// Every reason, in report order.
    pub const ALL: [WaitReason; 7] = [
        WaitReason::Queued,
        WaitReason::Quota,
        WaitReason::CohortExhausted,
        WaitReason::NoDomainFits,
        WaitReason::Reservation,
        WaitReason::BehindHead,
        WaitReason::Requeued,
    ];

    /// The reason's label in reports: `quota`, `no_domain_fits`, …
    pub fn label(self) -> &'static str {
        match self {
            WaitReason::Queued => "queued",
            WaitReason::Quota => "quota",
            WaitReason::CohortExhausted => "cohort_exhausted",
            WaitReason::NoDomainFits => "no_domain_fits",
            WaitReason::Reservation => "reservation",
            WaitReason::BehindHead => "behind_head",
            WaitReason::Requeued => "requeued",
        }
    }

    fn of(reason: &PendingReason) -> WaitReason {
        match reason {
            PendingReason::QuotaExceeded { .. } | PendingReason::BudgetSpent { .. } => {
                WaitReason::Quota
            }
            PendingReason::CohortExhausted { .. } => WaitReason::CohortExhausted,
            PendingReason::NoDomainFits { .. } => WaitReason::NoDomainFits,
            PendingReason::BehindHead { .. } => WaitReason::BehindHead,
            // Stages never write these (they are read from the state):
            // the job waits in its queue as far as capacity goes.
            PendingReason::WaitingForJobs { .. }
            | PendingReason::ArrayLimit { .. }
            | PendingReason::DependencyFailed { .. } => WaitReason::Queued,
        }
    }
}

/// GPU-ms by part (module docs). All fields add: accounts of two jobs sum
/// to the account of both.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Account {
    /// GPUs held, binding → end of each hold.
    pub allocated_gpu_ms: u64,
    /// Work that survived to completion or to a complete checkpoint.
    pub useful_gpu_ms: u64,
    /// Recovery: work lost since the last complete checkpoint.
    pub lost_gpu_ms: u64,
    /// Recovery: a victim's requested checkpoint, capture → stop.
    pub checkpoint_gpu_ms: u64,
    /// Recovery: binding → start of each resumed run.
    pub restart_gpu_ms: u64,
    /// Binding → start of the first run.
    pub startup_gpu_ms: u64,
    /// Work of failed, timed-out or cancelled runs after their last
    /// complete checkpoint.
    pub unsaved_at_end_gpu_ms: u64,
    /// Capacity wait by reason, GPU-ms (the job's GPUs × the time).
    pub wait_gpu_ms: BTreeMap<WaitReason, u64>,
    /// Holds closed (one per binding that ended).
    pub holds: u64,
    /// Holds ended by a preemption.
    pub preemptions: u64,
}

impl Account {
    /// Recovery in all: lost + checkpoint + restart.
    pub fn recovery_gpu_ms(&self) -> u64 {
        self.lost_gpu_ms + self.checkpoint_gpu_ms + self.restart_gpu_ms
    }

    /// Capacity wait in all.
    pub fn wait_total_gpu_ms(&self) -> u64 {
        self.wait_gpu_ms.values().sum()
    }

    /// Useful ÷ allocated; `None` before anything was allocated.
    pub fn goodput(&self) -> Option<f64> {
        (self.allocated_gpu_ms > 0)
            .then(|| self.useful_gpu_ms as f64 / self.allocated_gpu_ms as f64)
    }

    /// The parts of every allocated GPU-ms added up: equal to
    /// `allocated_gpu_ms` (the accounting's invariant).
    pub fn parts_gpu_ms(&self) -> u64 {
        self.useful_gpu_ms
            + self.recovery_gpu_ms()
            + self.startup_gpu_ms
            + self.unsaved_at_end_gpu_ms
    }

    /// Adds `other` to this account.
    pub fn add(&mut self, other: &Account) {
        self.allocated_gpu_ms += other.allocated_gpu_ms;
        self.useful_gpu_ms += other.useful_gpu_ms;
        self.lost_gpu_ms += other.lost_gpu_ms;
        self.checkpoint_gpu_ms += other.checkpoint_gpu_ms;
        self.restart_gpu_ms += other.restart_gpu_ms;
        self.startup_gpu_ms += other.startup_gpu_ms;
        self.unsaved_at_end_gpu_ms += other.unsaved_at_end_gpu_ms;
        for (r, ms) in &other.wait_gpu_ms {
            *self.wait_gpu_ms.entry(*r).or_default() += ms;
        }
        self.holds += other.holds;
        self.preemptions += other.preemptions;
    }

    fn wait(&mut self, reason: WaitReason, gpu_ms: u64) {
        if gpu_ms > 0 {
            *self.wait_gpu_ms.entry(reason).or_default() += gpu_ms;
        }
    }
}

/// An account in GPU-hours, for reports (JSON and text alike).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Allocated GPU-hours.
    pub allocated_gpu_hours: f64,
    /// Useful GPU-hours.
    pub useful_gpu_hours: f64,
    /// Recovery GPU-hours: lost + checkpoint + restart.
    pub recovery_gpu_hours: f64,
    /// Work lost since the last complete checkpoint.
    pub lost_gpu_hours: f64,
    /// Checkpoints on request (capture → stop).
    pub checkpoint_gpu_hours: f64,
    /// Restarts (binding → start of resumed runs).
    pub restart_gpu_hours: f64,
    /// First runs' binding → start.
    pub startup_gpu_hours: f64,
    /// Failed, timed-out or cancelled runs' unsaved work.
    pub unsaved_at_end_gpu_hours: f64,
    /// Useful ÷ allocated (0 when nothing was allocated).
    pub goodput: f64,
    /// Capacity wait in all, GPU-hours.
    pub wait_gpu_hours: f64,
    /// Capacity wait by reason label, GPU-hours.
    pub wait_by_reason_gpu_hours: BTreeMap<&'static str, f64>,
    /// Holds ended by a preemption.
    pub preemptions: u64,
}

fn hours(gpu_ms: u64) -> f64 {
    gpu_ms as f64 / 3_600_000.0
}

impl Account {
    /// The account in GPU-hours.
    pub fn summary(&self) -> Summary {
        Summary {
            allocated_gpu_hours: hours(self.allocated_gpu_ms),
            useful_gpu_hours: hours(self.useful_gpu_ms),
            recovery_gpu_hours: hours(self.recovery_gpu_ms()),
            lost_gpu_hours: hours(self.lost_gpu_ms),
            checkpoint_gpu_hours: hours(self.checkpoint_gpu_ms),
            restart_gpu_hours: hours(self.restart_gpu_ms),
            startup_gpu_hours: hours(self.startup_gpu_ms),
            unsaved_at_end_gpu_hours: hours(self.unsaved_at_end_gpu_ms),
            goodput: self.goodput().unwrap_or(0.0),
            wait_gpu_hours: hours(self.wait_total_gpu_ms()),
            wait_by_reason_gpu_hours: self
                .wait_gpu_ms
                .iter()
                .map(|(r, ms)| (r.label(), hours(*ms)))
                .collect(),
            preemptions: self.preemptions,
        }
    }
}

impl Summary {
    /// Two lines for a text report: where the allocated GPU-hours went,
    /// and where the waiting ones waited.
    pub fn lines(&self) -> [String; 2] {
        let waits: Vec<String> = self
            .wait_by_reason_gpu_hours
            .iter()
            .map(|(r, h)| format!("{r} {h:.1}"))
            .collect();
        [
            format!(
                "goodput {:.1}% of {:.1} GPU-h allocated: useful {:.1}, recovery {:.1} (lost {:.1}, checkpoint {:.1}, restart {:.1}), startup {:.1}, unsaved at end {:.1}",
                self.goodput * 100.0,
                self.allocated_gpu_hours,
                self.useful_gpu_hours,
                self.recovery_gpu_hours,
                self.lost_gpu_hours,
                self.checkpoint_gpu_hours,
                self.restart_gpu_hours,
                self.startup_gpu_hours,
                self.unsaved_at_end_gpu_hours
            ),
            format!(
                "capacity wait {:.1} GPU-h{}{}",
                self.wait_gpu_hours,
                if waits.is_empty() { "" } else { ": " },
                waits.join(", ")
            ),
        ]
    }
}

/// How a hold ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HoldEnd {
    Succeeded,
    Preempted,
    Requeued,
    Abandoned,
}

/// A job not ended yet: where it is and what it has accounted so far.
#[derive(Clone, Debug)]
struct Track {
    tenant: String,
    gpus: u64,
    /// Waiting since, and why.
    wait: Option<(Timestamp, WaitReason)>,
    /// Bound at (while it holds GPUs).
    bound_at: Option<Timestamp>,
    /// Its current run started at.
    started_at: Option<Timestamp>,
    /// A run before this one ended (the next start is a restart).
    resumed: bool,
    /// Work done when the current run started (its checkpoint's), ms.
    resume_ms: u64,
    /// Work its last complete checkpoint holds, ms.
    saved_ms: u64,
    /// Chosen as a victim at (while preempting).
    chosen_at: Option<Timestamp>,
    /// A checkpoint completed since it was chosen.
    requested_saved: bool,
    acc: Account,
}

impl Track {
    /// Back in the queue at `at`, to resume from `resume_ms` of work.
    fn requeue(&mut self, resume_ms: u64, at: Timestamp) {
        self.resume_ms = resume_ms;
        self.saved_ms = self.saved_ms.max(resume_ms);
        self.wait = Some((at, WaitReason::Requeued));
    }

    fn close_wait(&mut self, at: Timestamp) {
        if let Some((since, reason)) = self.wait.take() {
            let ms = at.millis_since(since);
            self.acc.wait(reason, self.gpus * ms);
        }
    }

    /// Moves the wait to `reason` from `at` (a requeued job stays requeued
    /// until bound).
    fn wait_for(&mut self, reason: WaitReason, at: Timestamp) {
        match self.wait {
            Some((_, WaitReason::Requeued)) => {}
            Some((_, r)) if r == reason => {}
            Some(_) => {
                self.close_wait(at);
                self.wait = Some((at, reason));
            }
            None => {}
        }
    }

    /// Ends the hold at `at`: every GPU-ms of it goes to one part.
    fn close_hold(&mut self, at: Timestamp, end: HoldEnd) {
        let Some(bound) = self.bound_at.take() else {
            return;
        };
        let g = self.gpus;
        let started = self.started_at.take();
        let before_start = started.map_or(at, |s| s.min(at)).millis_since(bound);
        if self.resumed {
            self.acc.restart_gpu_ms += g * before_start;
        } else {
            self.acc.startup_gpu_ms += g * before_start;
        }
        let run = started.map_or(0, |s| at.millis_since(s));
        let saved = self.saved_ms.saturating_sub(self.resume_ms).min(run);
        let tail = run - saved;
        self.acc.useful_gpu_ms += g * saved;
        match end {
            HoldEnd::Succeeded => self.acc.useful_gpu_ms += g * tail,
            HoldEnd::Preempted if self.requested_saved => self.acc.checkpoint_gpu_ms += g * tail,
            HoldEnd::Preempted | HoldEnd::Requeued => self.acc.lost_gpu_ms += g * tail,
            HoldEnd::Abandoned => self.acc.unsaved_at_end_gpu_ms += g * tail,
        }
        self.acc.allocated_gpu_ms += g * at.millis_since(bound);
        self.acc.holds += 1;
        if end == HoldEnd::Preempted {
            self.acc.preemptions += 1;
        }
        self.resumed = true;
        self.chosen_at = None;
        self.requested_saved = false;
    }
}

/// The accounts of a log folded so far (module docs).
#[derive(Clone, Debug, Default)]
pub struct Goodput {
    /// Per tenant: jobs that ended.
    ended: BTreeMap<String, Account>,
    /// Jobs not ended.
    live: FxHashMap<JobId, Track>,
    /// Accounts of ended jobs, kept only by [`Goodput::keeping_jobs`].
    jobs: Option<FxHashMap<JobId, Account>>,
}

impl Goodput {
    /// An accounting that also keeps each ended job's account (for one
    /// job's events, or a short log).
    pub fn keeping_jobs() -> Self {
        Goodput {
            jobs: Some(FxHashMap::default()),
            ..Goodput::default()
        }
    }

    /// Accounts `ev` (`applied` false: superseded, not counted). Events of
    /// jobs it never saw submitted are ignored.
    pub fn observe(&mut self, ev: &Event, applied: bool) {
        if !applied {
            return;
        }
        if let Event::JobSubmitted { job, spec, at } = ev {
            self.live.insert(
                *job,
                Track {
                    tenant: spec.tenant.clone(),
                    gpus: u64::from(spec.total_gpus()),
                    wait: Some((*at, WaitReason::Queued)),
                    bound_at: None,
                    started_at: None,
                    resumed: false,
                    resume_ms: 0,
                    saved_ms: 0,
                    chosen_at: None,
                    requested_saved: false,
                    acc: Account::default(),
                },
            );
            return;
        }
        if let Event::PreemptionPlanned { victims, at, .. }
        | Event::EvictionPlanned { victims, at, .. } = ev
        {
            for v in victims {
                if let Some(t) = self.live.get_mut(&v.job) {
                    t.chosen_at = Some(*at);
                    t.requested_saved = false;
                }
            }
            return;
        }
        let Some(job) = ev.job() else { return };
        let Some(t) = self.live.get_mut(&job) else {
            return;
        };
        match ev {
            Event::JobRejected { .. } => {
                self.live.remove(&job);
            }
            Event::JobAdmitted { at, .. } => t.wait_for(WaitReason::Queued, *at),
            Event::JobPending { reason, at, .. } => t.wait_for(WaitReason::of(reason), *at),
            Event::ReservationMade { at, .. } => t.wait_for(WaitReason::Reservation, *at),
            Event::JobBound { at, .. } => {
                t.close_wait(*at);
                t.bound_at = Some(*at);
            }
            Event::JobStarted { at, .. } => {
                t.started_at = Some(*at);
            }
            Event::JobCheckpointed {
                progress_ms, at, ..
            } => {
                t.saved_ms = t.saved_ms.max(*progress_ms);
                if t.chosen_at.is_some_and(|c| *at >= c) {
                    t.requested_saved = true;
                }
            }
            Event::JobPreempted {
                resume_from, at, ..
            } => {
                t.close_hold(*at, HoldEnd::Preempted);
                t.requeue(resume_from.as_ref().map_or(0, |c| c.progress_ms), *at);
            }
            Event::JobRequeued { at, .. } => {
                t.close_hold(*at, HoldEnd::Requeued);
                let resume = t.saved_ms;
                t.requeue(resume, *at);
            }
            Event::JobFinished { outcome, at, .. } => {
                let end = match outcome {
                    Outcome::Succeeded => HoldEnd::Succeeded,
                    _ => HoldEnd::Abandoned,
                };
                t.close_hold(*at, end);
                t.close_wait(*at);
                self.end(job);
            }
            Event::JobCancelled { at, .. } | Event::JobDependencyFailed { at, .. } => {
                t.close_hold(*at, HoldEnd::Abandoned);
                t.close_wait(*at);
                self.end(job);
            }
            _ => {}
        }
    }

    fn end(&mut self, job: JobId) {
        let Some(t) = self.live.remove(&job) else {
            return;
        };
        self.ended.entry(t.tenant.clone()).or_default().add(&t.acc);
        if let Some(jobs) = self.jobs.as_mut() {
            jobs.insert(job, t.acc);
        }
    }

    /// Per tenant: ended jobs' accounts plus the closed parts of the
    /// others'.
    pub fn totals(&self) -> BTreeMap<String, Account> {
        let mut out = self.ended.clone();
        for t in self.live.values() {
            out.entry(t.tenant.clone()).or_default().add(&t.acc);
        }
        out
    }

    /// Every tenant's [`Goodput::totals`] added up.
    pub fn overall(&self) -> Account {
        let mut all = Account::default();
        for a in self.totals().values() {
            all.add(a);
        }
        all
    }

    /// One job's account so far: its closed parts, and, when `now` is
    /// given, its open wait up to `now` (`None`: a job not seen, or ended
    /// without [`Goodput::keeping_jobs`]).
    pub fn job(&self, job: JobId, now: Option<Timestamp>) -> Option<Account> {
        if let Some(t) = self.live.get(&job) {
            let mut acc = t.acc.clone();
            if let (Some(now), Some((since, reason))) = (now, t.wait) {
                acc.wait(reason, t.gpus * now.millis_since(since));
            }
            return Some(acc);
        }
        self.jobs.as_ref()?.get(&job).cloned()
    }

    /// Jobs it tracks now (not ended): what bounds its memory.
    pub fn in_flight(&self) -> usize {
        self.live.len()
    }
}

/// One job's account from its own events, in log order, as of `now` (its
/// open wait counted up to then).
pub fn job_account<'a>(
    job: JobId,
    events: impl IntoIterator<Item = &'a Event>,
    now: Option<Timestamp>,
) -> Option<Account> {
    let mut g = Goodput::keeping_jobs();
    for ev in events {
        g.observe(ev, true);
    }
    g.job(job, now)
}

#[cfg(test)]
mod tests;
