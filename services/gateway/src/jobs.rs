//! Job routes: submit, read, list, cancel, history and explain.
//!
//! Owns: what a job looks like over HTTP and the cursor of job lists.
//! Must never: show a tenant token another tenant's job (404 instead).

use std::collections::{BTreeMap, BinaryHeap};

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpusched_core::{explain, Job, Phase, State};
use gpusched_events::{Event, RejectReason};
use gpusched_model::{JobId, JobSpec};
use gpusched_runtime::read_view;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use utoipa::{IntoParams, ToSchema};

use crate::answers::{
    LogUnavailable, NoSuchJob, NotAJobId, NotJson, NothingWritten, OtherTenant, SubmissionsBusy,
    TooLarge, Unauthorized, WritesBusy,
};
use crate::{ApiError, ErrorBody, Gateway, Principal};

/// The lowercase name of a phase, as the API shows and filters it.
pub fn phase_name(p: Phase) -> &'static str {
    p.name()
}

fn parse_phase(s: &str) -> Option<Phase> {
    Phase::ALL.iter().copied().find(|p| phase_name(*p) == s)
}

/// A job's state as the API names it: the document's enum of
/// [`phase_name`] of every [`Phase`] (the handlers work with strings).
pub struct JobState;

impl utoipa::PartialSchema for JobState {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let names = Phase::ALL.iter().map(|p| phase_name(*p));
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("Where a job is in its life"))
            .enum_values(Some(names))
            .into()
    }
}

impl ToSchema for JobState {}

/// The largest id or sequence number: the log keeps them as signed 64-bit
/// numbers (`gpusched_store::SEQ_MAX`).
pub(crate) const MAX_SEQ: u64 = gpusched_store::SEQ_MAX;

/// A job id from the path: 1 to [`MAX_SEQ`], else 400 naming `id`.
pub(crate) fn job_id(raw: &str) -> Result<JobId, ApiError> {
    raw.parse::<u64>()
        .ok()
        .filter(|n| (1..=MAX_SEQ).contains(n))
        .map(JobId)
        .ok_or_else(|| ApiError::field("id", format!("must be a job number (1 to {MAX_SEQ})")))
}

/// The path's one parameter, or 400 (as JSON) when it cannot be read.
pub(crate) fn path_param(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    Ok(p?.0)
}

/// The job if it exists and `who` may see it; 404 otherwise.
pub(crate) fn visible<'a>(
    state: &'a State,
    who: &Principal,
    id: JobId,
) -> Result<&'a Job, ApiError> {
    state
        .job(id)
        .filter(|j| who.may_touch(&j.spec.tenant))
        .ok_or_else(|| ApiError::not_found(format!("no job {}", id.0)))
}

/// `POST /v1/jobs`' answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubmitReply {
    /// The job's id.
    id: u64,
    /// Log sequence of its `JobSubmitted`.
    seq: u64,
}

/// 400 naming `tenant`, listing the tenants `who` may submit for.
fn unknown_tenant(s: &State, who: &Principal, name: &str) -> ApiError {
    let mut known: Vec<&str> = s
        .tenants()
        .iter()
        .map(|t| t.spec.name.as_str())
        .filter(|t| who.may_touch(t))
        .collect();
    known.sort_unstable();
    let known = if known.is_empty() {
        "none this token may use".to_string()
    } else {
        known.join(", ")
    };
    ApiError::field(
        "tenant",
        format!("unknown tenant {name:?}; known tenants: {known}"),
    )
}

