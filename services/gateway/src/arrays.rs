//! Job arrays over HTTP: `POST /v1/arrays` writes one job per index of an
//! index set (`0-999`, `1,3,5-9`, `0-98:2`), `GET /v1/arrays/{id}` shows
//! its tasks, `DELETE /v1/arrays/{id}` cancels every task still going.
//!
//! Owns: the array routes' request and reply shapes, and finding an
//! array's tasks in the view (a scan of the jobs: arrays are looked up
//! rarely, and no index has to be kept in step with the log). Must never:
//! write some of an array's tasks and not the others (they are one
//! append), or let a tenant token see or cancel another tenant's array.

use std::collections::BTreeMap;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpusched_core::{Job, State};
use gpusched_events::Event;
use gpusched_model::{parse_array_set, JobId, JobSpec};
use gpusched_runtime::{read_view, wall_clock};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use utoipa::ToSchema;

use crate::answers::{
    FieldBroken, NotAJobId, NotJson, NothingWritten, OtherTenant, SubmissionsBusy, TooLarge,
    Unauthorized,
};
use crate::jobs::{check_submission, job_id, path_param, phase_name, scoped_key, Cancellation};
use crate::{ApiError, ErrorBody, Gateway, Principal};

/// `POST /v1/arrays`' body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArrayRequest {
    /// The job every task runs, as `POST /v1/jobs` takes it; each task also
    /// gets `GPUSCHED_ARRAY_ID` and `GPUSCHED_ARRAY_INDEX` in its
    /// environment.
    spec: JobSpec,
    /// The tasks' indices: comma-separated `N`, `A-B` (both ends included)
    /// or `A-B:STEP`, 0 to 999999, at most 1000 of them, none twice; then,
    /// optionally, `%N`: at most N tasks queued for quota or holding it
    /// at once (the rest wait their turn).
    #[schema(min_length = 1, example = "0-999%50")]
    indices: String,
}

/// `POST /v1/arrays`' answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArrayReply {
    /// The array's id: its first task's job id.
    id: u64,
    /// How many tasks it holds.
    tasks: usize,
    /// Log sequence of its last task's `JobSubmitted`.
    seq: u64,
}

/// One task of an array.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArrayTaskView {
    /// Its index.
    index: u32,
    /// Its job id.
    id: u64,
    /// Its job's state, as `GET /v1/jobs/{id}` names it.
    state: String,
}

/// An array as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArrayView {
    /// The array's id: its first task's job id.
    id: u64,
    /// Its tenant.
    tenant: String,
    /// Tasks per state (only states that some task is in).
    states: BTreeMap<String, usize>,
    /// At most this many tasks queued for quota or holding it at once
    /// (`%N`), if it has a limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_running: Option<u32>,
    /// Tasks holding one of its `max_running` slots now (queued for quota
    /// or holding it), if it has a limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    slots_taken: Option<u32>,
    /// Its tasks, by index.
    tasks: Vec<ArrayTaskView>,
}

/// `DELETE /v1/arrays/{id}`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArrayCancelReply {
    /// The array.
    id: u64,
    /// Tasks cancelled now (they were waiting).
    cancelled: usize,
    /// Running tasks asked to stop (after a final checkpoint when they
    /// checkpoint), including those asked before.
    cancelling: usize,
    /// Tasks that had already ended.
    ended: usize,
    /// Log sequence of the last cancellation written (the view's when none
    /// was).
    seq: u64,
}

/// The array's tasks `who` may see, by index; 404 when there are none.
fn tasks_of<'a>(state: &'a State, who: &Principal, id: u64) -> Result<Vec<&'a Job>, ApiError> {
    let mut tasks: Vec<&Job> = state
        .jobs()
        .filter(|j| j.spec.array.is_some_and(|a| a.array == id))
        .filter(|j| who.may_touch(&j.spec.tenant))
        .collect();
    if tasks.is_empty() {
        return Err(ApiError::not_found(format!("no array {id}")));
    }
    tasks.sort_by_key(|j| j.spec.array.map(|a| a.index));
    Ok(tasks)
}

/// Submit a job array: one job per index of `indices`, each the `spec`
/// with its place in the array, all written in one append (all or none).
/// With an `Idempotency-Key` header, a repeated request answers 200 with
/// the array the first one created (201).
///
/// `spec` is checked as `POST /v1/jobs` checks a job (its `field`s named
/// `spec.…`), and `indices` as described in the schema.
#[utoipa::path(post, path = "/v1/arrays", tag = "jobs",
    request_body(content = ArrayRequest, content_type = "application/json"),
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200,
        pattern = "^[!-~]+$",
        description = "1 to 200 visible ASCII characters; scoped to the tenant")),
    responses(
        (status = 201, description = "Every task recorded in the log", body = ArrayReply),
        (status = 200, description = "The key was seen before: the array it created", body = ArrayReply),
        FieldBroken,
        (status = 409, description = "The key was used for a different request, or the tenant's queue is draining or stopped (`field` is `spec.tenant`)", body = ErrorBody),
        Unauthorized, OtherTenant, SubmissionsBusy, NothingWritten,
        TooLarge, NotJson),
    security(("bearer" = [])))]
