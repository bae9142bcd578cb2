//! Workloads: what the simulator submits, and when.
//!
//! Owns: reading the native CSV format, the ITP traces, the synthetic
//! generator and the built-in demo workload into one time-ordered list,
//! and turning submissions that name earlier ones (dependencies, an
//! array's tasks) into the job ids the simulator will give them ([`link`]).
//!
//! Must never: decide anything about scheduling: a dependency the
//! scheduler would refuse (another tenant's job) is passed on for it to
//! refuse.

use gpusched_events::QueueState;
use gpusched_model::{CheckpointPolicy, JobSpec, Timestamp, LEVEL_ANY, LEVEL_NODE};

/// One thing that happens to the simulated cluster from outside.
// Nearly every item is a submission: boxing the spec would add an
// allocation per job to spare the rare node loss a few hundred bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum WorkloadKind {
    /// A user submits a job that, once started, runs `duration_s` seconds.
    Submit {
        /// The job as submitted.
        spec: JobSpec,
        /// How long it really runs once started (the scheduler does not know this).
        duration_s: u64,
    },
    /// A user submits a job that, once started, runs `duration_s` seconds
    /// and then fails (its program exits with an error): jobs that wait
    /// on it with `after_ok` are cancelled, those with `after` go on.
    SubmitFailing {
        /// The job as submitted.
        spec: JobSpec,
        /// How long it runs once started before it fails.
        duration_s: u64,
    },
    /// A node is lost.
    NodeLost {
        /// Its name.
        node: String,
    },
    /// An admin sets a tenant's queue: hold, release (open), drain, stop.
    Queue {
        /// The tenant.
        tenant: String,
        /// Its queue's new state.
        state: QueueState,
    },
    /// An admin evicts a node's jobs for maintenance and keeps it out of
    /// service.
    NodeEvict {
        /// Its name.
        node: String,
    },
}

/// A workload entry.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadItem {
    /// When it happens.
    pub at: Timestamp,
    /// What happens.
    pub kind: WorkloadKind,
}

/// A time-ordered workload and how it was derived.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    /// Entries, sorted by time (stable: file order breaks ties).
    pub items: Vec<WorkloadItem>,
    /// How tenants, gang shapes and policies were chosen, for the report.
    pub description: String,
}

impl WorkloadKind {
    /// The job submitted, its run time, and whether it then fails; `None`
    /// for what is not a submission.
    pub fn submission(&self) -> Option<(&JobSpec, u64, bool)> {
        match self {
            WorkloadKind::Submit { spec, duration_s } => Some((spec, *duration_s, false)),
            WorkloadKind::SubmitFailing { spec, duration_s } => Some((spec, *duration_s, true)),
            WorkloadKind::NodeLost { .. }
            | WorkloadKind::Queue { .. }
            | WorkloadKind::NodeEvict { .. } => None,
        }
    }
}

impl Workload {
    /// The submissions in time order, as (when, spec, true duration in
    /// seconds); lost nodes are left out. For drivers that submit through
    /// the API and let a simulated agent run each job: a failing job is
    /// submitted like any other (the driver's agent decides how it ends),
    /// and dependencies keep the job ids the simulator would give (from 1
    /// in submit order).
    pub fn into_submissions(self) -> impl Iterator<Item = (Timestamp, JobSpec, u64)> {
        self.items.into_iter().filter_map(|i| match i.kind {
            WorkloadKind::Submit { spec, duration_s }
            | WorkloadKind::SubmitFailing { spec, duration_s } => Some((i.at, spec, duration_s)),
            WorkloadKind::NodeLost { .. }
            | WorkloadKind::Queue { .. }
            | WorkloadKind::NodeEvict { .. } => None,
        })
    }
}

/// What a submission says about other submissions before job ids are
/// known: the jobs it waits on and the array it is a task of, by name.
/// The simulator numbers jobs from 1 in submit order (time, then the
/// order given), so [`link`] turns names into job ids once the workload
/// is sorted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Links {
    /// This submission's name, for later ones to wait on.
    pub id: Option<String>,
    /// Submissions that must succeed first (`after_ok`).
    pub after_ok: Vec<String>,
    /// Submissions that must end first, however (`after`).
    pub after: Vec<String>,
    /// The array this job is a task of, by name: tasks are indexed from 0
    /// in submit order, and the array's id is its first task's job id.
    pub array: Option<String>,
    /// At most this many of the array's tasks queued for quota or holding
    /// it at once (`%N`): set by its first task; a later task repeats it
    /// or leaves it out.
    pub array_max_running: Option<u32>,
}

/// Why [`link`] refused a submission: which one (its place in the list
/// given), the field at fault and the rule it broke.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkError {
    /// The submission's place in the list given to [`link`].
    pub index: usize,
    /// The field at fault (`id`, `after_ok`, `after`, `array`,
    /// `array_max_running`, or a job field [`JobSpec::check_fields`] names).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// A submission's links as job ids.
#[derive(Clone)]
struct Resolved {
    after_ok: Vec<gpusched_model::JobId>,
    after: Vec<gpusched_model::JobId>,
    array: Option<gpusched_model::ArrayTask>,
}

/// One array met so far, while linking.
struct ArrayDraft {
    id: u64,
    tenant: String,
    limit: Option<u32>,
    tasks: u32,
    first: usize,
}

/// Sorts items by time (stable: the order given breaks ties) and turns
/// each submission's [`Links`] into its spec's `after_ok`, `after` and
/// `array` (replacing what they held), numbering jobs from 1 in that
/// order as the simulator does.
/// A name must be unique among submissions, and a dependency must be
/// submitted before its dependent; an array's tasks are one tenant's.
/// Whether a dependency is of the same tenant is left to the scheduler,
/// which rejects the job naming the field. `describe(i)` names the i-th
/// item in messages (e.g. `line 7`). Links of items that are not
/// submissions are ignored.
pub fn link(
    drafts: Vec<(WorkloadItem, Links)>,
    describe: &dyn Fn(usize) -> String,
) -> Result<Vec<WorkloadItem>, LinkError> {
    let (order, mut resolved) = {
        let linker = Linker::new(&drafts, describe)?;
        let resolved = linker.resolve()?;
        (linker.order, resolved)
    };
    let mut slots: Vec<Option<WorkloadItem>> = Vec::with_capacity(drafts.len());
    for (i, (mut item, _)) in drafts.into_iter().enumerate() {
        if let (Some(r), Some(spec)) = (resolved[i].take(), spec_mut(&mut item.kind)) {
            spec.after_ok = r.after_ok;
            spec.after = r.after;
            spec.array = r.array;
            spec.check_fields()
                .map_err(|e| link_error(i, &e.field, e.rule.to_string()))?;
        }
        slots.push(Some(item));
    }
    Ok(order.iter().filter_map(|&i| slots[i].take()).collect())
}

fn link_error(index: usize, field: &str, message: String) -> LinkError {
    LinkError {
        index,
        field: field.to_string(),
        message,
    }
}

/// The drafts in submit order, with their job ids and names: what
/// resolving a submission's links reads.
struct Linker<'a> {
    drafts: &'a [(WorkloadItem, Links)],
    describe: &'a dyn Fn(usize) -> String,
    /// Draft indexes by time (stable).
    order: Vec<usize>,
    /// Each submission's job id, numbered from 1 in that order.
    job_of: Vec<Option<gpusched_model::JobId>>,
    /// Each draft's place in that order.
    rank: Vec<usize>,
    /// Submissions' names to their draft.
    names: std::collections::HashMap<&'a str, usize>,
}