fn reject_to_error(s: &State, who: &Principal, r: RejectReason) -> ApiError {
    match &r {
        RejectReason::UnknownTenant { tenant } => return unknown_tenant(s, who, tenant),
        RejectReason::QueueClosed { .. } => {
            return ApiError {
                field: Some("tenant".into()),
                ..ApiError::conflict(r.to_string())
            }
        }
        _ => {}
    }
    let field = match &r {
        RejectReason::InvalidField { field, .. } => field.clone(),
        RejectReason::UnknownTenant { .. } => "tenant".into(),
        RejectReason::UnknownFlavor { .. } => "flavors".into(),
        RejectReason::UnknownLevel { .. } => "topology".into(),
        RejectReason::GangTooLarge { .. } | RejectReason::ExceedsQuotaLimit { .. } => {
            "workers".into()
        }
        RejectReason::DuplicateJob => "id".into(),
        RejectReason::QueueClosed { .. } => "tenant".into(),
    };
    let message = r.to_string();
    let rule = message
        .strip_prefix(&format!("{field}: "))
        .unwrap_or(&message)
        .to_string();
    ApiError::field(&field, rule)
}

/// The checks of a submission beyond the JSON schema (see
/// [`submit_job`]), against the cluster in `state`.
pub(crate) fn check_submission(
    state: &State,
    who: &Principal,
    spec: &JobSpec,
) -> Result<(), ApiError> {
    spec.check_fields()
        .map_err(|e| ApiError::field(&e.field, &e.rule))?;
    if spec.array.is_some() {
        return Err(ApiError::field(
            "array",
            "is set by the gateway on an array's tasks; submit an array with POST /v1/arrays",
        ));
    }
    if !who.may_touch(&spec.tenant) {
        // Tenant names are no secret (`/v1/queues` lists them): an unknown
        // one is a 400 listing the tenant this token may use.
        if state.tenant_idx(&spec.tenant).is_none() {
            return Err(unknown_tenant(state, who, &spec.tenant));
        }
        return Err(ApiError {
            field: Some("tenant".into()),
            ..ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "tenant: this token submits only for its own tenant",
            )
        });
    }
    gpusched_core::admission::validate(state, spec).map_err(|r| reject_to_error(state, who, r))
}

/// An idempotency key as the client gave it (`field` says where, in the
/// client's words), scoped to `tenant` as the log stores it.
pub(crate) fn scoped_key(
    raw: Option<&str>,
    tenant: &str,
    field: &str,
) -> Result<Option<String>, ApiError> {
    let Some(k) = raw else { return Ok(None) };
    if k.is_empty() || k.len() > 200 || !k.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::field(
            field,
            "must be 1 to 200 visible ASCII characters",
        ));
    }
    Ok(Some(format!("submit:{tenant}:{k}")))
}

/// Submit a job. With an `Idempotency-Key` header, a repeated request
/// answers 200 with the job the first one created (201).
///
/// Besides the rules of the schema, the body is checked against the
/// cluster as the gateway sees it, each failure a 400 naming its field:
/// `tenant` must be a configured tenant (the message lists those the token
/// may use), `flavors` known flavors, `topology` a configured level,
/// `node` or `any`, and the gang (`workers` × `gpus_per_worker`, which must
/// not overflow) must fit in one domain of that level and within the
/// tenant's quota limits.
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs",
    request_body(content = JobSpec, content_type = "application/json"),
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200,
        pattern = "^[!-~]+$",
        description = "1 to 200 visible ASCII characters; scoped to the tenant")),
    responses(
        (status = 201, description = "Recorded in the log", body = SubmitReply),
        (status = 200, description = "The key was seen before: the job it created", body = SubmitReply),
        (status = 400, description = "A field broke a rule (named in `field`): a rule of the schema, an unknown tenant, flavor or topology level, or a gang that fits nowhere", body = ErrorBody),
        (status = 409, description = "The key was used for a different job, or the tenant's queue is draining or stopped (`field` is `tenant`)", body = ErrorBody),
        Unauthorized, OtherTenant, SubmissionsBusy, NothingWritten,
        TooLarge, NotJson),
    security(("bearer" = [])))]
pub async fn submit_job(
    who: Principal,
    gw: AxState<Gateway>,
    headers: HeaderMap,
    body: Result<Json<JobSpec>, JsonRejection>,
) -> Result<Response, ApiError> {
    let span = crate::submit::submit_span(&headers);
    submit_job_traced(who, gw, headers, body)
        .instrument(span)
        .await
}

