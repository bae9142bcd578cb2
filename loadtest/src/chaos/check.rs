//! The chaos run's verdict, read from the log itself (folded with the
//! core's `State`, as every service and replay folds it) and from what
//! each job's client saw.
//!
//! Per phase: jobs accepted (a 2xx), ended, lost (accepted but missing
//! from the log, or never ending), duplicated (two jobs for one key, a job
//! submitted twice, a job the client never asked for, or a job finished
//! twice — a `JobFinished` that lost a race to another writer ending the
//! same run, a preemption, cancellation or requeue, is superseded by the
//! fold and legitimate), wrongly refused (a valid job answered 4xx or
//! rejected by admission), given up (no answer for the whole retry
//! window), the longest stall (an interval with work waiting for a
//! decision where the log did not grow) and the time from the fault's end
//! to deciding again.
//!
//! Owns: the fold of the log for the checks, the stall and recovery
//! measures, and which finding fails a phase.
//!
//! Must never: do I/O, read the clock, or count a job twice in one column.

use std::collections::{BTreeMap, BTreeSet};

use gpusched_core::{Phase, State};
use gpusched_events::Event;
use gpusched_store::StoredEvent;
use serde::Serialize;

use super::load::{JobRecord, Outcome};
use super::plan::{Fault, Goals};

/// Gaps shorter than this are not recorded.
const MIN_GAP_MS: u64 = 50;
/// A running job is overdue this long after its simulated runtime ended.
const RUN_SLACK_MS: u64 = 300;
/// What the simulated agent runs a job without a declared runtime for, s.
pub const DEFAULT_RUNTIME_S: u64 = 600;

/// What happened in one phase, as the run recorded it (Unix ms).
#[derive(Clone, Debug, Serialize)]
pub struct PhaseRun {
    /// The fault.
    pub fault: Fault,
    /// The phase began (steady load before the fault).
    pub start_ms: u64,
    /// The phase ended (the next one begins).
    pub end_ms: u64,
    /// The fault was injected.
    pub fault_start_ms: u64,
    /// The fault was over (process restarted, server back, pause ended).
    pub fault_end_ms: u64,
    /// What was done.
    pub detail: String,
    /// The fault could not be injected as planned.
    pub error: Option<String>,
    /// A restarted instance became ready to decide (its stats file).
    pub ready_ms: Option<u64>,
    /// Service processes that exited on their own during the phase.
    pub crashes: Vec<String>,
    /// Accepted jobs not in the log when the phase ended.
    pub missing_after: u64,
}

/// An interval without appends while work waited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Gap {
    /// From, Unix ms.
    pub from_ms: u64,
    /// To, Unix ms.
    pub to_ms: u64,
}

impl Gap {
    fn overlap(&self, from: u64, to: u64) -> u64 {
        self.to_ms.min(to).saturating_sub(self.from_ms.max(from))
    }
}

/// Running jobs by the time they are overdue.
#[derive(Default)]
struct Due {
    by_time: BTreeSet<(u64, u64)>,
    by_job: BTreeMap<u64, u64>,
}

impl Due {
    fn set(&mut self, job: u64, due: Option<u64>) {
        if let Some(old) = self.by_job.remove(&job) {
            self.by_time.remove(&(old, job));
        }
        if let Some(d) = due {
            self.by_job.insert(job, d);
            self.by_time.insert((d, job));
        }
    }

    fn earliest(&self) -> Option<u64> {
        self.by_time.first().map(|(d, _)| *d)
    }
}