impl<'a> Linker<'a> {
    /// Orders the drafts and numbers the submissions; a name given twice
    /// is an error.
    fn new(
        drafts: &'a [(WorkloadItem, Links)],
        describe: &'a dyn Fn(usize) -> String,
    ) -> Result<Self, LinkError> {
        let mut order: Vec<usize> = (0..drafts.len()).collect();
        order.sort_by_key(|&i| drafts[i].0.at);
        let mut job_of = vec![None; drafts.len()];
        let mut rank = vec![0usize; drafts.len()];
        let mut next = 1u64;
        for (r, &i) in order.iter().enumerate() {
            rank[i] = r;
            if drafts[i].0.kind.submission().is_some() {
                job_of[i] = Some(gpusched_model::JobId(next));
                next += 1;
            }
        }
        let mut names = std::collections::HashMap::new();
        for &i in &order {
            let (item, links) = &drafts[i];
            let Some(name) = links
                .id
                .as_deref()
                .filter(|_| item.kind.submission().is_some())
            else {
                continue;
            };
            if let Some(&first) = names.get(name) {
                let message = format!("{name:?} is already the id of {}", describe(first));
                return Err(link_error(i, "id", message));
            }
            names.insert(name, i);
        }
        Ok(Linker {
            drafts,
            describe,
            order,
            job_of,
            rank,
            names,
        })
    }

    /// Every submission's links as job ids, in draft order.
    fn resolve(&self) -> Result<Vec<Option<Resolved>>, LinkError> {
        let mut resolved: Vec<Option<Resolved>> = vec![None; self.drafts.len()];
        let mut arrays: std::collections::HashMap<&str, ArrayDraft> = Default::default();
        for &i in &self.order {
            let (item, links) = &self.drafts[i];
            let (Some((spec, _, _)), Some(me)) = (item.kind.submission(), self.job_of[i]) else {
                continue;
            };
            let mut named = Vec::new();
            let after_ok = self.deps(i, "after_ok", &links.after_ok, &mut named)?;
            let after = self.deps(i, "after", &links.after, &mut named)?;
            let array = match links.array.as_deref() {
                None => None,
                Some(name) => {
                    let a = arrays.entry(name).or_insert_with(|| ArrayDraft {
                        id: me.0,
                        tenant: spec.tenant.clone(),
                        limit: links.array_max_running,
                        tasks: 0,
                        first: i,
                    });
                    Some(self.array_task(a, i, name, &spec.tenant, links)?)
                }
            };
            resolved[i] = Some(Resolved {
                after_ok,
                after,
                array,
            });
        }
        Ok(resolved)
    }

    /// The job ids of the dependencies `list` of draft `i` names in
    /// `field`: each named once (over both fields: `named`), and submitted
    /// before it.
    fn deps(
        &self,
        i: usize,
        field: &str,
        list: &[String],
        named: &mut Vec<String>,
    ) -> Result<Vec<gpusched_model::JobId>, LinkError> {
        let mut out = Vec::with_capacity(list.len());
        for name in list {
            if named.contains(name) {
                return Err(link_error(i, field, format!("{name:?} is named twice")));
            }
            named.push(name.clone());
            let Some(&d) = self.names.get(name.as_str()) else {
                return Err(link_error(i, field, format!("no job has the id {name:?}")));
            };
            if self.rank[d] >= self.rank[i] {
                let message = format!(
                    "{name:?} ({}) is not submitted before this job; a job may only wait on earlier ones",
                    (self.describe)(d)
                );
                return Err(link_error(i, field, message));
            }
            out.extend(self.job_of[d]);
        }
        Ok(out)
    }

    /// Draft `i`'s task of array `a` (named `name`): one tenant's tasks,
    /// one limit (set by its first task), at most `MAX_ARRAY_TASKS`.
    fn array_task(
        &self,
        a: &mut ArrayDraft,
        i: usize,
        name: &str,
        tenant: &str,
        links: &Links,
    ) -> Result<gpusched_model::ArrayTask, LinkError> {
        use gpusched_model::MAX_ARRAY_TASKS;
        if a.tenant != tenant {
            let message = format!(
                "array {name:?} is tenant {}'s (its first task, {}); an array's tasks are one tenant's",
                a.tenant,
                (self.describe)(a.first)
            );
            return Err(link_error(i, "array", message));
        }
        if links.array_max_running.is_some_and(|n| Some(n) != a.limit) {
            let limit = a
                .limit
                .map_or("no limit".to_string(), |n| format!("the limit {n}"));
            let message = format!(
                "array {name:?} has {limit} (set by its first task, {}); a later task repeats it or leaves it out",
                (self.describe)(a.first)
            );
            return Err(link_error(i, "array_max_running", message));
        }
        if a.tasks as usize >= MAX_ARRAY_TASKS {
            let message = format!("array {name:?} would hold more than {MAX_ARRAY_TASKS} tasks");
            return Err(link_error(i, "array", message));
        }
        a.tasks += 1;
        Ok(gpusched_model::ArrayTask {
            array: a.id,
            index: a.tasks - 1,
            max_running: a.limit,
        })
    }
}

/// The spec of a submission, to fill in its links.
fn spec_mut(kind: &mut WorkloadKind) -> Option<&mut JobSpec> {
    match kind {
        WorkloadKind::Submit { spec, .. } | WorkloadKind::SubmitFailing { spec, .. } => Some(spec),
        WorkloadKind::NodeLost { .. }
        | WorkloadKind::Queue { .. }
        | WorkloadKind::NodeEvict { .. } => None,
    }
}

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Seconds between checkpoint starts given to long jobs by the ITP and
/// synthetic loaders.
const DERIVED_CHECKPOINT_INTERVAL_S: u64 = 1800;
/// Seconds one derived checkpoint takes.
const DERIVED_CHECKPOINT_DURATION_S: u64 = 60;
/// Jobs running longer than this many seconds get a derived checkpoint policy.
const DERIVED_CHECKPOINT_ABOVE_S: u64 = 3600;
/// Default checkpoint duration in the native format when only the interval is given.
const NATIVE_DEFAULT_CHECKPOINT_DURATION_S: u64 = 60;

/// Why a workload could not be loaded.
///
/// Every row-level error names the source, the 1-based line (the header is
/// line 1, so the first data row is line 2) and, where one is at fault, the
/// field, e.g. `workload.csv line 7: field gpus_per_worker: must be at least 1`.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The CSV itself is malformed (bad quoting, a row with the wrong number
    /// of fields, invalid UTF-8, …).
    #[error("{file} line {line}: {message}")]
    Csv {
        /// The source's name.
        file: String,
        /// 1-based line; the header is line 1.
        line: u64,
        /// What the CSV reader reported.
        message: String,
    },
    /// A field is missing or cannot be read as the type it must have.
    #[error("{file} line {line}: field {field}: {message}")]
    Parse {
        /// The source's name.
        file: String,
        /// 1-based line; the header is line 1.
        line: u64,
        /// The column name.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A field was read but its value breaks a rule (e.g. zero workers).
    #[error("{file} line {line}: field {field}: {message}")]
    Invalid {
        /// The source's name.
        file: String,
        /// 1-based line; the header is line 1.
        line: u64,
        /// The field's name.
        field: String,
        /// The rule it broke.
        message: String,
    },
    /// The loader's options cannot produce a workload (e.g. no tenants).
    #[error("workload options: {0}")]
    Options(String),
}

/// Where in a source a row sits, for error messages.
struct RowCtx<'a> {
    file: &'a str,
    line: u64,
}

impl RowCtx<'_> {
    fn parse_err(&self, field: &str, message: impl Into<String>) -> WorkloadError {
        WorkloadError::Parse {
            file: self.file.to_string(),
            line: self.line,
            field: field.to_string(),
            message: message.into(),
        }
    }

    fn invalid(&self, field: &str, message: impl Into<String>) -> WorkloadError {
        WorkloadError::Invalid {
            file: self.file.to_string(),
            line: self.line,
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// The value of a required field.
    fn required<'v>(
        &self,
        field: &str,
        value: &'v Option<String>,
    ) -> Result<&'v str, WorkloadError> {
        match value.as_deref() {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(self.parse_err(field, "required but missing or empty")),
        }
    }

    fn u32(&self, field: &str, s: &str) -> Result<u32, WorkloadError> {
        s.parse::<u32>().map_err(|_| {
            self.parse_err(
                field,
                format!("expected a non-negative whole number, got {s:?}"),
            )
        })
    }

    fn i32(&self, field: &str, s: &str) -> Result<i32, WorkloadError> {
        s.parse::<i32>()
            .map_err(|_| self.parse_err(field, format!("expected a whole number, got {s:?}")))
    }

    /// A non-negative finite number of seconds.
    fn secs_f64(&self, field: &str, s: &str) -> Result<f64, WorkloadError> {
        match s.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err(self.parse_err(
                field,
                format!("expected a non-negative number of seconds, got {s:?}"),
            )),
        }
    }

    /// A point in time given in (possibly fractional) seconds, as milliseconds.
    fn timestamp(&self, field: &str, s: &str) -> Result<Timestamp, WorkloadError> {
        let ms = (self.secs_f64(field, s)? * 1000.0).round();
        if ms >= u64::MAX as f64 {
            return Err(self.parse_err(field, format!("{s:?} seconds is too large")));
        }
        Ok(Timestamp(ms as u64))
    }

    /// A duration in whole seconds; a fractional value is rounded up.
    fn whole_secs(&self, field: &str, s: &str) -> Result<u64, WorkloadError> {
        if let Ok(v) = s.parse::<u64>() {
            return Ok(v);
        }
        let v = self.secs_f64(field, s)?.ceil();
        if v >= u64::MAX as f64 {
            return Err(self.parse_err(field, format!("{s:?} seconds is too large")));
        }
        Ok(v as u64)
    }

    fn bool(&self, field: &str, s: &str) -> Result<bool, WorkloadError> {
        match s.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err(self.parse_err(field, format!("expected true/false/1/0/yes/no, got {s:?}"))),
        }
    }
}