/// [`submit_job`], inside its `submit` span.
async fn submit_job_traced(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    headers: HeaderMap,
    body: Result<Json<JobSpec>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(spec) = body?;
    // The request's own form first (a bad key is a 400 whatever the
    // cluster's state), then the spec against the cluster.
    let raw_key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or(""));
    let key = scoped_key(raw_key, &spec.tenant, "Idempotency-Key")?;
    check_submission(read_view(&gw.view).state(), &who, &spec)?;
    let s = gw
        .submitter
        .try_submit(spec, key)
        .await
        .map_err(ApiError::unavailable)?;
    tracing::Span::current().record("job_id", s.job.0);
    let status = if s.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(SubmitReply {
            id: s.job.0,
            seq: s.seq,
        }),
    )
        .into_response())
}

/// A job as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    /// Its id.
    id: u64,
    /// Where it is: submitted, queued, admitted, bound, running,
    /// preempting, succeeded, failed, cancelled or rejected.
    #[schema(value_type = JobState)]
    state: String,
    /// Its tenant.
    tenant: String,
    /// What was asked.
    spec: JobSpec,
    /// GPUs of the whole gang.
    gpus: u32,
    /// The flavor charged while admitted, bound or running.
    flavor: Option<String>,
    /// When it was submitted (ms since the Unix epoch).
    submitted_at_ms: u64,
    /// When its current run started.
    started_at_ms: Option<u64>,
    /// When it ended.
    ended_at_ms: Option<u64>,
    /// Times it started.
    starts: u32,
    /// Times it was preempted.
    preemptions: u32,
    /// Whether its user asked to cancel it while it ran.
    cancel_requested: bool,
    /// Nodes it holds GPUs on.
    nodes: Vec<String>,
    /// Why it was rejected, if it was.
    rejection: Option<String>,
    /// Why it waits now, while queued or admitted (see `/explain`).
    reason: Option<String>,
    /// Its place in its tenant's queue, while queued.
    queue_position: Option<QueuePosition>,
}

/// A job as `GET /v1/jobs/{id}` shows it (also what `gpusched replay
/// --show jobs` lists).
pub fn job_view(s: &State, j: &Job) -> JobView {
    JobView {
        id: j.id.0,
        state: phase_name(j.phase).to_string(),
        tenant: j.spec.tenant.clone(),
        spec: j.spec.clone(),
        gpus: j.spec.total_gpus(),
        flavor: j.flavor.map(|f| s.flavor_name(f).to_string()),
        submitted_at_ms: j.submitted_at.0,
        started_at_ms: j.started_at.map(|t| t.0),
        ended_at_ms: j.ended_at.map(|t| t.0),
        starts: j.starts,
        preemptions: j.preemptions,
        cancel_requested: j.cancel_requested.is_some(),
        nodes: j
            .assignments
            .iter()
            .filter_map(|a| s.nodes().get(a.node.index()).map(|n| n.spec.name.clone()))
            .collect(),
        rejection: j.rejection.as_ref().map(|r| r.to_string()),
        reason: explain::pending_reason(s, j.id).map(|r| r.to_string()),
        queue_position: None,
    }
}

impl JobView {
    fn at(mut self, position: Option<(usize, usize)>) -> Self {
        self.queue_position = position.map(|(position, of)| QueuePosition { position, of });
        self
    }
}

/// Read one job.
///
/// Ended jobs stay readable: a cancelled, succeeded, failed
/// or rejected job keeps answering 200 with its final state (a `DELETE`
/// cancels a job, it does not remove it); only an id never given out, or
/// another tenant's job, answers 404.
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = u64, Path, minimum = 1, maximum = 9_223_372_036_854_775_807_u64, description = "Job id")),
    responses(
        (status = 200, description = "The job, also once it has ended", body = JobView),
        NotAJobId, Unauthorized, NoSuchJob),
    security(("bearer" = [])))]