pub async fn submit_array(
    who: Principal,
    gw: AxState<Gateway>,
    headers: HeaderMap,
    body: Result<Json<ArrayRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let span = crate::submit::submit_span(&headers);
    submit_array_traced(who, gw, headers, body)
        .instrument(span)
        .await
}

/// [`submit_array`], inside its `submit` span.
async fn submit_array_traced(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    headers: HeaderMap,
    body: Result<Json<ArrayRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body?;
    let set = parse_array_set(&req.indices).map_err(|e| ApiError::field("indices", e))?;
    let raw_key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or(""));
    let key = scoped_key(raw_key, &req.spec.tenant, "Idempotency-Key")?;
    check_submission(read_view(&gw.view).state(), &who, &req.spec).map_err(|e| e.within("spec"))?;
    let tasks = set.indices.len();
    let s = gw
        .submitter
        .try_submit_array(req.spec, set, key)
        .await
        .map_err(ApiError::unavailable)?;
    let span = tracing::Span::current();
    span.record("job_id", s.job.0);
    span.record("jobs", tasks);
    // Read-your-writes: the array can be read and cancelled at once.
    gw.caught_up(s.seq).await;
    let status = if s.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let reply = ArrayReply {
        id: s.job.0,
        tasks,
        seq: s.seq,
    };
    Ok((status, Json(reply)).into_response())
}

/// Read an array: its tasks by index, with their states.
#[utoipa::path(get, path = "/v1/arrays/{id}", tag = "jobs",
    params(("id" = u64, Path, minimum = 1, maximum = 9_223_372_036_854_775_807_u64, description = "Array id (its first task's job id)")),
    responses((status = 200, description = "The array", body = ArrayView),
        NotAJobId,
        Unauthorized, (status = 404, description = "No such array, or another tenant's", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_array(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ArrayView>, ApiError> {
    let id = job_id(&path_param(id)?)?.0;
    gw.knows_job(JobId(id)).await;
    let view = read_view(&gw.view);
    let tasks = tasks_of(view.state(), &who, id)?;
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    for j in &tasks {
        *states.entry(phase_name(j.phase).to_string()).or_default() += 1;
    }
    let max_running = tasks[0].spec.array.and_then(|a| a.max_running);
    Ok(Json(ArrayView {
        id,
        tenant: tasks[0].spec.tenant.clone(),
        states,
        max_running,
        slots_taken: max_running.map(|_| view.state().array_slots(id).map_or(0, |s| s.taken)),
        tasks: tasks
            .iter()
            .map(|j| ArrayTaskView {
                index: j.spec.array.map_or(0, |a| a.index),
                id: j.id.0,
                state: phase_name(j.phase).to_string(),
            })
            .collect(),
    }))
}

/// Cancel an array as one: every waiting task is cancelled, every running
/// task asked to stop (after a final checkpoint when it checkpoints), as
/// `DELETE /v1/jobs/{id}` does for each. Repeating it is harmless; ended
/// tasks are left as they are.
#[utoipa::path(delete, path = "/v1/arrays/{id}", tag = "jobs",
    params(("id" = u64, Path, minimum = 1, maximum = 9_223_372_036_854_775_807_u64, description = "Array id (its first task's job id)")),
    responses((status = 200, description = "Every task cancelled, cancelling or ended", body = ArrayCancelReply),
        NotAJobId, Unauthorized,
        (status = 404, description = "No such array, or another tenant's", body = ErrorBody),
        (status = 503, description = "The log is unavailable; the tasks not answered were not cancelled, send it again", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel_array(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ArrayCancelReply>, ApiError> {
    let id = job_id(&path_param(id)?)?.0;
    gw.knows_job(JobId(id)).await;
    let mut reply = ArrayCancelReply {
        id,
        cancelled: 0,
        cancelling: 0,
        ended: 0,
        seq: 0,
    };
    let mut writes: Vec<(JobId, Event, bool)> = Vec::new();
    {
        let view = read_view(&gw.view);
        reply.seq = view.seq();
        let at = wall_clock();
        for j in tasks_of(view.state(), &who, id)? {
            match Cancellation::of(j, at) {
                Cancellation::Ended(_) => reply.ended += 1,
                Cancellation::AlreadyRequested => reply.cancelling += 1,
                Cancellation::Write { event, running } => writes.push((j.id, event, running)),
            }
        }
    }
    // One write per task, keyed as `DELETE /v1/jobs/{id}` keys it, so the
    // two never both cancel a task; the writer puts them in one append.
    let sent = writes.into_iter().map(|(job, event, running)| {
        let key = Cancellation::key(job);
        let submitter = gw.submitter.clone();
        async move { (submitter.write(vec![event], Some(key)).await, running) }
    });
    for (w, running) in futures::future::join_all(sent).await {
        let w = w.map_err(ApiError::unavailable)?;
        reply.seq = reply.seq.max(w.seq);
        if running {
            reply.cancelling += 1;
        } else {
            reply.cancelled += 1;
        }
    }
    gw.caught_up(reply.seq).await;
    Ok(Json(reply))
}
