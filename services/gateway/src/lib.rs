//! The API gateway: the HTTP surface of gpusched (axum).
//!
//! Owns: the HTTP routes and their OpenAPI document, bearer-token auth,
//! request validation (fields and JSON shape, and a fast check against the
//! cluster as the gateway's view knows it), the events users and admins
//! cause directly (`JobSubmitted`, `JobCancelled`, `JobCancelRequested`,
//! `TenantConfigured`, node cordon and drain), and a read-only view of the
//! state for queries.
//!
//! Must never: decide admission, quota or placement (a submission is only
//! recorded; the admission service judges it), answer a write before its
//! event is committed to the log, or answer bad input with a 5xx.

mod answers;
mod arrays;
mod auth;
mod batch;
mod budgets;
mod cluster;
mod cohorts;
mod events_api;
mod health;
mod jobs;
mod logs;
mod metrics;
mod submit;
mod timeline;
mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use gpusched_core::Phase;
use gpusched_runtime::{
    follow, read_view, Bus, FollowerHealth, LeaseSpec, Log, Projection, SharedView, SnapshotPolicy,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::answers::Unauthorized;

pub use auth::{hash_token, AuthArgs, AuthConfigError, Principal, Tokens};
pub use cluster::{nodes_view, queues_view};
pub use cohorts::cohorts_view;
pub use health::ReadyView;
pub use jobs::{job_view, phase_name};
pub use submit::{start_writer, SubmitError, Submitted, Submitter};

/// Largest request body accepted (413 above).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct Gateway {
    /// Writes (submissions, cancellations, admin changes).
    pub submitter: Submitter,
    /// The state as of the last event followed.
    pub view: SharedView,
    /// The log, for histories and the event stream.
    pub log: Log,
    /// Who each bearer token speaks for.
    pub tokens: Arc<Tokens>,
    /// The node network and its subject root, where node agents answer
    /// for their workers' logs; `None` where no real agents run.
    pub node_net: Option<(gpusched_bus::node_net::NodeNet, String)>,
    /// How the view's follower is doing (readiness, health).
    pub follower: Arc<FollowerHealth>,
}

impl Gateway {
    /// Waits (up to 2 s) until the view has folded `seq`, so a client reads
    /// its own write; answers whether it did.
    pub async fn caught_up(&self, seq: u64) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            if read_view(&self.view).seq() >= seq {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Before a read of job `id`: where the view does not hold it yet,
    /// waits (as [`Gateway::caught_up`]) until the view has folded what the
    /// log holds now, so that a client reads a job it has just submitted,
    /// here or through another gateway. Only a miss asks the log; a log
    /// that does not answer leaves the read to the view as it is.
    pub async fn knows_job(&self, id: gpusched_model::JobId) {
        let known = read_view(&self.view).state().job(id).is_some();
        if known {
            return;
        }
        if let Ok(head) = self.log.max_seq().await {
            self.caught_up(head).await;
        }
    }
}

/// How long a gateway's writer lease lives when not told otherwise.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// Starts the writer and the view follower; serve it with [`router`].
pub fn start(
    log: Log,
    bus: Bus,
    instance: &str,
    tokens: Tokens,
    shutdown: CancellationToken,
) -> (Gateway, Vec<tokio::task::JoinHandle<()>>) {
    let no_snapshots = SnapshotPolicy {
        every_events: 0,
        ..SnapshotPolicy::default()
    };
    start_with(
        log,
        bus,
        instance,
        tokens,
        DEFAULT_LEASE_TTL,
        no_snapshots,
        shutdown,
    )
}

/// [`start`] with the writer's lease time to live and when the view
/// writes snapshots of the state (for every service to start from).
pub fn start_with(
    log: Log,
    bus: Bus,
    instance: &str,
    tokens: Tokens,
    lease_ttl: Duration,
    snapshots: SnapshotPolicy,
    shutdown: CancellationToken,
) -> (Gateway, Vec<tokio::task::JoinHandle<()>>) {
    let spec = LeaseSpec {
        service: "gateway".into(),
        partition: instance.to_string(),
        holder: instance.to_string(),
        ttl: lease_ttl,
    };
    let (submitter, writer) = start_writer(log.clone(), bus.clone(), spec, shutdown.clone());
    let view: SharedView = Arc::new(std::sync::RwLock::new(Projection::new().counting()));
    let follower = Arc::new(FollowerHealth::default());
    let task = tokio::spawn(follow(
        log.clone(),
        bus,
        view.clone(),
        Duration::from_millis(500),
        follower.clone(),
        snapshots,
        instance.to_string(),
        shutdown,
    ));
    (
        Gateway {
            submitter,
            view,
            log,
            tokens: Arc::new(tokens),
            node_net: None,
            follower,
        },
        vec![writer, task],
    )
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "gpusched",
        description = "A durable, event-sourced scheduler for GPU batch jobs. Every route but \
            /healthz, /readyz, /metrics and /openapi.json needs `Authorization: Bearer <token>`: 401 without a \
            known token; a tenant token that names another tenant's job gets 404 (ids cannot \
            be probed), and admin routes answer 403 to it. Until the gateway's view has caught up \
            with the log (just after it starts) every /v1 route answers 503 with Retry-After, \
            as it does while the log is unreachable. Errors are \
            `{\"error\": {\"code\", \"message\", \"field\"?}}`."
    ),
    modifiers(&BearerAuth),
    components(schemas(ErrorBody, ErrorDetail, cluster::NodeAction, cluster::QueueAction, jobs::Order, logs::LogStream))
)]
struct ApiDoc;