pub async fn get_job(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<JobView>, ApiError> {
    let id = job_id(&path_param(id)?)?;
    gw.knows_job(id).await;
    let p = read_view(&gw.view);
    let s = p.state();
    let j = visible(s, &who, id)?;
    Ok(Json(job_view(s, j).at(explain::queue_position(s, id))))
}

/// Filters and page of `GET /v1/jobs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this tenant's jobs (a tenant token sees only its own anyway).
    tenant: Option<String>,
    /// Only jobs in these states, comma-separated (e.g. `queued,running`).
    #[param(value_type = Option<Vec<JobState>>, style = Form, explode = false, min_items = 1)]
    state: Option<String>,
    /// Jobs per page, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// `next_cursor` of the previous page (a job id).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_223_372_036_854_775_807_u64)]
    cursor: Option<String>,
    /// `asc` (default: oldest first) or `desc` (newest first); a cursor
    /// continues in the order that gave it.
    #[param(value_type = Option<Order>)]
    order: Option<String>,
}

/// The order of a job list, by id.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)] // documents the `order` parameter's values
pub enum Order {
    /// Oldest first.
    Asc,
    /// Newest first.
    Desc,
}

/// A page of jobs, by id.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobPage {
    /// The jobs, by id in the order asked (ascending by default).
    jobs: Vec<JobView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    next_cursor: Option<String>,
}