/// The log folded for the checks.
#[derive(Default)]
pub struct Fold {
    /// The state after every event.
    pub state: State,
    /// `JobSubmitted` per job.
    pub submitted: BTreeMap<u64, u32>,
    /// When each job was submitted (log time, ms).
    pub submit_ms: BTreeMap<u64, u64>,
    /// Jobs per idempotency key of `JobSubmitted`.
    pub key_jobs: BTreeMap<String, BTreeSet<u64>>,
    /// Jobs submitted without a key.
    pub unkeyed: Vec<u64>,
    /// Applied `JobFinished` per job.
    pub finished: BTreeMap<u64, u32>,
    /// Superseded `JobFinished` that no other writer's end of the run explains: (job, seq).
    pub stray_finishes: Vec<(u64, u64)>,
    /// Superseded `JobFinished` that lost a race to a preemption, cancellation or requeue.
    pub raced_finishes: u64,
    /// First `JobBound` of each job, ms.
    pub first_bound_ms: BTreeMap<u64, u64>,
    /// Append times per producer (monotone), ms.
    pub appends: BTreeMap<String, Vec<u64>>,
    /// Stalls.
    pub stalls: Vec<Gap>,
    /// Appends under an epoch older than one the same producer had used.
    pub fencing: Vec<String>,
    time_scale: f64,
    due: Due,
    last_turn: BTreeMap<u64, &'static str>,
    max_epoch: BTreeMap<String, u64>,
}

fn waiting(s: &State) -> u64 {
    let c = s.phase_counts();
    [
        Phase::Submitted,
        Phase::Queued,
        Phase::Admitted,
        Phase::Bound,
        Phase::Preempting,
    ]
    .iter()
    .map(|p| c.get(*p))
    .sum()
}

impl Fold {
    /// Folds `events` (in sequence order); the log is followed until `end_ms`.
    pub fn run(events: &[StoredEvent], time_scale: f64, end_ms: u64) -> Fold {
        let mut f = Fold {
            time_scale: if time_scale > 0.0 { time_scale } else { 1.0 },
            ..Fold::default()
        };
        let mut prev: Option<u64> = None;
        for e in events {
            let at = (e.recorded_at.timestamp_millis().max(0) as u64).max(prev.unwrap_or(0));
            if let Some(t0) = prev {
                f.note_gap(t0, at);
            }
            f.step(e, at);
            prev = Some(at);
        }
        if let Some(t0) = prev {
            f.note_gap(t0, end_ms);
        }
        f
    }

    fn note_gap(&mut self, t0: u64, t1: u64) {
        let from = if waiting(&self.state) > 0 {
            t0
        } else {
            match self.due.earliest() {
                Some(d) if d < t1 => d.max(t0),
                _ => return,
            }
        };
        if t1.saturating_sub(from) >= MIN_GAP_MS {
            self.stalls.push(Gap {
                from_ms: from,
                to_ms: t1,
            });
        }
    }

    fn run_ms(&self, job: u64) -> u64 {
        let s = self
            .state
            .job(gpusched_model::JobId(job))
            .and_then(|j| j.spec.max_runtime_s)
            .unwrap_or(DEFAULT_RUNTIME_S);
        (s as f64 * 1000.0 / self.time_scale).ceil() as u64
    }

    fn step(&mut self, e: &StoredEvent, at: u64) {
        self.check_epoch(e);
        self.appends.entry(e.producer.clone()).or_default().push(at);
        let applied = self.state.apply(&e.event).is_ok();
        let job = e.event.job().map(|j| j.0);
        match &e.event {
            Event::JobSubmitted { job, .. } => {
                *self.submitted.entry(job.0).or_default() += 1;
                self.submit_ms.entry(job.0).or_insert(at);
                match &e.idempotency_key {
                    Some(k) => {
                        self.key_jobs.entry(k.clone()).or_default().insert(job.0);
                    }
                    None => self.unkeyed.push(job.0),
                }
            }
            Event::JobFinished { job, .. } if applied => {
                *self.finished.entry(job.0).or_default() += 1;
            }
            Event::JobFinished { job, .. } => match self.last_turn.get(&job.0) {
                Some(&("job_preempted" | "job_cancelled" | "job_requeued")) => {
                    self.raced_finishes += 1
                }
                _ => self.stray_finishes.push((job.0, e.seq)),
            },
            Event::JobBound { job, .. } if applied => {
                self.first_bound_ms.entry(job.0).or_insert(at);
            }
            Event::JobStarted { .. }
            | Event::JobPreempted { .. }
            | Event::JobCancelled { .. }
            | Event::JobRequeued { .. }
                if applied =>
            {
                if let Some(j) = job {
                    self.last_turn.insert(j, e.event.kind());
                }
            }
            _ => {}
        }
        if let Some(j) = job {
            let running = self
                .state
                .job(gpusched_model::JobId(j))
                .is_some_and(|x| x.phase == Phase::Running);
            let due = match (&e.event, running) {
                (Event::JobStarted { .. }, true) => Some(at + self.run_ms(j) + RUN_SLACK_MS),
                (_, true) => self.due.by_job.get(&j).copied(),
                (_, false) => None,
            };
            self.due.set(j, due);
        }
    }