/// The routes with their OpenAPI document, before state is attached.
fn routes() -> (Router<Gateway>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(jobs::submit_job, jobs::list_jobs))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(batch::submit_batch))
                .layer(DefaultBodyLimit::max(batch::MAX_BATCH_BODY_BYTES)),
        )
        .routes(routes!(jobs::get_job, jobs::cancel_job))
        .routes(routes!(arrays::submit_array))
        .routes(routes!(arrays::get_array, arrays::cancel_array))
        .routes(routes!(jobs::job_events))
        .routes(routes!(jobs::explain_job))
        .routes(routes!(timeline::job_timeline))
        .routes(routes!(logs::job_logs))
        .routes(routes!(cluster::queues))
        .routes(routes!(cluster::nodes))
        .routes(routes!(cluster::put_tenant))
        .routes(routes!(budgets::put_budget, budgets::delete_budget))
        .routes(routes!(cohorts::cohorts))
        .routes(routes!(cohorts::put_cohort))
        .routes(routes!(cluster::change_node))
        .routes(routes!(cluster::change_queue))
        .routes(routes!(events_api::events))
        .routes(routes!(status))
        .routes(routes!(auth::whoami))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::metrics))
        .split_for_parts()
}

/// The OpenAPI 3 document of every route [`router`] serves.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = routes();
    doc.paths.paths.insert(
        "/openapi.json".to_string(),
        utoipa::openapi::PathItem::new(
            utoipa::openapi::HttpMethod::Get,
            utoipa::openapi::path::OperationBuilder::new()
                .summary(Some("This document."))
                .response("200", utoipa::openapi::Response::new("OpenAPI 3 JSON")),
        ),
    );
    doc
}

/// The HTTP routes.
pub fn router(gw: Gateway) -> Router {
    let (r, _) = routes();
    let doc = Arc::new(openapi());
    r.merge(ui::routes())
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { Json(doc.as_ref().clone()) }
            }),
        )
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            health::until_caught_up,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
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
    serve_on(gw, listener, shutdown).await
}

/// Serves `router(gw)` on a bound listener until `shutdown`.
pub async fn serve_on(
    gw: Gateway,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "gateway listening");
    }
    axum::serve(listener, router(gw))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

/// An error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable code, e.g. `invalid_field`, `not_found`, `unauthorized`.
    code: String,
    /// A sentence for people, naming the field and the rule.
    message: String,
    /// The field at fault, as the client wrote it, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
}

