//! Health and readiness, told truthfully.
//!
//! Owns: `/healthz` (liveness: the process's view follower is going round;
//! a stuck one is 503), `/readyz` (the view has caught up with the log
//! once and the log answers; the bus is reported but optional), and the
//! gate that answers every `/v1` route 503 with `Retry-After` until the
//! view has caught up — a view that has not read the log yet would
//! answer "unknown tenant" or "no such job" to valid requests.
//!
//! Must never: answer ready while the view cannot judge requests, or
//! gate the health routes themselves.

use axum::extract::{Request, State as AxState};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::{ApiError, Gateway};

/// A follower loop that has not gone round for this long is stuck.
const STUCK_AFTER_MS: u64 = 10_000;

/// `GET /readyz`: whether the gateway can judge and write requests.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReadyView {
    /// Ready to serve: caught up and the log reachable.
    pub ready: bool,
    /// The view has folded the whole log once.
    pub caught_up: bool,
    /// The log answered its last read.
    pub log_reachable: bool,
    /// The bus fails (the view follows the log alone; still ready).
    pub bus_down: bool,
    /// Sequence of the view.
    pub seq: u64,
}

/// Answers 503 (with `Retry-After`) to every `/v1` route until the view
/// has caught up with the log.
pub async fn until_caught_up(AxState(gw): AxState<Gateway>, req: Request, next: Next) -> Response {
    if req.uri().path().starts_with("/v1/") && !gw.follower.is_caught_up() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the gateway is still reading the event log; retry shortly",
        )
        .into_response();
    }
    next.run(req).await
}

/// Liveness: `ok` while the view's follower goes round.
#[utoipa::path(get, path = "/healthz", tag = "cluster",
    responses((status = 200, body = String), (status = 503, body = String)))]
pub async fn healthz(AxState(gw): AxState<Gateway>) -> (StatusCode, &'static str) {
    if gw.follower.loop_age_ms() > STUCK_AFTER_MS {
        (StatusCode::SERVICE_UNAVAILABLE, "stuck")
    } else {
        (StatusCode::OK, "ok")
    }
}

/// Readiness: 200 when the view has caught up and the log answers, 503
/// otherwise; the body says which.
#[utoipa::path(get, path = "/readyz", tag = "cluster",
    responses((status = 200, body = ReadyView), (status = 503, body = ReadyView)))]
pub async fn readyz(AxState(gw): AxState<Gateway>) -> (StatusCode, Json<ReadyView>) {
    let f = &gw.follower;
    let view = ReadyView {
        ready: f.is_caught_up() && f.log_reachable(),
        caught_up: f.is_caught_up(),
        log_reachable: f.log_reachable(),
        bus_down: f.bus_down.load(std::sync::atomic::Ordering::Relaxed),
        seq: gpusched_runtime::read_view(&gw.view).seq(),
    };
    let status = if view.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(view))
}