    fn check_epoch(&mut self, e: &StoredEvent) {
        // Gateways lease one partition each; admin events come from any writer.
        if e.producer == "gateway" || e.producer == "admin" {
            return;
        }
        let max = self.max_epoch.entry(e.producer.clone()).or_insert(e.epoch);
        if e.epoch < *max {
            self.fencing.push(format!(
                "seq {}: {} appended under epoch {} after epoch {} had",
                e.seq, e.producer, e.epoch, max
            ));
        }
        *max = (*max).max(e.epoch);
    }

    /// The first append of `producer` at or after `t`, ms.
    pub fn first_append(&self, producer: &str, t: u64) -> Option<u64> {
        let v = self.appends.get(producer)?;
        v.get(v.partition_point(|x| *x < t)).copied()
    }

    /// The first binding of a job submitted at or after `t`, ms.
    pub fn first_new_bound(&self, t: u64) -> Option<u64> {
        self.submit_ms
            .iter()
            .filter(|(_, s)| **s >= t)
            .filter_map(|(j, _)| self.first_bound_ms.get(j))
            .min()
            .copied()
    }
}

/// One row of the table.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    /// The fault (or the final probe).
    pub label: String,
    /// Jobs first sent in this phase that got a 2xx.
    pub accepted: u64,
    /// Of those, ended.
    pub ended: u64,
    /// Lost.
    pub lost: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Wrongly refused.
    pub wrongly_refused: u64,
    /// No answer in the whole retry window.
    pub gave_up: u64,
    /// Longest stall inside the phase, ms.
    pub longest_stall_ms: u64,
    /// Fault end → deciding again, ms (`None`: never, or not measured).
    pub recovery_ms: Option<u64>,
    /// Whether recovery is measured for this row.
    pub recovery_measured: bool,
    /// What was seen.
    pub notes: Vec<String>,
    /// Why the row fails (empty: it passes).
    pub failures: Vec<String>,
}

/// What a job's record and the log say together.
#[derive(Default)]
struct Judged {
    accepted: bool,
    ended: bool,
    lost: Option<String>,
    duplicated: Option<String>,
    refused: Option<String>,
    gave_up: Option<String>,
}

fn judge(rec: &JobRecord, f: &Fold) -> Judged {
    let mut j = Judged::default();
    let in_log = f.key_jobs.get(&rec.log_key());
    match &rec.outcome {
        Outcome::Refused { status, body } => {
            j.refused = Some(format!("{} answered {status}: {body}", rec.key))
        }
        Outcome::GaveUp { error } => {
            let committed = if in_log.is_some() {
                " (its job is in the log)"
            } else {
                ""
            };
            j.gave_up = Some(format!(
                "{} gave up after {} tries, last {error}{committed}",
                rec.key, rec.attempts
            ));
        }
        Outcome::Accepted { id, .. } => {
            j.accepted = true;
            judge_accepted(rec, *id, in_log, f, &mut j);
        }
    }
    if let Some(jobs) = in_log.filter(|s| s.len() > 1) {
        j.duplicated = Some(format!(
            "{}: {} jobs for one key {jobs:?}",
            rec.key,
            jobs.len()
        ));
    }
    j
}