/// An error answer: a status and `{"error": {"code", "message", "field"?}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
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

    /// The error as an answer's body shows it.
    fn detail(self) -> ErrorDetail {
        ErrorDetail {
            code: self.code.to_string(),
            message: self.message,
            field: self.field,
        }
    }

    /// The same error with its field placed inside `outer` (`tenant`
    /// within `jobs[3]` is `jobs[3].tenant`), its message naming it so.
    fn within(self, outer: &str) -> Self {
        let (field, rest) = match self.field.as_deref() {
            Some(f) if !f.is_empty() => {
                let rest = self
                    .message
                    .strip_prefix(&format!("{f}: "))
                    .unwrap_or(&self.message);
                (format!("{outer}.{f}"), rest.to_string())
            }
            _ => (
                outer.to_string(),
                self.message
                    .strip_prefix(": ")
                    .unwrap_or(&self.message)
                    .to_string(),
            ),
        };
        ApiError {
            message: format!("{field}: {rest}"),
            field: Some(field),
            ..self
        }
    }

    /// 400 naming a field and the rule it broke.
    fn field(field: &str, rule: impl std::fmt::Display) -> Self {
        ApiError {
            field: Some(field.to_string()),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_field",
                format!("{field}: {rule}"),
            )
        }
    }

    /// 503: the event log could not be read; nothing was written.
    fn log_unavailable(e: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.to_string(),
        )
    }

    fn not_found(what: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    fn conflict(what: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, "conflict", what)
    }

    fn unavailable(e: SubmitError) -> Self {
        match e {
            SubmitError::Busy => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_requests",
                e.to_string(),
            ),
            SubmitError::KeyReused => ApiError {
                field: Some("Idempotency-Key".into()),
                ..ApiError::new(
                    StatusCode::CONFLICT,
                    "idempotency_key_reused",
                    e.to_string(),
                )
            },
            SubmitError::Unavailable(_) | SubmitError::Closed => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let body = ErrorBody {
            error: self.detail(),
        };
        let mut r = (status, Json(body)).into_response();
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                "www-authenticate",
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

/// The field serde named in a message such as "unknown field `x`" or
/// "missing field `x`" or "workers: invalid type ...", if any.
fn serde_field(msg: &str) -> Option<String> {
    for marker in ["unknown field `", "missing field `"] {
        if let Some(rest) = msg.split(marker).nth(1) {
            return rest.split('`').next().map(str::to_string);
        }
    }
    let head = msg.split(": ").next()?;
    let looks_like_path = !head.is_empty()
        && head.len() < msg.len()
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']'));
    looks_like_path.then(|| head.to_string())
}

/// A JSON object read as `T`; where it cannot be, 400 naming the field:
/// the one serde names in its message, else the path to the value that
/// broke.
fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.inner().to_string();
        match serde_field(&msg) {
            Some(f) => ApiError::field(&f, msg),
            None if path != "." => ApiError::field(&path, msg),
            None => ApiError::new(StatusCode::BAD_REQUEST, "invalid_field", msg),
        }
    })
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let (status, code) = match &r {
            JsonRejection::MissingJsonContentType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            JsonRejection::BytesRejection(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
            }
            JsonRejection::JsonSyntaxError(_) => (StatusCode::BAD_REQUEST, "bad_json"),
            _ => (StatusCode::BAD_REQUEST, "invalid_field"),
        };
        let message = r.body_text();
        let field = (code == "invalid_field")
            .then(|| {
                serde_field(message.trim_start_matches(
                    "Failed to deserialize the JSON body into the target type: ",
                ))
            })
            .flatten();
        ApiError {
            field,
            ..ApiError::new(status, code, message)
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        let message = r.body_text();
        let field = serde_field(message.trim_start_matches("Failed to deserialize query string: "));
        ApiError {
            field,
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message)
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", r.body_text())
    }
}

/// `GET /v1/status`: where the view is and what it holds.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusView {
    /// Sequence of the last event folded.
    pub seq: u64,
    /// `State::state_hash` of the view; only with `?hash=true` (it reads
    /// the whole state: about 10 ms at 100k jobs, growing with the state).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_hash: Option<String>,
    /// Jobs known.
    pub jobs: usize,
    /// Jobs per phase.
    pub phases: std::collections::BTreeMap<String, u64>,
    /// Events superseded (refused by `apply`).
    pub superseded: u64,
}

/// What `GET /v1/status` is asked for.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// Also give the view's state hash (default false: hashing reads the
    /// whole state, so a status poll stays cheap at any size).
    hash: Option<bool>,
}

/// Where the gateway's view of the log stands.
#[utoipa::path(get, path = "/v1/status", tag = "cluster", params(StatusQuery),
    responses((status = 200, body = StatusView), (status = 400, body = ErrorBody),
        Unauthorized),
    security(("bearer" = [])))]
async fn status(
    _who: Principal,
    AxState(gw): AxState<Gateway>,
    q: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Json<StatusView>, ApiError> {
    let Query(q) = q?;
    let p = read_view(&gw.view);
    let s = p.state();
    let phases = Phase::ALL
        .iter()
        .filter(|ph| s.phase_counts().get(**ph) > 0)
        .map(|ph| (jobs::phase_name(*ph).to_string(), s.phase_counts().get(*ph)))
        .collect();
    Ok(Json(StatusView {
        seq: p.seq(),
        state_hash: q.hash.unwrap_or(false).then(|| s.state_hash()),
        jobs: s.job_count(),
        phases,
        superseded: p.superseded(),
    }))
}
