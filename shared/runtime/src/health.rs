//! A deciding service's health over HTTP, when asked for with
//! `--health-listen` (the gateway answers these on its own address).
//!
//! Owns: `GET /healthz` (liveness: the service's loop went round within
//! [`STUCK_AFTER`]; a loop stuck on I/O or a lock is 503, whatever else
//! still runs) and `GET /readyz` (readiness: alive, the event log
//! reachable, the bus answering and the fold at the log's end once;
//! leading at an epoch or standing by, both ready: a standby folds the
//! log as it waits, and a leader that loses its lease stands by), both
//! with the
//! service's counters as JSON, `/readyz` with `ready` and the reasons it
//! is not (`not_ready`); and `GET /metrics`, the loop's Prometheus
//! metrics (`crate::metrics`).
//!
//! Must never: answer from anything but the loop's own heartbeat (a stats
//! writer or this server staying up says nothing about the loop), or bind
//! anything but the address it is given.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use crate::clock::wall_clock;
use crate::stats::{ServiceStats, StatsSnapshot};

/// A loop that has not gone round for this long is stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Health {
    service: String,
    stats: Arc<ServiceStats>,
}

impl Health {
    fn answer(&self) -> (StatusCode, Json<StatsSnapshot>) {
        let snap = StatsSnapshot::of(&self.service, &self.stats);
        let age = wall_clock().0.saturating_sub(snap.loop_unix_ms);
        let alive = snap.loop_unix_ms > 0 && age <= STUCK_AFTER.as_millis() as u64;
        let status = if alive {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, Json(snap))
    }
}

async fn healthz(State(h): State<Health>) -> (StatusCode, Json<StatsSnapshot>) {
    h.answer()
}

/// `/readyz`'s body: the counters, whether the service is ready, and why
/// not.
#[derive(serde::Serialize)]
struct Readiness {
    ready: bool,
    not_ready: Vec<&'static str>,
    #[serde(flatten)]
    stats: StatsSnapshot,
}

async fn readyz(State(h): State<Health>) -> (StatusCode, Json<Readiness>) {
    let (alive, Json(stats)) = h.answer();
    let mut not_ready = Vec::new();
    if alive != StatusCode::OK {
        not_ready.push("the service's loop is stuck");
    }
    if stats.caught_up_unix_ms == 0 {
        not_ready.push("still folding the log: its end not reached yet");
    }
    if stats.log_down {
        not_ready.push("the event log is unreachable");
    }
    if stats.bus_down {
        not_ready.push("the bus is unreachable (deciding from the log meanwhile)");
    }
    let ready = not_ready.is_empty();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(Readiness {
            ready,
            not_ready,
            stats,
        }),
    )
}

/// The routes, over `stats`.
pub fn health_router(service: &str, stats: Arc<ServiceStats>) -> Router {
    let h = Health {
        service: service.to_string(),
        stats,
    };
    let registry = Arc::new(crate::metrics::service_registry(service, h.stats.clone()));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(h)
        .route("/metrics", crate::metrics::metrics_route(registry))
}

/// Serves [`health_router`] on `addr` until `shutdown`.
pub async fn serve_health(
    addr: SocketAddr,
    service: &str,
    stats: Arc<ServiceStats>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "health endpoint listening");
    axum::serve(listener, health_router(service, stats))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get_status(addr: SocketAddr, path: &str) -> (u16, String) {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        send_raw(addr, req.as_bytes()).await
    }

    /// Sends `req` as is and reads the answer to its end.
    async fn send_raw(addr: SocketAddr, req: &[u8]) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The server may answer and close before reading all of it.
        let _ = s.write_all(req).await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let out = String::from_utf8_lossy(&out).into_owned();
        let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, out)
    }

    async fn serve(stats: Arc<ServiceStats>) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = health_router("quota", stats);
        tokio::spawn(async move { axum::serve(listener, router).await });
        addr
    }

    #[tokio::test]
    async fn ready_only_with_the_log_and_the_bus_and_says_why_not() {
        let stats = Arc::new(ServiceStats::default());
        stats.beat();
        let addr = serve(stats.clone()).await;
        let (code, body) = get_status(addr, "/readyz").await;
        assert_eq!(code, 503, "not ready before the fold reached the log's end");
        assert!(body.contains("still folding the log"), "{body}");
        stats.caught_up();
        assert_eq!(get_status(addr, "/readyz").await.0, 200);
        stats.log_down.store(1, Ordering::Relaxed);
        let (code, body) = get_status(addr, "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("\"ready\":false"), "{body}");
        assert!(body.contains("the event log is unreachable"), "{body}");
        // Alive all the same.
        assert_eq!(get_status(addr, "/healthz").await.0, 200);
        stats.log_down.store(0, Ordering::Relaxed);
        stats.bus_down.store(1, Ordering::Relaxed);
        let (code, body) = get_status(addr, "/readyz").await;
        assert_eq!(code, 503);
        assert!(body.contains("the bus is unreachable"), "{body}");
        assert!(!body.contains("event log"), "{body}");
        stats.bus_down.store(0, Ordering::Relaxed);
        let (code, body) = get_status(addr, "/readyz").await;
        assert_eq!(code, 200);
        assert!(body.contains("\"ready\":true"), "{body}");
    }

    #[tokio::test]
    async fn malformed_or_oversized_requests_get_a_4xx_never_a_5xx() {
        let stats = Arc::new(ServiceStats::default());
        stats.beat();
        let addr = serve(stats).await;
        let big = "x".repeat(2 << 20);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("unknown path", b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec()),
            ("wrong method", b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}".to_vec()),
            ("not HTTP", b"\x16\x03\x01garbage\r\n\r\n".to_vec()),
            ("bad request line", b"GET\r\n\r\n".to_vec()),
            ("bad percent-encoding", b"GET /healthz/%zz%ff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec()),
            ("huge header", format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").into_bytes()),
            ("huge body", format!("POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{big}", big.len()).into_bytes()),
            ("bad content length", b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".to_vec()),
        ];
        for (what, req) in cases {
            let (code, out) = send_raw(addr, &req).await;
            // 0: the connection was closed without an answer, which is
            // how hyper refuses what is not HTTP at all.
            assert!(code < 500, "{what}: {code}: {out}");
        }
        // And the endpoint still answers.
        let (code, out) = get_status(addr, "/healthz?x=%zz&&=").await;
        assert_eq!(code, 200, "{out}");
    }

    #[tokio::test]
    async fn a_loop_that_stops_going_round_is_unhealthy() {
        let stats = Arc::new(ServiceStats::default());
        let addr = serve(stats.clone()).await;

        // Never went round: not alive.
        assert_eq!(get_status(addr, "/healthz").await.0, 503);
        stats.beat();
        stats.caught_up();
        stats.leading_epoch.store(7, Ordering::Relaxed);
        let (code, body) = get_status(addr, "/readyz").await;
        assert_eq!(code, 200);
        assert!(body.contains("\"leading_epoch\":7"), "{body}");
        // Stuck for longer than STUCK_AFTER (the stats writer may still run).
        let stale = wall_clock().0 - STUCK_AFTER.as_millis() as u64 - 1_000;
        stats.loop_unix_ms.store(stale, Ordering::Relaxed);
        assert_eq!(get_status(addr, "/healthz").await.0, 503);
    }
}