fn judge_accepted(
    rec: &JobRecord,
    id: u64,
    in_log: Option<&BTreeSet<u64>>,
    f: &Fold,
    j: &mut Judged,
) {
    if f.submitted.get(&id).copied().unwrap_or(0) == 0 {
        j.lost = Some(format!("{} → job {id}: not in the log", rec.key));
        return;
    }
    if !in_log.is_some_and(|s| s.contains(&id)) {
        j.duplicated = Some(format!(
            "{} → job {id}, but the key's job in the log is {in_log:?}",
            rec.key
        ));
    }
    if f.submitted.get(&id).copied().unwrap_or(0) > 1 {
        j.duplicated = Some(format!("job {id} submitted {} times", f.submitted[&id]));
    }
    if f.finished.get(&id).copied().unwrap_or(0) > 1 {
        j.duplicated = Some(format!("job {id} finished {} times", f.finished[&id]));
    }
    if let Some((_, seq)) = f.stray_finishes.iter().find(|(x, _)| *x == id) {
        j.duplicated = Some(format!(
            "job {id} reported finished again at seq {seq} with nothing ending its run between"
        ));
    }
    match f.state.job(gpusched_model::JobId(id)).map(|x| x.phase) {
        Some(Phase::Rejected) => {
            j.refused = Some(format!("job {id} ({}) rejected by admission", rec.key))
        }
        Some(p) if p.is_terminal() => j.ended = true,
        Some(p) => j.lost = Some(format!("job {id} ({}) never ended: {p:?}", rec.key)),
        None => j.lost = Some(format!("job {id}: not in the folded state")),
    }
    if j.refused.is_some() {
        j.ended = true;
    }
}

/// Adds one example of each finding (up to 3 per kind) to `notes`.
fn tally(row: &mut Row, recs: &[&JobRecord], f: &Fold) {
    let mut examples: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for rec in recs {
        let j = judge(rec, f);
        row.accepted += u64::from(j.accepted);
        row.ended += u64::from(j.ended && j.accepted);
        for (kind, what, count) in [
            ("lost", j.lost, &mut row.lost),
            ("duplicated", j.duplicated, &mut row.duplicated),
            ("refused", j.refused, &mut row.wrongly_refused),
            ("gave up", j.gave_up, &mut row.gave_up),
        ] {
            if let Some(w) = what {
                *count += 1;
                examples.entry(kind).or_default().push(w);
            }
        }
    }
    for (kind, v) in examples {
        for w in v.iter().take(3) {
            row.notes.push(format!("{kind}: {w}"));
        }
        if v.len() > 3 {
            row.notes.push(format!("{kind}: … {} more", v.len() - 3));
        }
    }
}

/// Fault end → the last of: a job submitted after it bound, each stage
/// the fault touched appending again (for preemption, its new instance
/// ready). Which one came last, or never came, goes to `notes`.
fn recovery(p: &PhaseRun, f: &Fold, notes: &mut Vec<String>) -> Option<u64> {
    let end = p.fault_end_ms;
    if let Fault::PauseLeader { service, .. } = &p.fault {
        // A paused process cannot commit: the first append after the pause
        // began is the standby's (or the leader's, once resumed).
        if let Some(t) = f.first_append(service, p.fault_start_ms + 1) {
            notes.push(format!(
                "{service} appended again {:.1} s after the pause began",
                t.saturating_sub(p.fault_start_ms) as f64 / 1000.0
            ));
        }
    }
    let mut marks: Vec<(String, Option<u64>)> =
        vec![("a new job bound".into(), f.first_new_bound(end))];
    for s in p.fault.must_decide() {
        marks.push((format!("{s} appended"), f.first_append(s, end)));
    }
    if matches!(&p.fault, Fault::Kill { service } if service == "preemption") {
        marks.push(("preemption ready".into(), p.ready_ms));
    }
    let never: Vec<&str> = marks
        .iter()
        .filter(|(_, t)| t.is_none())
        .map(|(w, _)| w.as_str())
        .collect();
    if !never.is_empty() {
        notes.push(format!("never after the fault: {}", never.join(", ")));
        return None;
    }
    let (last, t) = marks
        .iter()
        .filter_map(|(w, t)| t.map(|t| (w, t)))
        .max_by_key(|(_, t)| *t)?;
    let ms = t.saturating_sub(end);
    notes.push(format!(
        "last to recover: {last} (+{:.1} s)",
        ms as f64 / 1000.0
    ));
    Some(ms)
}