/// A CSV reader error as a [`WorkloadError`], at `line` unless the error knows better.
fn csv_error(file: &str, line: u64, err: &csv::Error) -> WorkloadError {
    let line = err.position().map_or(line, |p| p.line());
    let message = match err.kind() {
        csv::ErrorKind::Deserialize { err, .. } => err.to_string(),
        _ => err.to_string(),
    };
    WorkloadError::Csv {
        file: file.to_string(),
        line,
        message,
    }
}

/// Reads every record of a headed CSV source, handing each row with its
/// 1-based line number to `row`.
fn for_each_row<T, F>(reader: impl Read, file: &str, mut row: F) -> Result<(), WorkloadError>
where
    T: for<'de> Deserialize<'de>,
    F: FnMut(T, RowCtx<'_>) -> Result<(), WorkloadError>,
{
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(reader);
    let headers = rdr.headers().map_err(|e| csv_error(file, 1, &e))?.clone();
    let mut record = csv::StringRecord::new();
    let mut index: u64 = 0;
    loop {
        let fallback_line = index + 2;
        match rdr.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(csv_error(file, fallback_line, &e)),
        }
        index += 1;
        let line = record.position().map_or(fallback_line, |p| p.line());
        let value: T = record
            .deserialize(Some(&headers))
            .map_err(|e| csv_error(file, line, &e))?;
        row(value, RowCtx { file, line })?;
    }
    Ok(())
}

/// Stable sort by time: file order breaks ties.
fn sort_items(items: &mut [WorkloadItem]) {
    items.sort_by_key(|i| i.at);
}

/// A derived checkpoint policy: every 1800 s taking 60 s for jobs longer
/// than one hour, none otherwise.
fn derived_checkpoint(duration_s: u64) -> Option<CheckpointPolicy> {
    (duration_s > DERIVED_CHECKPOINT_ABOVE_S).then_some(CheckpointPolicy {
        interval_s: DERIVED_CHECKPOINT_INTERVAL_S,
        duration_s: DERIVED_CHECKPOINT_DURATION_S,
    })
}

/// Splits `gpus` into a gang of workers no larger than a node:
/// `workers = ceil(gpus / gpus_per_node)`, `gpus_per_worker = ceil(gpus / workers)`.
fn gang_shape(gpus: u32, gpus_per_node: u32) -> (u32, u32) {
    let workers = gpus.div_ceil(gpus_per_node.max(1)).max(1);
    (workers, gpus.div_ceil(workers))
}

// ---------------------------------------------------------------------------
// Native CSV
// ---------------------------------------------------------------------------

/// One native CSV row, every field read leniently so errors can name it.
#[derive(Debug, Default, Deserialize)]
struct NativeRow {
    event: Option<String>,
    submit_s: Option<String>,
    tenant: Option<String>,
    workers: Option<String>,
    gpus_per_worker: Option<String>,
    duration_s: Option<String>,
    priority: Option<String>,
    preemptible: Option<String>,
    checkpoint_interval_s: Option<String>,
    checkpoint_duration_s: Option<String>,
    max_runtime_s: Option<String>,
    flavors: Option<String>,
    topology: Option<String>,
    node: Option<String>,
    id: Option<String>,
    after_ok: Option<String>,
    after: Option<String>,
    fails: Option<String>,
    array: Option<String>,
    array_max_running: Option<String>,
}

impl NativeRow {
    /// The row's item, and its links to other rows (none for an event).
    fn into_item(self, ctx: &RowCtx<'_>) -> Result<(WorkloadItem, Links), WorkloadError> {
        let at = ctx.timestamp("submit_s", ctx.required("submit_s", &self.submit_s)?)?;
        let event = self.event.as_deref().unwrap_or("job").to_ascii_lowercase();
        if event != "job" {
            let kind = self.event_kind(&event, ctx)?;
            return Ok((WorkloadItem { at, kind }, Links::default()));
        }
        let (spec, duration_s) = self.job(ctx)?;
        let fails = match self.fails.as_deref() {
            Some(f) => ctx.bool("fails", f)?,
            None => false,
        };
        let links = self.links(ctx)?;
        let kind = if fails {
            WorkloadKind::SubmitFailing { spec, duration_s }
        } else {
            WorkloadKind::Submit { spec, duration_s }
        };
        Ok((WorkloadItem { at, kind }, links))
    }

    /// An event row's kind: a node lost or evicted, or a queue operation.
    fn event_kind(&self, event: &str, ctx: &RowCtx<'_>) -> Result<WorkloadKind, WorkloadError> {
        let queue = |state| -> Result<WorkloadKind, WorkloadError> {
            let tenant = ctx.required("tenant", &self.tenant)?.to_string();
            Ok(WorkloadKind::Queue { tenant, state })
        };
        match event {
            "node_lost" => Ok(WorkloadKind::NodeLost {
                node: ctx.required("node", &self.node)?.to_string(),
            }),
            "node_evict" => Ok(WorkloadKind::NodeEvict {
                node: ctx.required("node", &self.node)?.to_string(),
            }),
            "queue_hold" => queue(QueueState::Held),
            "queue_release" => queue(QueueState::Open),
            "queue_drain" => queue(QueueState::Draining),
            "queue_stop" => queue(QueueState::Stopped),
            _ => Err(ctx.parse_err(
                "event",
                format!("expected job, node_lost, node_evict, queue_hold, queue_release, queue_drain or queue_stop, got {:?}", self.event.as_deref().unwrap_or_default()),
            )),
        }
    }

    /// A job row's spec (without its links), checked, and its duration;
    /// errors name the column (the first bad one, in the order below).
    fn job(&self, ctx: &RowCtx<'_>) -> Result<(JobSpec, u64), WorkloadError> {
        let tenant = ctx.required("tenant", &self.tenant)?.to_string();
        let workers = ctx.u32("workers", ctx.required("workers", &self.workers)?)?;
        let gpus_per_worker = ctx.u32(
            "gpus_per_worker",
            ctx.required("gpus_per_worker", &self.gpus_per_worker)?,
        )?;
        let duration_s =
            ctx.whole_secs("duration_s", ctx.required("duration_s", &self.duration_s)?)?;
        if duration_s == 0 {
            return Err(ctx.invalid("duration_s", "must be more than 0 seconds"));
        }
        let spec = JobSpec {
            priority: match self.priority.as_deref() {
                Some(p) => ctx.i32("priority", p)?,
                None => 0,
            },
            flavors: match self.flavors.as_deref() {
                Some(f) => f.split(';').map(|s| s.trim().to_string()).collect(),
                None => Vec::new(),
            },
            topology: match &self.topology {
                Some(t) => t.clone(),
                None if workers == 1 => LEVEL_NODE.to_string(),
                None => LEVEL_ANY.to_string(),
            },
            preemptible: match self.preemptible.as_deref() {
                Some(p) => ctx.bool("preemptible", p)?,
                None => true,
            },
            checkpoint: self.checkpoint(ctx)?,
            max_runtime_s: match self.max_runtime_s.as_deref() {
                Some(m) => Some(ctx.whole_secs("max_runtime_s", m)?),
                None => None,
            },
            ..JobSpec::new(tenant, workers, gpus_per_worker)
        };
        spec.check_fields().map_err(|e| {
            // The model names the checkpoint interval `checkpoint.interval_s`;
            // report the column the user wrote.
            let field = if e.field == "checkpoint.interval_s" {
                "checkpoint_interval_s"
            } else {
                e.field.as_str()
            };
            ctx.invalid(field, e.rule.as_str())
        })?;
        Ok((spec, duration_s))
    }

