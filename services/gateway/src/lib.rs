//! The API gateway: job submission and reads over HTTP (axum).
//!
//! Owns: the HTTP surface, request validation that needs no cluster
//! knowledge (fields, JSON shape), `JobSubmitted` and `JobCancelled`
//! events, and a read-only view of the state for queries.
//!
//! Must never: decide admission, quota or placement (a submission is only
//! recorded; the admission service judges it against the cluster), or
//! answer a submission before its event is committed to the log.

mod submit;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State as AxState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use gpusched_core::Phase;
use gpusched_model::{JobId, JobSpec};
use gpusched_runtime::{follow, read_view, Bus, Log, Projection, SharedView};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use submit::{start_writer, SubmitError, Submitted, Submitter};

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct Gateway {
    /// Submissions.
    pub submitter: Submitter,
    /// The state as of the last event followed.
    pub view: SharedView,
}

/// Starts the writer and the view follower; serve it with [`router`].
pub fn start(
    log: Log,
    bus: Bus,
    instance: &str,
    shutdown: CancellationToken,
) -> (Gateway, Vec<tokio::task::JoinHandle<()>>) {
    let (submitter, writer) = start_writer(
        log.clone(),
        bus.clone(),
        instance.to_string(),
        instance.to_string(),
        shutdown.clone(),
    );
    let view: SharedView = Arc::new(std::sync::RwLock::new(Projection::new()));
    let v = view.clone();
    let follower = tokio::spawn(async move {
        if let Err(e) = follow(log, bus, v, Duration::from_millis(500), shutdown).await {
            tracing::error!(error = %e, "view follower stopped");
        }
    });
    (Gateway { submitter, view }, vec![writer, follower])
}

/// The HTTP routes.
pub fn router(gw: Gateway) -> Router {
    Router::new()
        .route("/v1/jobs", post(submit_job))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/status", get(status))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(gw)
}

/// Serves `router(gw)` on `addr` until `shutdown`.
pub async fn serve_http(
    gw: Gateway,
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {addr}: {e}"))?;
    tracing::info!(%addr, "gateway listening");
    axum::serve(listener, router(gw))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

/// An error body: `{"error": {"code", "message", "field"?}}`.
#[derive(Debug, Serialize)]
pub struct ApiError {
    #[serde(skip)]
    status: StatusCode,
    code: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(serde_json::json!({ "error": &self }))).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let status = match &r {
            JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            JsonRejection::BytesRejection(_) => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, "bad_request", r.body_text())
    }
}

/// `POST /v1/jobs`' answer.
#[derive(Debug, Serialize)]
struct SubmitReply {
    id: u64,
    seq: u64,
}

async fn submit_job(
    AxState(gw): AxState<Gateway>,
    headers: HeaderMap,
    body: Result<Json<JobSpec>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(spec) = body?;
    spec.check_fields().map_err(|e| ApiError {
        field: Some(e.field.clone()),
        ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_field", e.to_string())
    })?;
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let k = v.to_str().ok().filter(|k| !k.is_empty() && k.len() <= 200);
            let Some(k) = k else {
                return Err(ApiError {
                    field: Some("Idempotency-Key".into()),
                    ..ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_header",
                        "Idempotency-Key: must be 1 to 200 visible ASCII characters",
                    )
                });
            };
            Some(format!("submit:{}:{k}", spec.tenant))
        }
    };
    let s = gw.submitter.submit(spec, key).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.to_string(),
        )
    })?;
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

/// A job as `GET /v1/jobs/{id}` shows it.
#[derive(Debug, Serialize)]
pub struct JobView {
    id: u64,
    phase: Phase,
    tenant: String,
    spec: JobSpec,
    submitted_at_ms: u64,
    started_at_ms: Option<u64>,
    ended_at_ms: Option<u64>,
    starts: u32,
    preemptions: u32,
    nodes: Vec<String>,
}

fn job_view(p: &Projection, id: JobId) -> Option<JobView> {
    let s = p.state();
    let j = s.job(id)?;
    Some(JobView {
        id: id.0,
        phase: j.phase,
        tenant: j.spec.tenant.clone(),
        spec: j.spec.clone(),
        submitted_at_ms: j.submitted_at.0,
        started_at_ms: j.started_at.map(|t| t.0),
        ended_at_ms: j.ended_at.map(|t| t.0),
        starts: j.starts,
        preemptions: j.preemptions,
        nodes: j
            .assignments
            .iter()
            .filter_map(|a| s.nodes().get(a.node.index()).map(|n| n.spec.name.clone()))
            .collect(),
    })
}

async fn get_job(
    AxState(gw): AxState<Gateway>,
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let n: u64 = id.parse().map_err(|_| ApiError {
        field: Some("id".into()),
        ..ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_field",
            "id: must be a job number",
        )
    })?;
    let p = read_view(&gw.view);
    job_view(&p, JobId(n))
        .map(Json)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no job {n}")))
}

/// `GET /v1/status`: where the view is and what it holds.
#[derive(Debug, Serialize)]
pub struct StatusView {
    /// Sequence of the last event folded.
    pub seq: u64,
    /// `State::state_hash` of the view.
    pub state_hash: String,
    /// Jobs known.
    pub jobs: usize,
    /// Jobs per phase.
    pub phases: std::collections::BTreeMap<String, u64>,
    /// Events superseded (refused by `apply`).
    pub superseded: u64,
}

async fn status(AxState(gw): AxState<Gateway>) -> Json<StatusView> {
    let p = read_view(&gw.view);
    let s = p.state();
    let phases = Phase::ALL
        .iter()
        .filter(|ph| s.phase_counts().get(**ph) > 0)
        .map(|ph| (format!("{ph:?}").to_lowercase(), s.phase_counts().get(*ph)))
        .collect();
    Json(StatusView {
        seq: p.seq(),
        state_hash: s.state_hash(),
        jobs: s.job_count(),
        phases,
        superseded: p.superseded(),
    })
}