/// Fault windows: fault start → recovered (or the phase's end).
pub fn windows(phases: &[PhaseRun], rows: &[Row]) -> Vec<(u64, u64)> {
    phases
        .iter()
        .zip(rows)
        .map(|(p, r)| {
            let to = match r.recovery_ms {
                Some(ms) => p.fault_end_ms + ms,
                None => p.end_ms,
            };
            (p.fault_start_ms, to.max(p.fault_end_ms))
        })
        .collect()
}

/// The longest piece of `g` outside every window, ms, and where it starts.
pub fn outside(g: &Gap, windows: &[(u64, u64)]) -> (u64, u64) {
    let mut pieces = vec![(g.from_ms, g.to_ms)];
    for &(a, b) in windows {
        pieces = pieces
            .into_iter()
            .flat_map(|(x, y)| {
                let mut out = Vec::new();
                if x < a.min(y) {
                    out.push((x, a.min(y)));
                }
                if b.max(x) < y {
                    out.push((b.max(x), y));
                }
                out
            })
            .collect();
    }
    pieces
        .into_iter()
        .map(|(x, y)| (y - x, x))
        .max()
        .unwrap_or((0, g.from_ms))
}

/// Rows for the phases (records attributed by first send time), then one
/// for `probes`, the jobs sent after the last fault.
pub fn rows(
    phases: &[PhaseRun],
    records: &[JobRecord],
    probes: &[JobRecord],
    f: &Fold,
) -> Vec<Row> {
    let mut rows = Vec::with_capacity(phases.len() + 1);
    for (i, p) in phases.iter().enumerate() {
        let until = phases.get(i + 1).map_or(p.end_ms, |n| n.start_ms);
        let recs: Vec<&JobRecord> = records
            .iter()
            .filter(|r| r.sent_ms >= p.start_ms && (r.sent_ms < until || i + 1 == phases.len()))
            .collect();
        let mut row = Row {
            label: p.fault.label(),
            recovery_measured: true,
            ..Row::default()
        };
        row.notes.push(p.detail.clone());
        tally(&mut row, &recs, f);
        row.longest_stall_ms = f
            .stalls
            .iter()
            .map(|g| g.overlap(p.start_ms, until))
            .max()
            .unwrap_or(0);
        row.recovery_ms = recovery(p, f, &mut row.notes);
        rows.push(row);
    }
    let mut last = Row {
        label: "after all faults (probe)".into(),
        ..Row::default()
    };
    let recs: Vec<&JobRecord> = probes.iter().collect();
    tally(&mut last, &recs, f);
    if let Some(p) = phases.last() {
        last.longest_stall_ms = f
            .stalls
            .iter()
            .map(|g| g.overlap(p.end_ms, u64::MAX))
            .max()
            .unwrap_or(0);
    }
    rows.push(last);
    let all: Vec<&JobRecord> = records.iter().chain(probes).collect();
    for (i, jobs) in strays(phases, &all, f) {
        if let Some(row) = rows.get_mut(i) {
            row.duplicated += jobs.len() as u64;
            row.notes.push(format!(
                "duplicated: {} jobs in the log no client asked for (no key or an unknown one): {:?}",
                jobs.len(),
                &jobs[..jobs.len().min(5)]
            ));
        }
    }
    rows
}

