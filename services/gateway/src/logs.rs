//! `GET /v1/jobs/{id}/logs`: a worker's output, read from its node's agent
//! over the node network (the gateway keeps no logs).
//!
//! Owns: finding which node ran a worker of a run (from the log's bindings)
//! and asking that node's agent for a chunk. Must never: read worker files
//! itself or guess a node the log does not name.

use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State as AxState};
use axum::http::StatusCode;
use axum::Json;
use gpusched_bus::node::{logs_subject, LogChunk, LogRequest, WorkerKey};
use gpusched_core::worker_nodes;
use gpusched_events::Event;
use gpusched_runtime::{read_view, LoggedEvent};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::answers::Unauthorized;
use crate::jobs::{job_id, path_param, visible};
use crate::{ApiError, ErrorBody, Gateway, Principal};

/// Most bytes one answer carries.
const MAX_CHUNK: u64 = 256 * 1024;
/// How long the node's agent gets to answer.
const AGENT_TIMEOUT: Duration = Duration::from_secs(3);

/// Which output of which worker, from where.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// The worker's rank (default 0).
    #[param(minimum = 0)]
    worker: Option<u32>,
    /// `out` (default) or `err`.
    stream: Option<LogStream>,
    /// Byte offset to read from (0: the start of what the agent keeps).
    #[param(minimum = 0)]
    offset: Option<u64>,
    /// Which run (n-th start) of the job; default the latest.
    #[param(minimum = 1)]
    run: Option<u32>,
}

/// Which output of a worker.
#[derive(Clone, Copy, Debug, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// Its standard output.
    Out,
    /// Its standard error.
    Err,
}

/// A chunk of a worker's output.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogView {
    /// The text read.
    text: String,
    /// Pass as `offset` for what comes next.
    next_offset: u64,
    /// Whether the worker still runs (more may come).
    running: bool,
    /// The run read.
    run: u32,
    /// The worker read.
    worker: u32,
    /// The node it ran on.
    node: String,
}

/// Each binding of the job with the run it started: run `n` is the n-th
/// start, and a binding's run is one more than the starts before it.
fn runs(events: &[LoggedEvent]) -> Vec<(u32, Vec<gpusched_events::Assignment>)> {
    let mut starts = 0u32;
    let mut out = Vec::new();
    for e in events {
        match &e.event {
            Event::JobStarted { .. } => starts += 1,
            Event::JobBound { assignments, .. } => out.push((starts + 1, assignments.clone())),
            _ => {}
        }
    }
    out
}

/// A worker's stdout or stderr, from its node's agent.
#[utoipa::path(get, path = "/v1/jobs/{id}/logs", tag = "jobs",
    params(("id" = u64, Path, minimum = 1, maximum = 9_223_372_036_854_775_807_u64, description = "Job id"), LogQuery),
    responses((status = 200, body = LogView),
        (status = 400, description = "A bad id, stream, offset or run, or a worker the job does not have (it has workers 0 to workers - 1)", body = ErrorBody),
        Unauthorized,
        (status = 404, description = "No such job (or another tenant's), or no output for it: never bound, no node agents, or the agent keeps none", body = ErrorBody),
        (status = 503, description = "The log, or the node's agent, did not answer", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn job_logs(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<LogQuery>, QueryRejection>,
) -> Result<Json<LogView>, ApiError> {
    let id = job_id(&path_param(id)?)?;
    let Query(q) = q?;
    gw.knows_job(id).await;
    let (workers, gpus_per_worker) = {
        let view = read_view(&gw.view);
        let j = visible(view.state(), &who, id)?;
        (j.spec.workers, j.spec.gpus_per_worker)
    };
    let worker = q.worker.unwrap_or(0);
    if worker >= workers {
        return Err(ApiError::field(
            "worker",
            format!("the job has workers 0 to {}", workers.saturating_sub(1)),
        ));
    }
    let stream = match q.stream.unwrap_or(LogStream::Out) {
        LogStream::Out => "out",
        LogStream::Err => "err",
    }
    .to_string();
    let no_logs = |why: String| ApiError::new(StatusCode::NOT_FOUND, "no_logs", why);
    let Some((net, root)) = gw.node_net.clone() else {
        return Err(no_logs(
            "no node agents serve logs here (simulated agents run no processes)".into(),
        ));
    };
    let events = gw
        .log
        .job_events(id)
        .await
        .map_err(ApiError::log_unavailable)?;
    let runs = runs(&events);
    let (run, assignments) = match q.run {
        None => runs.last().cloned(),
        Some(r) => runs.iter().rev().find(|(n, _)| *n == r).cloned(),
    }
    .ok_or_else(|| {
        no_logs(format!(
            "job {id} has not run{}",
            q.run.map_or(String::new(), |r| format!(" a run {r}"))
        ))
    })?;
    let node = worker_nodes(&assignments, gpus_per_worker)
        .get(worker as usize)
        .copied()
        .ok_or_else(|| no_logs(format!("worker {worker} of run {run} was not bound")))?;
    let name = read_view(&gw.view)
        .state()
        .nodes()
        .get(node.index())
        .map(|n| n.spec.name.clone())
        .ok_or_else(|| no_logs(format!("node {node} is unknown")))?;
    let req = LogRequest {
        key: WorkerKey {
            job: id.0,
            run,
            rank: worker,
        },
        stream,
        offset: q.offset.unwrap_or(0),
        max_bytes: MAX_CHUNK,
    };
    let body = serde_json::to_vec(&req).unwrap_or_default();
    let answer = net
        .request(logs_subject(&root, &name), body, AGENT_TIMEOUT)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "agent_unavailable",
                format!("node {name}'s agent: {e}"),
            )
        })?;
    let chunk: LogChunk = serde_json::from_slice(&answer).map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "agent_unavailable",
            format!("node {name}'s agent answered something unreadable: {e}"),
        )
    })?;
    if let Some(why) = chunk.error {
        return Err(no_logs(why));
    }
    Ok(Json(LogView {
        text: chunk.text,
        next_offset: chunk.next_offset,
        running: chunk.running,
        run,
        worker,
        node: name,
    }))
}
