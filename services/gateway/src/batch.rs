//! Batch submission: `POST /v1/jobs:batch`, up to [`MAX_BATCH_JOBS`] jobs
//! in one request, each with its own idempotency key and its own result.
//!
//! Owns: the batch's request and reply shapes, and reading each item on
//! its own (its JSON, its checks, its key), so one bad item never rejects
//! the others. The valid items go to the writer together and share its
//! appends: a batch of a thousand jobs is one or two transactions, not a
//! thousand requests.
//!
//! Must never: let an item's failure change another item's outcome, write
//! a job whose item failed a check, or answer an item before its append
//! committed.

use std::collections::BTreeMap;

use axum::extract::rejection::JsonRejection;
use axum::extract::State as AxState;
use axum::http::HeaderMap;
use axum::Json;
use gpusched_model::JobSpec;
use gpusched_runtime::read_view;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use utoipa::ToSchema;

use crate::answers::{NotJson, Unauthorized};
use crate::jobs::{check_submission, scoped_key};
use crate::{ApiError, ErrorBody, ErrorDetail, Gateway, Principal};

/// Most jobs one batch may carry.
pub const MAX_BATCH_JOBS: usize = 1000;

/// Largest batch body: room for [`MAX_BATCH_JOBS`] jobs with commands and
/// environments.
pub const MAX_BATCH_BODY_BYTES: usize = 8 * 1024 * 1024;

/// `POST /v1/jobs:batch`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// The jobs, 1 to 1000; each item is read and checked on its own.
    #[schema(value_type = Vec<BatchItem>, min_items = 1, max_items = 1000)]
    jobs: Vec<serde_json::Value>,
}

/// One job of a batch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// The job, as `POST /v1/jobs` takes it.
    spec: JobSpec,
    /// 1 to 200 visible ASCII characters, scoped to the tenant, as the
    /// `Idempotency-Key` header of `POST /v1/jobs`: an item sent again
    /// with its key answers the job its first submission created.
    #[schema(min_length = 1, max_length = 200, pattern = "^[!-~]+$")]
    idempotency_key: Option<String>,
}

/// `POST /v1/jobs:batch`'s answer: one result per item, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchReply {
    /// Items recorded now (status 201).
    created: usize,
    /// Items whose key was seen before: the job it created (status 200).
    existing: usize,
    /// Items not written (any other status).
    failed: usize,
    /// The items' results, in the order of `jobs`.
    results: Vec<ItemResult>,
}

/// One item's result.
#[derive(Debug, Serialize, ToSchema)]
pub struct ItemResult {
    /// The status `POST /v1/jobs` would have answered for this job alone:
    /// 201, 200, 400, 403, 409, 429 or 503.
    status: u16,
    /// The job's id (201 and 200).
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    /// Log sequence of its `JobSubmitted` (201 and 200).
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    /// Why it was not written; `field` names it as `jobs[i].…`.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorDetail>,
}

impl ItemResult {
    fn failed(e: ApiError) -> Self {
        ItemResult {
            status: e.status.as_u16(),
            id: None,
            seq: None,
            error: Some(e.detail()),
        }
    }
}

/// Submit up to 1000 jobs in one request. Each item is read and checked
/// on its own, exactly as `POST /v1/jobs` checks one job (its `field`s
/// named `jobs[i].…`); one bad item never rejects or half-writes the
/// others. The valid items are written together. The answer is 200 with a
/// result per item whenever the request itself was readable: look at each
/// item's `status`, and send again (with the same keys) those that got
/// 429 or 503.
#[utoipa::path(post, path = "/v1/jobs:batch", tag = "jobs",
    request_body(content = BatchRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Every item's result, in order", body = BatchReply),
        (status = 400, description = "The body is not a batch: bad JSON, no `jobs`, none or more than 1000 of them", body = ErrorBody),
        Unauthorized,
        (status = 413, description = "The body is over 8 MiB", body = ErrorBody),
        NotJson,
        (status = 503, description = "The gateway's view has not read the log yet; nothing was written", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn submit_batch(
    who: Principal,
    gw: AxState<Gateway>,
    headers: HeaderMap,
    body: Result<Json<BatchRequest>, JsonRejection>,
) -> Result<Json<BatchReply>, ApiError> {
    let span = crate::submit::submit_span(&headers);
    submit_batch_traced(who, gw, body).instrument(span).await
}

/// [`submit_batch`], inside its `submit` span (every job of the batch
/// continues its trace).
async fn submit_batch_traced(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    body: Result<Json<BatchRequest>, JsonRejection>,
) -> Result<Json<BatchReply>, ApiError> {
    let Json(batch) = body?;
    let n = batch.jobs.len();
    if n == 0 || n > MAX_BATCH_JOBS {
        return Err(ApiError::field(
            "jobs",
            format!("must hold 1 to {MAX_BATCH_JOBS} jobs, not {n}"),
        ));
    }
    let mut results: Vec<Option<ItemResult>> = Vec::with_capacity(n);
    let mut valid: BTreeMap<usize, (JobSpec, Option<String>)> = BTreeMap::new();
    {
        let view = read_view(&gw.view);
        for (i, item) in batch.jobs.into_iter().enumerate() {
            match read_item(i, item, view.state(), &who) {
                Ok(job) => {
                    valid.insert(i, job);
                    results.push(None);
                }
                Err(e) => results.push(Some(ItemResult::failed(e))),
            }
        }
    }
    let (idx, jobs): (Vec<usize>, Vec<_>) = valid.into_iter().unzip();
    tracing::Span::current().record("jobs", jobs.len());
    let written = gw.submitter.submit_many(jobs).await;
    for (i, outcome) in idx.into_iter().zip(written) {
        results[i] = Some(match outcome {
            Ok(s) => ItemResult {
                status: if s.created { 201 } else { 200 },
                id: Some(s.job.0),
                seq: Some(s.seq),
                error: None,
            },
            Err(e) => ItemResult::failed(in_item(i, ApiError::unavailable(e))),
        });
    }
    let results: Vec<ItemResult> = results.into_iter().flatten().collect();
    let count = |st: u16| results.iter().filter(|r| r.status == st).count();
    Ok(Json(BatchReply {
        created: count(201),
        existing: count(200),
        failed: results.len() - count(201) - count(200),
        results,
    }))
}

/// Item `i`: its JSON read, its checks passed, its key scoped.
fn read_item(
    i: usize,
    item: serde_json::Value,
    state: &gpusched_core::State,
    who: &Principal,
) -> Result<(JobSpec, Option<String>), ApiError> {
    let item: BatchItem = serde_path_to_error::deserialize(item).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        in_item(i, ApiError::field(&field, e.into_inner()))
    })?;
    let key = scoped_key(
        item.idempotency_key.as_deref(),
        &item.spec.tenant,
        "idempotency_key",
    )
    .map_err(|e| in_item(i, e))?;
    check_submission(state, who, &item.spec).map_err(|e| in_item(i, e.within("spec")))?;
    Ok((item.spec, key))
}

/// `e` as item `i`'s: its field named `jobs[i].…`.
fn in_item(i: usize, e: ApiError) -> ApiError {
    e.within(&format!("jobs[{i}]"))
}