/// Marks each row's failures: lost, duplicated, refused or unanswered
/// jobs, a recovery over the goal or never, a stall over the goal outside
/// the fault windows, a fault not injected, a crash.
pub fn judge_rows(rows: &mut [Row], phases: &[PhaseRun], f: &Fold, goals: Goals) {
    let win = windows(phases, rows);
    for (i, row) in rows.iter_mut().enumerate() {
        let count = |n: u64, what: &str| (n > 0).then(|| format!("{n} {what}"));
        row.failures.extend(
            [
                count(row.lost, "lost"),
                count(row.duplicated, "duplicated"),
                count(row.wrongly_refused, "wrongly refused"),
                count(row.gave_up, "never answered"),
            ]
            .into_iter()
            .flatten(),
        );
        let (from, to) = match (phases.get(i), phases.get(i + 1)) {
            (Some(p), Some(n)) => (p.start_ms, n.start_ms),
            (Some(p), None) => (p.start_ms, p.end_ms),
            (None, _) => (phases.last().map_or(0, |p| p.end_ms), u64::MAX),
        };
        let steady = f
            .stalls
            .iter()
            .filter(|g| g.overlap(from, to) > 0)
            .map(|g| outside(g, &win))
            .max();
        if let Some((ms, _)) = steady.filter(|(ms, _)| *ms > goals.stall.as_millis() as u64) {
            row.failures.push(format!(
                "stall of {:.1} s outside any fault window",
                ms as f64 / 1000.0
            ));
        }
        let Some(p) = phases.get(i) else { continue };
        match row.recovery_ms {
            None => row.failures.push("never decided again".into()),
            Some(ms) if ms > goals.recovery.as_millis() as u64 => row.failures.push(format!(
                "recovery {:.1} s > {} s",
                ms as f64 / 1000.0,
                goals.recovery.as_secs_f64()
            )),
            Some(_) => {}
        }
        if let Some(e) = &p.error {
            row.failures
                .push(format!("fault not injected as planned: {e}"));
        }
        for c in &p.crashes {
            row.failures.push(format!("crashed: {c}"));
        }
        if p.missing_after > 0 {
            row.notes.push(format!(
                "{} accepted jobs were not in the log at the phase's end",
                p.missing_after
            ));
        }
    }
}