/// List jobs, ascending by id, a page at a time.
#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(ListQuery),
    responses((status = 200, body = JobPage), (status = 400, body = ErrorBody),
        Unauthorized, (status = 403, description = "A tenant token asking for another tenant", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_jobs(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<JobPage>, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::field("limit", "must be 1 to 1000"));
    }
    let newest_first = match q.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(o) => {
            return Err(ApiError::field(
                "order",
                format!("unknown order {o:?}; asc or desc"),
            ))
        }
    };
    let cursor = match &q.cursor {
        None => None,
        Some(c) => Some(
            c.parse::<u64>()
                .ok()
                .filter(|c| *c <= MAX_SEQ)
                .ok_or_else(|| ApiError::field("cursor", "must be a next_cursor this API gave"))?,
        ),
    };
    let phases: Option<Vec<Phase>> = match &q.state {
        None => None,
        Some(list) => Some(
            list.split(',')
                .map(|s| {
                    parse_phase(s).ok_or_else(|| {
                        ApiError::field(
                            "state",
                            format!(
                                "unknown state {s:?}; one of {}",
                                Phase::ALL.map(phase_name).join(", ")
                            ),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
    };
    let tenant = match (&who, q.tenant) {
        (Principal::Admin, t) => t,
        (Principal::Tenant(own), None) => Some(own.clone()),
        (Principal::Tenant(own), Some(t)) if &t == own => Some(t),
        (Principal::Tenant(_), Some(_)) => {
            return Err(ApiError {
                field: Some("tenant".into()),
                ..ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "tenant: this token lists only its own tenant's jobs",
                )
            })
        }
    };
    let p = read_view(&gw.view);
    let s = p.state();
    let beyond_cursor = |id: u64| match (cursor, newest_first) {
        (None, _) => true,
        (Some(c), false) => id > c,
        (Some(c), true) => id < c,
    };
    // The `limit + 1` first matching ids beyond the cursor in the order
    // asked: one pass. Ranked so that the heap's top is the one to drop.
    let rank = |id: u64| if newest_first { u64::MAX - id } else { id };
    let mut heap: BinaryHeap<u64> = BinaryHeap::with_capacity(limit + 2);
    for j in s.jobs() {
        if !beyond_cursor(j.id.0)
            || tenant.as_ref().is_some_and(|t| &j.spec.tenant != t)
            || phases.as_ref().is_some_and(|ps| !ps.contains(&j.phase))
        {
            continue;
        }
        let r = rank(j.id.0);
        if heap.len() <= limit {
            heap.push(r);
        } else if heap.peek().is_some_and(|top| r < *top) {
            heap.pop();
            heap.push(r);
        }
    }
    let mut ids: Vec<JobId> = heap
        .into_sorted_vec()
        .into_iter()
        .map(|r| JobId(rank(r)))
        .collect();
    let more = ids.len() > limit;
    ids.truncate(limit);
    let next_cursor = more.then(|| ids.last().map(|l| l.0.to_string())).flatten();
    let positions = explain::queue_positions(s, &ids);
    let jobs = ids
        .iter()
        .zip(positions)
        .filter_map(|(id, at)| s.job(*id).map(|j| job_view(s, j).at(at)))
        .collect();
    Ok(Json(JobPage { jobs, next_cursor }))
}

/// What cancelling a job takes, by its phase: the one rule that
/// `DELETE /v1/jobs/{id}` and `DELETE /v1/arrays/{id}` both follow.
// Made and taken apart at once, never stored: the event need not be boxed.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Cancellation {
    /// It has ended; nothing to do.
    Ended(Phase),
    /// It runs and was asked to stop already.
    AlreadyRequested,
    /// Write this: a request to stop (`running`: it keeps its GPUs until
    /// its agent stops it) or the cancellation itself.
    Write {
        /// `JobCancelRequested` or `JobCancelled`.
        event: Event,
        /// Whether it runs (the event is a request to stop).
        running: bool,
    },
}

impl Cancellation {
    /// How `j` is cancelled at `at`.
    pub(crate) fn of(j: &Job, at: gpusched_model::Timestamp) -> Self {
        match j.phase {
            p if p.is_terminal() => Cancellation::Ended(p),
            Phase::Running | Phase::Preempting if j.cancel_requested.is_some() => {
                Cancellation::AlreadyRequested
            }
            Phase::Running | Phase::Preempting => Cancellation::Write {
                event: Event::JobCancelRequested { job: j.id, at },
                running: true,
            },
            _ => Cancellation::Write {
                event: Event::JobCancelled { job: j.id, at },
                running: false,
            },
        }
    }

    /// The idempotency key of a job's cancellation, so a repeat (or the
    /// job's and its array's cancel) never writes it twice.
    pub(crate) fn key(job: JobId) -> String {
        format!("cancel:{}", job.0)
    }
}

/// `DELETE /v1/jobs/{id}`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelReply {
    /// The job.
    id: u64,
    /// `cancelled`, or `cancelling` while a running job checkpoints and stops.
    state: String,
    /// Log sequence of the cancellation.
    seq: u64,
}

/// Cancel a job. A waiting job is cancelled at once (200). A running job
/// keeps its GPUs until its agent stops it, after a final checkpoint when it
/// checkpoints (202, `cancelling`). Repeating the request is harmless.
///
/// The job stays readable afterwards (`GET` answers 200 with state
/// `cancelled`, or `cancelling` until a running job has stopped).
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = u64, Path, minimum = 1, maximum = 9_223_372_036_854_775_807_u64, description = "Job id")),
    responses(
        (status = 200, description = "Cancelled", body = CancelReply),
        (status = 202, description = "Cancelling: the running job stops after its final checkpoint", body = CancelReply),
        (status = 409, description = "The job has already ended", body = ErrorBody),
        WritesBusy,
        NothingWritten,
        NotAJobId, Unauthorized, NoSuchJob),
    security(("bearer" = [])))]