    /// The checkpoint columns: an interval, with a duration or the
    /// default one; a duration alone is an error.
    fn checkpoint(&self, ctx: &RowCtx<'_>) -> Result<Option<CheckpointPolicy>, WorkloadError> {
        match (
            self.checkpoint_interval_s.as_deref(),
            self.checkpoint_duration_s.as_deref(),
        ) {
            (Some(i), d) => Ok(Some(CheckpointPolicy {
                interval_s: ctx.whole_secs("checkpoint_interval_s", i)?,
                duration_s: match d {
                    Some(d) => ctx.whole_secs("checkpoint_duration_s", d)?,
                    None => NATIVE_DEFAULT_CHECKPOINT_DURATION_S,
                },
            })),
            (None, Some(_)) => Err(ctx.invalid(
                "checkpoint_duration_s",
                "given without checkpoint_interval_s",
            )),
            (None, None) => Ok(None),
        }
    }

    /// A job row's links to other rows: its id, what it runs after, and
    /// its array.
    fn links(self, ctx: &RowCtx<'_>) -> Result<Links, WorkloadError> {
        let array_max_running = match self.array_max_running.as_deref() {
            Some(_) if self.array.is_none() => {
                return Err(ctx.invalid("array_max_running", "given without array"))
            }
            Some(n) => match ctx.u32("array_max_running", n)? {
                0 => return Err(ctx.invalid("array_max_running", "must be at least 1")),
                n => Some(n),
            },
            None => None,
        };
        Ok(Links {
            after_ok: id_list(ctx, "after_ok", self.after_ok.as_deref())?,
            after: id_list(ctx, "after", self.after.as_deref())?,
            id: self.id,
            array: self.array,
            array_max_running,
        })
    }
}

/// A `;`-separated list of row ids (`after_ok`, `after`); empty when the
/// field is missing or empty.
fn id_list(
    ctx: &RowCtx<'_>,
    field: &str,
    value: Option<&str>,
) -> Result<Vec<String>, WorkloadError> {
    let Some(v) = value else {
        return Ok(Vec::new());
    };
    let ids: Vec<String> = v.split(';').map(|s| s.trim().to_string()).collect();
    if ids.iter().any(|s| s.is_empty()) {
        return Err(ctx.parse_err(field, "must not contain empty ids"));
    }
    Ok(ids)
}