/// Jobs submitted that no client asked for (no key, or a key of no
/// record), by the row whose time holds their submission.
fn strays(phases: &[PhaseRun], records: &[&JobRecord], f: &Fold) -> BTreeMap<usize, Vec<u64>> {
    let known: BTreeSet<String> = records.iter().map(|r| r.log_key()).collect();
    let mut jobs: Vec<u64> = f.unkeyed.clone();
    for (k, js) in &f.key_jobs {
        if !known.contains(k) {
            jobs.extend(js);
        }
    }
    let mut out: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for j in jobs {
        let t = f.submit_ms.get(&j).copied().unwrap_or(0);
        let row = match phases.iter().rposition(|p| p.start_ms <= t) {
            None => 0,
            Some(i) if i + 1 == phases.len() && t >= phases[i].end_ms => i + 1,
            Some(i) => i,
        };
        out.entry(row).or_default().push(j);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use chrono::{TimeZone, Utc};
    use gpusched_model::{JobId, JobSpec, Timestamp};

    fn ev(
        seq: u64,
        ms: i64,
        producer: &str,
        epoch: u64,
        key: Option<&str>,
        event: Event,
    ) -> StoredEvent {
        StoredEvent {
            seq,
            recorded_at: Utc.timestamp_millis_opt(ms).unwrap(),
            aggregate_kind: "job".into(),
            aggregate_id: "1".into(),
            kind: event.kind().into(),
            schema_version: 1,
            producer: producer.into(),
            epoch,
            causation_id: None,
            correlation_id: None,
            idempotency_key: key.map(str::to_string),
            event,
        }
    }

    fn spec() -> JobSpec {
        serde_json::from_value(serde_json::json!({
            "tenant": "t", "workers": 1, "gpus_per_worker": 1
        }))
        .unwrap()
    }

    fn submitted(seq: u64, ms: i64, job: u64, key: Option<&str>) -> StoredEvent {
        ev(
            seq,
            ms,
            "gateway",
            1,
            key,
            Event::JobSubmitted {
                job: JobId(job),
                spec: spec(),
                at: Timestamp(ms as u64),
            },
        )
    }

    fn record(key: &str, id: Option<u64>, sent: u64) -> JobRecord {
        JobRecord {
            index: 0,
            key: key.into(),
            tenant: "t".into(),
            sent_ms: sent,
            attempts: 1,
            retries: BTreeMap::new(),
            outcome: match id {
                Some(id) => Outcome::Accepted {
                    id,
                    at_ms: sent,
                    created: true,
                },
                None => Outcome::Refused {
                    status: 400,
                    body: "no".into(),
                },
            },
        }
    }

    fn phase(start: u64, fault: u64, end: u64) -> PhaseRun {
        PhaseRun {
            fault: Fault::Kill {
                service: "quota".into(),
            },
            start_ms: start,
            end_ms: end,
            fault_start_ms: fault,
            fault_end_ms: fault,
            detail: String::new(),
            error: None,
            ready_ms: None,
            crashes: Vec::new(),
            missing_after: 0,
        }
    }

    #[test]
    fn a_job_waiting_while_the_log_is_silent_is_a_stall() {
        // Submitted at 1000, nothing else until 4000: 3 s with work waiting.
        let events = vec![
            submitted(1, 1000, 1, Some("submit:t:a")),
            submitted(2, 4000, 2, Some("submit:t:b")),
        ];
        let f = Fold::run(&events, 1.0, 4000);
        assert_eq!(
            f.stalls,
            vec![Gap {
                from_ms: 1000,
                to_ms: 4000
            }]
        );
    }

    #[test]
    fn an_accepted_job_missing_or_unfinished_is_lost_and_a_refusal_is_counted() {
        let events = vec![submitted(1, 1000, 1, Some("submit:t:a"))];
        let f = Fold::run(&events, 1.0, 1100);
        let recs = vec![
            record("a", Some(1), 1000),
            record("b", Some(7), 1000),
            record("c", None, 1000),
        ];
        let rows = rows(&[phase(0, 500, 2000)], &recs, &[], &f);
        let r = &rows[0];
        assert_eq!(
            (r.accepted, r.ended, r.lost, r.wrongly_refused),
            (2, 0, 2, 1)
        );
        assert_eq!(r.duplicated, 0);
    }

    #[test]
    fn a_job_submitted_twice_or_unasked_for_is_a_duplicate() {
        let events = vec![
            submitted(1, 1000, 1, Some("submit:t:a")),
            submitted(2, 1000, 1, Some("submit:t:b")),
        ];
        let f = Fold::run(&events, 1.0, 1100);
        assert_eq!(f.submitted[&1], 2);
        let r = rows(
            &[phase(0, 500, 2000)],
            &[record("a", Some(1), 1000)],
            &[],
            &f,
        );
        // Job 1 twice, and key b that no client sent.
        assert_eq!(r[0].duplicated, 2);
        let events = vec![
            submitted(1, 1000, 1, Some("submit:t:a")),
            submitted(2, 3000, 2, None),
        ];
        let f = Fold::run(&events, 1.0, 3100);
        let r = rows(
            &[phase(0, 500, 2000)],
            &[record("a", Some(1), 1000)],
            &[],
            &f,
        );
        assert_eq!((r[0].duplicated, r[1].duplicated), (0, 1));
    }

    #[test]
    fn a_stale_epoch_after_a_newer_one_is_a_fencing_violation() {
        let a = Event::JobAccepted { job: JobId(1) };
        let events = vec![
            submitted(1, 1000, 1, Some("submit:t:a")),
            ev(2, 1001, "admission", 2, None, a.clone()),
            ev(3, 1002, "admission", 1, None, a),
        ];
        let f = Fold::run(&events, 1.0, 1100);
        assert_eq!(f.fencing.len(), 1);
    }

    #[test]
    fn only_the_part_of_a_stall_outside_the_windows_counts() {
        let g = Gap {
            from_ms: 0,
            to_ms: 10_000,
        };
        assert_eq!(outside(&g, &[(1000, 9500)]), (1000, 0));
        assert_eq!(outside(&g, &[(0, 10_000)]).0, 0);
        assert_eq!(outside(&g, &[]).0, 10_000);
    }

    #[test]
    fn recovery_waits_for_every_stage_the_fault_touched() {
        let events = vec![
            submitted(1, 1000, 1, Some("submit:t:a")),
            ev(
                2,
                1500,
                "quota",
                1,
                None,
                Event::JobAccepted { job: JobId(1) },
            ),
        ];
        let f = Fold::run(&events, 1.0, 2000);
        let mut notes = Vec::new();
        // Quota appended 500 ms after the fault's end, but no new job was bound.
        assert_eq!(recovery(&phase(0, 1000, 2000), &f, &mut notes), None);
        assert!(notes[0].contains("a new job bound"), "{notes:?}");
    }
}