pub async fn cancel_job(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = job_id(&path_param(id)?)?;
    gw.knows_job(id).await;
    let (event, running) = {
        let p = read_view(&gw.view);
        let j = visible(p.state(), &who, id)?;
        match Cancellation::of(j, gpusched_runtime::wall_clock()) {
            Cancellation::Ended(phase) => {
                return Err(ApiError::conflict(format!(
                    "job {} has already ended ({})",
                    id.0,
                    phase_name(phase)
                )))
            }
            Cancellation::AlreadyRequested => {
                return Ok((
                    StatusCode::ACCEPTED,
                    Json(CancelReply {
                        id: id.0,
                        state: "cancelling".into(),
                        seq: p.seq(),
                    }),
                )
                    .into_response())
            }
            Cancellation::Write { event, running } => (event, running),
        }
    };
    let key = Cancellation::key(id);
    let w = gw
        .submitter
        .write(vec![event], Some(key))
        .await
        .map_err(ApiError::unavailable)?;
    gw.caught_up(w.seq).await;
    let (status, state) = if running {
        (StatusCode::ACCEPTED, "cancelling")
    } else {
        (StatusCode::OK, "cancelled")
    };
    Ok((
        status,
        Json(CancelReply {
            id: id.0,
            state: state.into(),
            seq: w.seq,
        }),
    )
        .into_response())
}

/// One event of a job's history.
#[derive(Debug, Serialize, ToSchema)]
pub struct LoggedJobEvent {
    /// Its place in the log.
    seq: u64,
    /// Its kind, e.g. `job_bound`.
    kind: String,
    /// The event as logged (tagged by `type`).
    #[schema(value_type = Object)]
    event: Event,
}

/// A job's events from the log, in order.
#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs",
    params(("id" = u64, Path, minimum = 1, maximum = 9_223_372_036_854_775_807_u64, description = "Job id")),
    responses(
        (status = 200, body = Vec<LoggedJobEvent>),
        LogUnavailable,
        NotAJobId, Unauthorized, NoSuchJob),
    security(("bearer" = [])))]
pub async fn job_events(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Vec<LoggedJobEvent>>, ApiError> {
    let id = job_id(&path_param(id)?)?;
    gw.knows_job(id).await;
    visible(read_view(&gw.view).state(), &who, id)?;
    let events = gw
        .log
        .job_events(id)
        .await
        .map_err(ApiError::log_unavailable)?;
    Ok(Json(
        events
            .into_iter()
            .map(|e| LoggedJobEvent {
                seq: e.seq,
                kind: e.event.kind().to_string(),
                event: e.event,
            })
            .collect(),
    ))
}

/// Why a job waits now.
#[derive(Debug, Serialize, ToSchema)]
pub struct PendingView {
    /// `quota_exceeded`, `cohort_exhausted`, `no_domain_fits`, `behind_head`,
    /// `waiting_for_jobs`, `array_limit` or `dependency_failed`.
    kind: String,
    /// The reason in words, with the figures.
    text: String,
    /// The reason's figures (tagged by `kind`).
    #[schema(value_type = Object)]
    detail: gpusched_events::PendingReason,
}

/// A job's place in its tenant's queue.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueuePosition {
    /// 1-based position.
    position: usize,
    /// Jobs in the queue.
    of: usize,
}

/// `GET /v1/jobs/{id}/explain`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExplainView {
    /// The job.
    id: u64,
    /// Where it is now.
    #[schema(value_type = JobState)]
    state: String,
    /// Why it waits, if it waits for something.
    pending: Option<PendingView>,
    /// Its place in its queue, while queued.
    queue_position: Option<QueuePosition>,
    /// A job ahead of it holding a reservation on nodes of its flavor.
    reservation_ahead: Option<u64>,
    /// A start time, only where a reservation guarantees one (ms since the
    /// Unix epoch); gpusched never guesses a wait.
    guaranteed_start_ms: Option<u64>,
    /// The job's history from the log, one line per step with its reason,
    /// ending with where it stands now.
    history: Vec<String>,
    /// Where its GPU-hours went so far, and how long its GPUs waited
    /// (docs/goodput.md).
    goodput: GoodputView,
}