/// Loads a workload in the native CSV format from a file; see [`parse_native`].
///
/// Errors name the path as given.
pub fn load_native(path: &Path) -> Result<Workload, WorkloadError> {
    let bytes = std::fs::read(path).map_err(|source| WorkloadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_native(bytes.as_slice(), &path.display().to_string())
}

/// Parses a workload in the native CSV format; `source_name` names it in
/// errors and in the description.
///
/// Header: `submit_s,tenant,workers,gpus_per_worker,duration_s,priority,preemptible,checkpoint_interval_s,max_runtime_s`,
/// in any order; unknown columns are ignored and fields are trimmed.
///
/// - `submit_s` (required): non-negative seconds, may be fractional (kept to the millisecond).
/// - `tenant`, `workers`, `gpus_per_worker`, `duration_s` (required for jobs).
///   Durations are whole seconds; a fractional one is rounded up; zero is rejected.
/// - `priority` (default 0), `preemptible` (`true/false/1/0/yes/no`, default true),
///   `checkpoint_interval_s` (default none), `checkpoint_duration_s` (default 60
///   when an interval is given; an error without one), `max_runtime_s` (default none),
///   `flavors` (`;`-separated preference list, default empty), `topology`
///   (default `node` for one worker, else `any`). A missing column and an empty
///   field both mean the default.
/// - `event`: `job` (default), `node_lost` or `node_evict` (a node emptied
///   for maintenance), which need only `submit_s` and `node` (the node's
///   name), or `queue_hold`, `queue_release`, `queue_drain`, `queue_stop`,
///   which need only `submit_s` and `tenant`; they ignore the other columns.
/// - `fails` (`true/false/1/0/yes/no`, default false): the job runs
///   `duration_s` and then fails instead of succeeding.
/// - `id` (a name unique among job rows), `after_ok` and `after`
///   (`;`-separated ids of rows submitted before this one: an earlier
///   `submit_s`, or the same one on an earlier line): the job waits for
///   those to succeed, or to end however ([`link`]).
/// - `array` (a name shared by an array's rows) and `array_max_running`
///   (its `%N`, on its first row; later rows repeat it or leave it empty):
///   the rows are one array's tasks, indexed from 0 in submit order.
///
/// Each job is checked with [`JobSpec::check_fields`]. Items are sorted by
/// time; rows with equal times keep their file order. Jobs are numbered
/// from 1 in that order, as the simulator numbers them.
pub fn parse_native<R: Read>(reader: R, source_name: &str) -> Result<Workload, WorkloadError> {
    let mut drafts = Vec::new();
    let mut lines = Vec::new();
    for_each_row(reader, source_name, |row: NativeRow, ctx| {
        drafts.push(row.into_item(&ctx)?);
        lines.push(ctx.line);
        Ok(())
    })?;
    let line = |i: usize| lines.get(i).copied().unwrap_or(0);
    let items =
        link(drafts, &|i| format!("line {}", line(i))).map_err(|e| WorkloadError::Invalid {
            file: source_name.to_string(),
            line: line(e.index),
            field: e.field,
            message: e.message,
        })?;
    let jobs = items
        .iter()
        .filter(|i| i.kind.submission().is_some())
        .count();
    let losses = items
        .iter()
        .filter(|i| matches!(i.kind, WorkloadKind::NodeLost { .. }))
        .count();
    let ops = items.len() - jobs - losses;
    let ops = if ops > 0 {
        format!(", {ops} queue and node operations")
    } else {
        String::new()
    };
    let gates = gates_note(&items);
    Ok(Workload {
        items,
        description: format!(
            "native CSV {source_name}: {jobs} jobs, {losses} node losses{ops}{gates}"
        ),
    })
}

/// `, N with dependencies, N array tasks, N failing` for what a
/// workload has of these (empty when none).
fn gates_note(items: &[WorkloadItem]) -> String {
    let (mut dependent, mut tasks, mut failing) = (0, 0, 0);
    for (spec, _, fails) in items.iter().filter_map(|i| i.kind.submission()) {
        dependent += usize::from(!spec.after_ok.is_empty() || !spec.after.is_empty());
        tasks += usize::from(spec.array.is_some());
        failing += usize::from(fails);
    }
    let mut note = String::new();
    for (n, what) in [
        (dependent, "with dependencies"),
        (tasks, "array tasks"),
        (failing, "failing"),
    ] {
        if n > 0 {
            note.push_str(&format!(", {n} {what}"));
        }
    }
    note
}

// ---------------------------------------------------------------------------
// ITP traces
// ---------------------------------------------------------------------------

pub use gpusched_model::fnv1a_64;

/// How an ITP trace, which lacks them, gets tenants, gang shapes and size.
#[derive(Clone, Debug)]
pub struct ItpOptions {
    /// Tenants to spread jobs over (by a stable hash of `job_id`); must not be empty.
    pub tenants: Vec<String>,
    /// GPUs per node, which bounds a worker's size; at least 1.
    pub gpus_per_node: u32,
    /// Keep only the first `n` jobs by submission time.
    pub max_jobs: Option<usize>,
}

/// One ITP trace row, read leniently.
#[derive(Debug, Default, Deserialize)]
struct ItpRow {
    job_id: Option<String>,
    submission_time: Option<String>,
    duration: Option<String>,
    num_gpu: Option<String>,
}

/// Loads an ITP trace file; see [`parse_itp`]. Errors name the path as given.
pub fn load_itp(path: &Path, opts: &ItpOptions) -> Result<Workload, WorkloadError> {
    let bytes = std::fs::read(path).map_err(|source| WorkloadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_itp(bytes.as_slice(), &path.display().to_string(), opts)
}

/// Parses a Microsoft ITP trace (`job_id,submission_time,duration,num_gpu`;
/// seconds from the trace start, 1 to 64 GPUs), deriving what it lacks:
///
/// - tenant = `tenants[fnv1a_64(job_id) % tenants.len()]` (see [`fnv1a_64`]);
/// - `workers = ceil(num_gpu / gpus_per_node)`,
///   `gpus_per_worker = ceil(num_gpu / workers)`;
///   topology `node` for one worker, else `block`;
/// - priority 0, preemptible, no flavor preference, no declared max runtime;
/// - jobs running longer than 3600 s checkpoint every 1800 s, taking 60 s;
///   others do not checkpoint;
/// - submission times are shifted so the first kept job is submitted at t=0;
/// - rows with zero GPUs or zero duration are skipped (counted in the description);
/// - with `max_jobs: Some(n)` only the first `n` jobs by submission time are kept.
///
/// Items are sorted by time; equal times keep file order. The description
/// states all of the above in one line.
pub fn parse_itp<R: Read>(
    reader: R,
    source_name: &str,
    opts: &ItpOptions,
) -> Result<Workload, WorkloadError> {
    if opts.tenants.is_empty() {
        return Err(WorkloadError::Options(
            "ITP traces need at least one tenant".into(),
        ));
    }
    if opts.tenants.iter().any(|t| t.trim().is_empty()) {
        return Err(WorkloadError::Options(
            "tenant names must not be empty".into(),
        ));
    }
    if opts.gpus_per_node == 0 {
        return Err(WorkloadError::Options(
            "gpus_per_node must be at least 1".into(),
        ));
    }
    let tenant_count = opts.tenants.len() as u64;
    let mut items = Vec::new();
    let mut rows: u64 = 0;
    let mut skipped: u64 = 0;
    for_each_row(reader, source_name, |row: ItpRow, ctx| {
        rows += 1;
        let job_id = ctx.required("job_id", &row.job_id)?;
        let at = ctx.timestamp(
            "submission_time",
            ctx.required("submission_time", &row.submission_time)?,
        )?;
        let duration_s = ctx.whole_secs("duration", ctx.required("duration", &row.duration)?)?;
        let num_gpu = ctx.u32("num_gpu", ctx.required("num_gpu", &row.num_gpu)?)?;
        if num_gpu == 0 || duration_s == 0 {
            skipped += 1;
            return Ok(());
        }
        let tenant_ix = (fnv1a_64(job_id.as_bytes()) % tenant_count) as usize;
        let tenant = opts.tenants.get(tenant_ix).cloned().unwrap_or_default();
        let (workers, gpus_per_worker) = gang_shape(num_gpu, opts.gpus_per_node);
        let topology = if workers == 1 { LEVEL_NODE } else { "block" };
        let spec = JobSpec {
            topology: topology.to_string(),
            checkpoint: derived_checkpoint(duration_s),
            ..JobSpec::new(tenant, workers, gpus_per_worker)
        };
        spec.check_fields()
            .map_err(|e| ctx.invalid("num_gpu", format!("derived {}", e)))?;
        items.push(WorkloadItem {
            at,
            kind: WorkloadKind::Submit { spec, duration_s },
        });
        Ok(())
    })?;
    sort_items(&mut items);
    let t0 = items.first().map_or(0, |i| i.at.0);
    for item in &mut items {
        item.at = Timestamp(item.at.0 - t0);
    }
    let mut kept_note = String::new();
    if let Some(n) = opts.max_jobs {
        if items.len() > n {
            items.truncate(n);
            kept_note = format!("; kept the first {n} by submission time");
        }
    }
    let description = format!(
        "ITP trace {source_name}: {jobs} jobs of {rows} rows (skipped {skipped} rows with zero GPUs or duration{kept_note}); \
         submission times shifted so the first is at t=0 (trace offset {t0_s:.3} s); \
         tenant = tenants[FNV-1a-64(job_id) mod {tenant_count}] over [{tenants}]; \
         workers = ceil(num_gpu / {gpn}), gpus_per_worker = ceil(num_gpu / workers), topology node for one worker else block; \
         priority 0, preemptible, no flavor preference, no declared max runtime; \
         jobs longer than {above} s checkpoint every {ci} s taking {cd} s, others never",
        jobs = items.len(),
        t0_s = t0 as f64 / 1000.0,
        tenants = opts.tenants.join(", "),
        gpn = opts.gpus_per_node,
        above = DERIVED_CHECKPOINT_ABOVE_S,
        ci = DERIVED_CHECKPOINT_INTERVAL_S,
        cd = DERIVED_CHECKPOINT_DURATION_S,
    );
    Ok(Workload { items, description })
}

// ---------------------------------------------------------------------------
// Synthetic and demo workloads
// ---------------------------------------------------------------------------

/// Parameters of the synthetic workload generator.
#[derive(Clone, Debug)]
pub struct SyntheticOptions {
    /// Number of jobs.
    pub jobs: usize,
    /// Tenants, chosen uniformly; an empty list uses one tenant, `default`.
    pub tenants: Vec<String>,
    /// Random seed: the same options always give the same workload.
    pub seed: u64,
    /// Mean arrivals per second of the Poisson arrival process; a value that
    /// is not finite and positive submits every job at t=0.
    pub arrival_rate_per_s: f64,
    /// GPUs per node, which bounds a worker's size; 0 is treated as 1.
    pub gpus_per_node: u32,
}

/// Job sizes in GPUs and their weights in percent.
const SIZE_MIX: [(u32, u32); 7] = [(1, 60), (2, 15), (4, 10), (8, 8), (16, 4), (32, 2), (64, 1)];
/// Shortest synthetic duration, seconds.
const SYNTH_MIN_DURATION_S: f64 = 60.0;
/// Longest synthetic duration, seconds (4 h).
const SYNTH_MAX_DURATION_S: f64 = 4.0 * 3600.0;

/// Generates a synthetic workload, deterministic for a given seed
/// (`ChaCha8Rng::seed_from_u64`):
///
/// - Poisson arrivals: the first job at t=0, then exponential inter-arrival
///   gaps at `arrival_rate_per_s`;
/// - sizes: 60% 1 GPU, 15% 2, 10% 4, 8% 8, 4% 16, 2% 32, 1% 64; a size that
///   fits one node is one worker with topology `node`, a larger one is split
///   into `ceil(n / gpus_per_node)` workers of `ceil(n / workers)` GPUs with
///   topology `block`;
/// - durations log-uniform between 60 s and 4 h, whole seconds;
/// - tenant uniform over `tenants`;
/// - priority 10 for 10% of jobs, else 0; 90% preemptible;
/// - jobs longer than 1 h checkpoint every 1800 s taking 60 s;
/// - half the jobs declare `max_runtime_s` = 2 × their duration rounded up
///   to a whole hour, the rest none;
/// - no flavor preference.
pub fn synthetic(opts: &SyntheticOptions) -> Workload {
    let default_tenants = [String::from("default")];
    let tenants: &[String] = if opts.tenants.is_empty() {
        &default_tenants
    } else {
        &opts.tenants
    };
    let gpn = opts.gpus_per_node.max(1);
    let rate = opts.arrival_rate_per_s;
    let rate_ok = rate.is_finite() && rate > 0.0;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let total_weight: u32 = SIZE_MIX.iter().map(|&(_, w)| w).sum();
    let (ln_min, ln_max) = (SYNTH_MIN_DURATION_S.ln(), SYNTH_MAX_DURATION_S.ln());
    let mut t_s = 0.0_f64;
    let mut items = Vec::with_capacity(opts.jobs);
    for i in 0..opts.jobs {
        // Every draw happens for every job, in a fixed order.
        let gap_u: f64 = rng.gen();
        let size_u = rng.gen_range(0..total_weight);
        let dur_u: f64 = rng.gen();
        let tenant_ix = rng.gen_range(0..tenants.len());
        let high_priority = rng.gen_bool(0.1);
        let preemptible = rng.gen_bool(0.9);
        let declares_max = rng.gen_bool(0.5);

        if i > 0 && rate_ok {
            t_s += -(1.0 - gap_u).ln() / rate;
        }
        let mut acc = 0;
        let mut gpus = SIZE_MIX[SIZE_MIX.len() - 1].0;
        for &(size, weight) in &SIZE_MIX {
            acc += weight;
            if size_u < acc {
                gpus = size;
                break;
            }
        }
        let (workers, gpus_per_worker) = gang_shape(gpus, gpn);
        let topology = if workers == 1 { LEVEL_NODE } else { "block" };
        let duration_s = (ln_min + dur_u * (ln_max - ln_min))
            .exp()
            .round()
            .clamp(SYNTH_MIN_DURATION_S, SYNTH_MAX_DURATION_S) as u64;
        let max_runtime_s = declares_max.then(|| duration_s.div_ceil(3600) * 3600 * 2);
        let spec = JobSpec {
            priority: if high_priority { 10 } else { 0 },
            topology: topology.to_string(),
            preemptible,
            checkpoint: derived_checkpoint(duration_s),
            max_runtime_s,
            ..JobSpec::new(tenants[tenant_ix].clone(), workers, gpus_per_worker)
        };
        items.push(WorkloadItem {
            at: Timestamp((t_s * 1000.0).round() as u64),
            kind: WorkloadKind::Submit { spec, duration_s },
        });
    }
    sort_items(&mut items);
    let arrivals = if rate_ok {
        format!("Poisson arrivals at {rate}/s (first at t=0)")
    } else {
        "all submitted at t=0".to_string()
    };
    let description = format!(
        "synthetic: {jobs} jobs, seed {seed}, {arrivals}; sizes 60% 1 GPU, 15% 2, 10% 4, 8% 8, 4% 16, 2% 32, 1% 64 \
         (up to {gpn} GPUs one worker with topology node, larger gangs ceil(n / {gpn}) workers with topology block); \
         durations log-uniform 60 s to 4 h; tenants uniform over [{tenants}]; priority 10 for 10% else 0; 90% preemptible; \
         jobs longer than 1 h checkpoint every 1800 s taking 60 s; 50% declare max runtime = 2 x duration rounded up to the hour; \
         no flavor preference",
        jobs = opts.jobs,
        seed = opts.seed,
        tenants = tenants.join(", "),
    );
    Workload { items, description }
}

/// Jobs in the built-in demo workload.
const DEMO_JOBS: usize = 400;
/// The demo workload's seed.
const DEMO_SEED: u64 = 7;

/// The built-in demo workload: 400 synthetic jobs (seed 7, 0.5 arrivals/s,
/// 8 GPUs per node) over `tenants`; no node losses. See [`synthetic`].
pub fn demo(tenants: &[String]) -> Workload {
    let mut w = synthetic(&SyntheticOptions {
        jobs: DEMO_JOBS,
        tenants: tenants.to_vec(),
        seed: DEMO_SEED,
        arrival_rate_per_s: 0.5,
        gpus_per_node: 8,
    });
    w.description = format!("built-in demo, {}", w.description);
    w
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tenants(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn submits(w: &Workload) -> Vec<(Timestamp, &JobSpec, u64)> {
        w.items
            .iter()
            .filter_map(|i| match &i.kind {
                WorkloadKind::Submit { spec, duration_s } => Some((i.at, spec, *duration_s)),
                _ => None,
            })
            .collect()
    }

    fn native(text: &str) -> Result<Workload, WorkloadError> {
        parse_native(text.as_bytes(), "workload.csv")
    }

    #[test]
    fn native_ignores_unknown_columns_and_defaults_optional_ones() {
        let w = native(
            "submit_s,tenant,colour,workers,gpus_per_worker,duration_s\n\
             10.5,alice,red,1,4,600\n\
             2,bob,blue,3,8,7200\n",
        )
        .unwrap();
        let jobs = submits(&w);
        assert_eq!(jobs.len(), 2);
        // Sorted by time: bob first.
        let (at, spec, dur) = jobs[0];
        assert_eq!(at, Timestamp(2000));
        assert_eq!(spec.tenant, "bob");
        assert_eq!((spec.workers, spec.gpus_per_worker), (3, 8));
        assert_eq!(spec.topology, "any");
        assert_eq!(dur, 7200);
        let (at, spec, dur) = jobs[1];
        assert_eq!(at, Timestamp(10_500));
        assert_eq!(spec.topology, "node");
        assert_eq!(spec.priority, 0);
        assert!(spec.preemptible);
        assert_eq!(spec.checkpoint, None);
        assert_eq!(spec.max_runtime_s, None);
        assert!(spec.flavors.is_empty());
        assert_eq!(dur, 600);
        assert_eq!(
            w.description,
            "native CSV workload.csv: 2 jobs, 0 node losses"
        );
    }

    #[test]
    fn native_reads_every_optional_column_and_empty_means_default() {
        let w = native(
            "submit_s,tenant,workers,gpus_per_worker,duration_s,priority,preemptible,checkpoint_interval_s,max_runtime_s,flavors,topology,checkpoint_duration_s\n\
             0,a,2,8,100,5,no,900,3600,h100;a100,rack,30\n\
             0,a,1,1,100,,,600,,,,\n\
             0,a,1,1,100,-3,YES,,,,,\n",
        )
        .unwrap();
        let jobs = submits(&w);
        let s = jobs[0].1;
        assert_eq!(s.priority, 5);
        assert!(!s.preemptible);
        assert_eq!(
            s.checkpoint,
            Some(CheckpointPolicy {
                interval_s: 900,
                duration_s: 30
            })
        );
        assert_eq!(s.max_runtime_s, Some(3600));
        assert_eq!(s.flavors, tenants(&["h100", "a100"]));
        assert_eq!(s.topology, "rack");
        let s = jobs[1].1;
        assert_eq!(s.priority, 0);
        assert!(s.preemptible);
        assert_eq!(
            s.checkpoint,
            Some(CheckpointPolicy {
                interval_s: 600,
                duration_s: 60
            })
        );
        assert_eq!(s.topology, "node");
        let s = jobs[2].1;
        assert_eq!(s.priority, -3);
        assert!(s.preemptible);
    }

    #[test]
    fn native_error_names_line_and_field() {
        let err = native(
            "submit_s,tenant,workers,gpus_per_worker,duration_s\n\
             0,a,1,1,60\n\
             1,a,0,1,60\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "workload.csv line 3: field workers: must be at least 1"
        );
        assert!(matches!(err, WorkloadError::Invalid { line: 3, .. }));

        let err =
            native("submit_s,tenant,workers,gpus_per_worker,duration_s\n0,a,1,x,60\n").unwrap_err();
        assert!(matches!(
            &err,
            WorkloadError::Parse { line: 2, field, .. } if field == "gpus_per_worker"
        ));
        let msg = err.to_string();
        assert!(
            msg.starts_with("workload.csv line 2: field gpus_per_worker:"),
            "{msg}"
        );

        let err = native("submit_s,tenant,workers,gpus_per_worker\n0,a,1,1\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "workload.csv line 2: field duration_s: required but missing or empty"
        );

        let err = native("submit_s,tenant,workers,gpus_per_worker,duration_s\n-1,a,1,1,60\n")
            .unwrap_err();
        assert!(err.to_string().contains("line 2: field submit_s:"), "{err}");

        let err = native(
            "submit_s,tenant,workers,gpus_per_worker,duration_s,preemptible\n0,a,1,1,60,maybe\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("field preemptible"), "{err}");

        let err = native(
            "submit_s,tenant,workers,gpus_per_worker,duration_s,checkpoint_interval_s\n0,a,1,1,60,0\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "workload.csv line 2: field checkpoint_interval_s: must be at least 1"
        );

        let err =
            native("submit_s,tenant,workers,gpus_per_worker,duration_s,flavors\n0,a,1,1,60,x;;y\n")
                .unwrap_err();
        assert!(err.to_string().contains("field flavors"), "{err}");

        // A ragged row is a CSV error on its own line.
        let err = native("submit_s,tenant,workers,gpus_per_worker,duration_s\n0,a,1,1,60\n0,a\n")
            .unwrap_err();
        assert!(matches!(err, WorkloadError::Csv { line: 3, .. }), "{err}");
    }

    #[test]
    fn native_node_lost_rows() {
        let w = native(
            "event,submit_s,node,tenant,workers,gpus_per_worker,duration_s\n\
             job,5,,a,1,1,60\n\
             node_lost,5,rack-0/node-3,,,,\n\
             ,1,,b,1,1,60\n",
        )
        .unwrap();
        assert_eq!(w.items.len(), 3);
        assert_eq!(w.items[0].at, Timestamp(1000));
        // Equal times keep file order.
        assert!(
            matches!(&w.items[1].kind, WorkloadKind::Submit { spec, .. } if spec.tenant == "a")
        );
        assert_eq!(
            w.items[2],
            WorkloadItem {
                at: Timestamp(5000),
                kind: WorkloadKind::NodeLost {
                    node: "rack-0/node-3".into()
                }
            }
        );
        assert_eq!(
            w.description,
            "native CSV workload.csv: 2 jobs, 1 node losses"
        );

        let err = native("event,submit_s,node\nnode_lost,5,\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "workload.csv line 2: field node: required but missing or empty"
        );
        let err = native("event,submit_s,node\nreboot,5,x\n").unwrap_err();
        assert!(err.to_string().contains("line 2: field event"), "{err}");
    }

    #[test]
    fn native_operation_rows() {
        let w = native(
            "event,submit_s,node,tenant
             queue_hold,1,,a
             queue_release,2,,a
             queue_drain,3,,b
             queue_stop,4,,b
             node_evict,5,n7,
",
        )
        .unwrap();
        let kinds: Vec<WorkloadKind> = w.items.into_iter().map(|i| i.kind).collect();
        let q = |t: &str, state| WorkloadKind::Queue {
            tenant: t.into(),
            state,
        };
        assert_eq!(
            kinds,
            vec![
                q("a", QueueState::Held),
                q("a", QueueState::Open),
                q("b", QueueState::Draining),
                q("b", QueueState::Stopped),
                WorkloadKind::NodeEvict { node: "n7".into() },
            ]
        );
        assert!(w
            .description
            .ends_with("0 jobs, 0 node losses, 5 queue and node operations"));
        let err = native(
            "event,submit_s,tenant
queue_hold,5,
",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "workload.csv line 2: field tenant: required but missing or empty"
        );
        let err = native(
            "event,submit_s,node
node_evict,5,
",
        )
        .unwrap_err();
        assert!(err.to_string().contains("field node"), "{err}");
    }

    #[test]
    fn native_links_rows_by_id_in_submit_order() {
        use gpusched_model::{ArrayTask, JobId};
        // The train is written first but submitted after its prep; the
        // array's tasks are numbered in submit order.
        let w = native(
            "submit_s,tenant,workers,gpus_per_worker,duration_s,id,after_ok,after,fails,array,array_max_running\n\
             10,a,2,8,7200,train,prep,,,,\n\
             0,a,1,8,600,prep,,,yes,,\n\
             10,a,1,1,60,cleanup,,train,,,\n\
             5,b,1,8,900,,,,,sweep,2\n\
             5,b,1,8,900,,,,,sweep,\n\
             6,b,1,8,900,,,,,sweep,2\n",
        )
        .unwrap();
        let kinds: Vec<_> = w.items.iter().filter_map(|i| i.kind.submission()).collect();
        assert_eq!(kinds.len(), 6);
        // Job 1: prep (fails); 2–3: the array's first two tasks; 4: its
        // third; 5: train; 6: cleanup.
        assert!(kinds[0].2 && kinds.iter().skip(1).all(|k| !k.2));
        assert_eq!(kinds[4].0.after_ok, vec![JobId(1)]);
        assert_eq!(kinds[5].0.after, vec![JobId(5)]);
        let task = |index| {
            Some(ArrayTask {
                array: 2,
                index,
                max_running: Some(2),
            })
        };
        assert_eq!(
            [kinds[1].0.array, kinds[2].0.array, kinds[3].0.array],
            [task(0), task(1), task(2)]
        );
        assert!(w
            .description
            .ends_with("6 jobs, 0 node losses, 2 with dependencies, 3 array tasks, 1 failing"));
    }

    #[test]
    fn native_link_errors_name_line_and_field() {
        let head = "submit_s,tenant,workers,gpus_per_worker,duration_s,id,after_ok,after,array,array_max_running\n";
        let err = |rows: &str| native(&format!("{head}{rows}")).unwrap_err().to_string();
        assert_eq!(
            err("0,a,1,8,60,x,,,,\n1,a,1,8,60,y,z,,,\n"),
            "workload.csv line 3: field after_ok: no job has the id \"z\""
        );
        assert_eq!(
            err("5,a,1,8,60,x,y,,,\n1,a,1,8,60,y,,,,\n0,a,1,8,60,z,,x,,\n"),
            "workload.csv line 4: field after: \"x\" (line 2) is not submitted before this job; a job may only wait on earlier ones"
        );
        // The same second, a later line: not earlier either.
        assert!(err("0,a,1,8,60,x,y,,,\n0,a,1,8,60,y,,,,\n").starts_with(
            "workload.csv line 2: field after_ok: \"y\" (line 3) is not submitted before"
        ));
        assert_eq!(
            err("0,a,1,8,60,x,,,,\n1,a,1,8,60,x,,,,\n"),
            "workload.csv line 3: field id: \"x\" is already the id of line 2"
        );
        assert_eq!(
            err("0,a,1,8,60,x,,,,\n1,a,1,8,60,y,x,x,,\n"),
            "workload.csv line 3: field after: \"x\" is named twice"
        );
        assert_eq!(
            err("0,a,1,8,60,x,,,,\n1,a,1,8,60,y,x;,,,\n"),
            "workload.csv line 3: field after_ok: must not contain empty ids"
        );
        assert_eq!(
            err("0,a,1,8,60,,,,s,4\n1,a,1,8,60,,,,s,8\n"),
            "workload.csv line 3: field array_max_running: array \"s\" has the limit 4 (set by its first task, line 2); a later task repeats it or leaves it out"
        );
        assert_eq!(
            err("0,a,1,8,60,,,,s,\n1,b,1,8,60,,,,s,\n"),
            "workload.csv line 3: field array: array \"s\" is tenant a's (its first task, line 2); an array's tasks are one tenant's"
        );
        assert_eq!(
            err("0,a,1,8,60,,,,,4\n"),
            "workload.csv line 2: field array_max_running: given without array"
        );
        assert_eq!(
            err("0,a,1,8,60,,,,s,0\n"),
            "workload.csv line 2: field array_max_running: must be at least 1"
        );
        // An event row's links are ignored.
        let w = native("event,submit_s,node,id,after_ok\nnode_lost,1,n0,x,y\n").unwrap();
        assert_eq!(w.items.len(), 1);
    }

    #[test]
    fn load_native_names_missing_file() {
        let err = load_native(Path::new("/nonexistent/workload.csv")).unwrap_err();
        assert!(matches!(err, WorkloadError::Io { .. }));
        assert!(
            err.to_string().starts_with("/nonexistent/workload.csv: "),
            "{err}"
        );
    }

    #[test]
    fn fnv1a_matches_reference_vectors() {
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    fn itp_opts() -> ItpOptions {
        ItpOptions {
            tenants: tenants(&["t0", "t1", "t2"]),
            gpus_per_node: 8,
            max_jobs: None,
        }
    }

    const ITP_SAMPLE: &str = "job_id,submission_time,duration,num_gpu\n\
        job-a,1000,600,1\n\
        job-b,1010,7200,16\n\
        job-c,1005,100,0\n\
        job-d,900,0,4\n\
        job-e,1003,4000,12\n\
        job-f,1003,50,8\n";

    #[test]
    fn itp_derivations() {
        let w = parse_itp(ITP_SAMPLE.as_bytes(), "sample.csv", &itp_opts()).unwrap();
        let jobs = submits(&w);
        assert_eq!(jobs.len(), 4);
        // Shifted so the first kept job (job-a at 1000 s) is at t=0; ties keep file order.
        let times: Vec<u64> = jobs.iter().map(|j| j.0 .0).collect();
        assert_eq!(times, vec![0, 3000, 3000, 10_000]);
        let shape = |j: &(Timestamp, &JobSpec, u64)| {
            (j.1.workers, j.1.gpus_per_worker, j.1.topology.clone(), j.2)
        };
        assert_eq!(shape(&jobs[0]), (1, 1, "node".into(), 600));
        assert_eq!(shape(&jobs[1]), (2, 6, "block".into(), 4000)); // job-e, 12 GPUs
        assert_eq!(shape(&jobs[2]), (1, 8, "node".into(), 50)); // job-f
        assert_eq!(shape(&jobs[3]), (2, 8, "block".into(), 7200)); // job-b
        assert_eq!(jobs[0].1.checkpoint, None);
        assert_eq!(
            jobs[1].1.checkpoint,
            Some(CheckpointPolicy {
                interval_s: 1800,
                duration_s: 60
            })
        );
        for j in &jobs {
            assert_eq!(j.1.priority, 0);
            assert!(j.1.preemptible);
            assert_eq!(j.1.max_runtime_s, None);
            assert!(j.1.flavors.is_empty());
        }
        // Tenant assignment is the stable hash.
        let ids = ["job-a", "job-e", "job-f", "job-b"];
        for (j, id) in jobs.iter().zip(ids) {
            let expect = &itp_opts().tenants[(fnv1a_64(id.as_bytes()) % 3) as usize];
            assert_eq!(&j.1.tenant, expect);
        }
        assert!(
            w.description
                .contains("skipped 2 rows with zero GPUs or duration"),
            "{}",
            w.description
        );
        // Same input, same output.
        assert_eq!(
            w,
            parse_itp(ITP_SAMPLE.as_bytes(), "sample.csv", &itp_opts()).unwrap()
        );

        let mut opts = itp_opts();
        opts.max_jobs = Some(2);
        let w2 = parse_itp(ITP_SAMPLE.as_bytes(), "sample.csv", &opts).unwrap();
        assert_eq!(w2.items, w.items[..2].to_vec());
        assert!(w2.description.contains("kept the first 2"));
    }

    #[test]
    fn itp_errors() {
        let err = parse_itp(
            "job_id,submission_time,duration,num_gpu\nx,1,2,3\ny,1,two,3\n".as_bytes(),
            "t.csv",
            &itp_opts(),
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("t.csv line 3: field duration:"),
            "{err}"
        );
        let mut opts = itp_opts();
        opts.tenants.clear();
        assert!(matches!(
            parse_itp(ITP_SAMPLE.as_bytes(), "s", &opts),
            Err(WorkloadError::Options(_))
        ));
        let mut opts = itp_opts();
        opts.gpus_per_node = 0;
        assert!(matches!(
            parse_itp(ITP_SAMPLE.as_bytes(), "s", &opts),
            Err(WorkloadError::Options(_))
        ));
    }

    #[test]
    fn itp_real_trace_cluster10() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../data/traces/itp/cluster10.csv"
        ));
        assert!(
            path.exists(),
            "ITP trace missing at {}: it ships in the repository under data/traces/itp",
            path.display()
        );
        let opts = ItpOptions {
            tenants: tenants(&["a", "b", "c", "d"]),
            gpus_per_node: 8,
            max_jobs: None,
        };
        let w = load_itp(path, &opts).unwrap();
        let jobs = submits(&w);
        assert_eq!(jobs.len(), 260);
        assert_eq!(jobs[0].0, Timestamp(0));
        assert!(w.items.windows(2).all(|p| p[0].at <= p[1].at));
        for (_, spec, _) in &jobs {
            assert!(spec.check_fields().is_ok());
            assert!(spec.gpus_per_worker <= 8);
        }
        let sixteen: Vec<_> = jobs.iter().filter(|j| j.1.total_gpus() == 16).collect();
        assert_eq!(sixteen.len(), 2);
        assert!(sixteen
            .iter()
            .all(|j| j.1.workers == 2 && j.1.topology == "block"));
        // Every tenant gets some jobs.
        for t in &opts.tenants {
            assert!(jobs.iter().any(|j| &j.1.tenant == t), "no jobs for {t}");
        }
    }

    fn synth_opts(seed: u64, jobs: usize) -> SyntheticOptions {
        SyntheticOptions {
            jobs,
            tenants: tenants(&["a", "b", "c"]),
            seed,
            arrival_rate_per_s: 0.5,
            gpus_per_node: 8,
        }
    }

    #[test]
    fn synthetic_is_deterministic_per_seed() {
        let a = synthetic(&synth_opts(1, 500));
        let b = synthetic(&synth_opts(1, 500));
        let c = synthetic(&synth_opts(2, 500));
        assert_eq!(a, b);
        assert_ne!(a.items, c.items);
        assert_eq!(a.items.len(), 500);
        assert_eq!(a.items[0].at, Timestamp(0));
        assert!(a.items.windows(2).all(|p| p[0].at <= p[1].at));
    }

    #[test]
    fn synthetic_mix_is_roughly_right() {
        let n = 10_000;
        let w = synthetic(&synth_opts(42, n));
        let jobs = submits(&w);
        assert_eq!(jobs.len(), n);
        let share = |f: &dyn Fn(&(Timestamp, &JobSpec, u64)) -> bool| {
            jobs.iter().filter(|j| f(j)).count() as f64 / n as f64
        };
        for (size, pct) in SIZE_MIX {
            let got = share(&|j| j.1.total_gpus() == size);
            let want = f64::from(pct) / 100.0;
            assert!((got - want).abs() < 0.015, "size {size}: {got} vs {want}");
        }
        assert!((share(&|j| j.1.priority == 10) - 0.1).abs() < 0.015);
        assert!((share(&|j| j.1.preemptible) - 0.9).abs() < 0.015);
        assert!((share(&|j| j.1.max_runtime_s.is_some()) - 0.5).abs() < 0.02);
        // Log-uniform 60 s..4 h: the median is sqrt(60 × 14400) ≈ 930 s.
        assert!((share(&|j| j.2 <= 930) - 0.5).abs() < 0.02);
        for (_, spec, dur) in &jobs {
            assert!((60..=14_400).contains(dur));
            assert!(spec.check_fields().is_ok());
            assert!(spec.gpus_per_worker <= 8);
            assert_eq!(spec.checkpoint.is_some(), *dur > 3600);
            if let Some(m) = spec.max_runtime_s {
                assert_eq!(m, dur.div_ceil(3600) * 7200);
            }
            let multi = spec.total_gpus() > 8;
            assert_eq!(spec.topology, if multi { "block" } else { "node" });
            if multi {
                assert_eq!(spec.gpus_per_worker, 8);
            } else {
                assert_eq!(spec.workers, 1);
            }
        }
        for t in ["a", "b", "c"] {
            assert!((share(&|j| j.1.tenant == t) - 1.0 / 3.0).abs() < 0.02);
        }
        // Mean inter-arrival ≈ 1 / rate = 2 s.
        let last = w.items.last().map_or(0, |i| i.at.0) as f64 / 1000.0;
        let mean_gap = last / (n - 1) as f64;
        assert!((mean_gap - 2.0).abs() < 0.1, "mean gap {mean_gap}");
    }

    #[test]
    fn synthetic_degenerate_options_do_not_panic() {
        let w = synthetic(&SyntheticOptions {
            jobs: 50,
            tenants: vec![],
            seed: 3,
            arrival_rate_per_s: 0.0,
            gpus_per_node: 0,
        });
        assert_eq!(w.items.len(), 50);
        assert!(w.items.iter().all(|i| i.at == Timestamp(0)));
        assert!(submits(&w).iter().all(|j| j.1.tenant == "default"));
    }

    #[test]
    fn demo_is_small_and_stable() {
        let t = tenants(&["x", "y"]);
        let d = demo(&t);
        assert_eq!(d.items.len(), 400);
        assert_eq!(d, demo(&t));
        assert!(d
            .items
            .iter()
            .all(|i| matches!(i.kind, WorkloadKind::Submit { .. })));
        assert!(d.description.starts_with("built-in demo"));
    }
}