/// One job's goodput account so far (docs/goodput.md): every allocated
/// GPU-hour is useful, recovery (lost + checkpoint + restart), startup or
/// unsaved at end; capacity wait is counted apart, by reason.
#[derive(Debug, Serialize, ToSchema)]
pub struct GoodputView {
    /// GPU-hours held, binding → end of each hold that ended.
    allocated_gpu_hours: f64,
    /// Work that survived to completion or to a complete checkpoint.
    useful_gpu_hours: f64,
    /// Lost + checkpoint + restart.
    recovery_gpu_hours: f64,
    /// Work lost since the last complete checkpoint.
    lost_gpu_hours: f64,
    /// A victim's checkpoint on request, capture → stop.
    checkpoint_gpu_hours: f64,
    /// Binding → start of resumed runs.
    restart_gpu_hours: f64,
    /// Binding → start of the first run.
    startup_gpu_hours: f64,
    /// Failed, timed-out or cancelled runs' work after their last checkpoint.
    unsaved_at_end_gpu_hours: f64,
    /// Useful ÷ allocated; null before any hold ended.
    goodput: Option<f64>,
    /// Capacity wait by reason (`queued`, `quota`, `cohort_exhausted`,
    /// `no_domain_fits`, `reservation`, `behind_head`, `requeued`),
    /// GPU-hours, up to now while it waits.
    wait_gpu_hours: BTreeMap<String, f64>,
}

impl GoodputView {
    fn of(acc: &gpusched_core::Account) -> Self {
        let s = acc.summary();
        GoodputView {
            allocated_gpu_hours: s.allocated_gpu_hours,
            useful_gpu_hours: s.useful_gpu_hours,
            recovery_gpu_hours: s.recovery_gpu_hours,
            lost_gpu_hours: s.lost_gpu_hours,
            checkpoint_gpu_hours: s.checkpoint_gpu_hours,
            restart_gpu_hours: s.restart_gpu_hours,
            startup_gpu_hours: s.startup_gpu_hours,
            unsaved_at_end_gpu_hours: s.unsaved_at_end_gpu_hours,
            goodput: acc.goodput(),
            wait_gpu_hours: s
                .wait_by_reason_gpu_hours
                .into_iter()
                .map(|(r, h)| (r.to_string(), h))
                .collect(),
        }
    }
}

/// Why a job is where it is: its history from the log with the reason at
/// each step, why it waits now, and its position in its queue.
#[utoipa::path(get, path = "/v1/jobs/{id}/explain", tag = "jobs",
    params(("id" = u64, Path, minimum = 1, maximum = 9_223_372_036_854_775_807_u64, description = "Job id")),
    responses(
        (status = 200, body = ExplainView),
        LogUnavailable,
        NotAJobId, Unauthorized, NoSuchJob),
    security(("bearer" = [])))]
pub async fn explain_job(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ExplainView>, ApiError> {
    let id = job_id(&path_param(id)?)?;
    let events = crate::timeline::job_story(&gw, &who, id).await?;
    let p = read_view(&gw.view);
    let s = p.state();
    let j = visible(s, &who, id)?;
    let pending = explain::pending_reason(s, id).map(|r| PendingView {
        kind: r.kind().to_string(),
        text: r.to_string(),
        detail: r,
    });
    let queue_position =
        explain::queue_position(s, id).map(|(position, of)| QueuePosition { position, of });
    let ctx = explain::Context::new(
        gpusched_runtime::wall_clock(),
        &gpusched_core::CycleConfig::default(),
    );
    let guaranteed_start_ms = matches!(j.phase, Phase::Queued | Phase::Admitted)
        .then(|| s.reservations().get(&id).and_then(|r| r.start))
        .flatten()
        .map(|t| t.0);
    Ok(Json(ExplainView {
        id: id.0,
        state: phase_name(j.phase).to_string(),
        pending,
        queue_position,
        reservation_ahead: explain::reservation_ahead(s, id).map(|j| j.0),
        guaranteed_start_ms,
        history: explain::history_at(&events, s, id, &ctx),
        goodput: GoodputView::of(
            &gpusched_core::goodput::job_account(id, &events, Some(ctx.now)).unwrap_or_default(),
        ),
    }))
}
