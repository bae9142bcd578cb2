//! The event log over HTTP: a page of events, or a live Server-Sent Events
//! stream resumable from a sequence number.
//!
//! Owns: what each principal may see of the log (the admin all of it; a
//! tenant token only its own jobs' events). Must never: hold the view's
//! lock across an await, or end a follow stream because the log is
//! momentarily unreachable.

use std::collections::HashSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State as AxState};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, StreamExt};
use gpusched_events::Event;
use gpusched_runtime::{read_view, Log, LoggedEvent, SharedView};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::answers::{LogUnavailable, Unauthorized};
use crate::jobs::MAX_SEQ;
use crate::{ApiError, ErrorBody, Gateway, Principal};

/// Query of `GET /v1/events`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Events after this sequence number (default 0: from the start). A
    /// `Last-Event-ID` header, as an SSE client sends on reconnect, wins.
    #[param(minimum = 0, maximum = 9_223_372_036_854_775_807_u64)]
    from: Option<u64>,
    /// Events per page without `follow`, 1 to 10000 (default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
    /// Stream as Server-Sent Events, live, until the client leaves.
    follow: Option<bool>,
}

/// One logged event.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogEntry {
    /// Its sequence number (the SSE `id`).
    seq: u64,
    /// Its kind (the SSE `event`).
    kind: String,
    /// The event (tagged by `type`).
    #[schema(value_type = Object)]
    event: Event,
}

/// One Server-Sent Event of `GET /v1/events?follow=true`, as the stream
/// carries it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SseFrame {
    /// The event's sequence number (resume with it as `Last-Event-ID`).
    id: String,
    /// Its kind, e.g. `job_submitted`.
    event: String,
    /// The event as JSON (tagged by `type`).
    data: String,
}

/// A page of the log.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    /// Events in order.
    events: Vec<LogEntry>,
    /// The last sequence number read: pass as `from` for the next page.
    last_seq: u64,
}

/// Which events a principal may see.
struct Visibility {
    tenant: Option<String>,
    /// Jobs of the tenant first seen in this stream's `JobSubmitted`s,
    /// which the view may not have folded yet.
    own: HashSet<u64>,
}

impl Visibility {
    fn new(who: &Principal) -> Self {
        Visibility {
            tenant: match who {
                Principal::Admin => None,
                Principal::Tenant(t) => Some(t.clone()),
            },
            own: HashSet::new(),
        }
    }

    fn filter(&mut self, view: &SharedView, events: Vec<LoggedEvent>) -> Vec<LoggedEvent> {
        let Some(t) = &self.tenant else {
            return events;
        };
        let p = read_view(view);
        let s = p.state();
        events
            .into_iter()
            .filter(|e| match (&e.event, e.event.job()) {
                (Event::JobSubmitted { job, spec, .. }, _) => {
                    let mine = &spec.tenant == t;
                    if mine {
                        self.own.insert(job.0);
                    }
                    mine
                }
                (_, Some(job)) => {
                    self.own.contains(&job.0) || s.job(job).is_some_and(|j| &j.spec.tenant == t)
                }
                (_, None) => false,
            })
            .collect()
    }
}

async fn read_page(log: &Log, after: u64, limit: usize) -> Result<Vec<LoggedEvent>, ApiError> {
    log.read_from(after, limit)
        .await
        .map_err(ApiError::log_unavailable)
}

fn sse_of(e: &LoggedEvent) -> SseEvent {
    let data = serde_json::to_string(&e.event).unwrap_or_else(|_| "{}".to_string());
    SseEvent::default()
        .id(e.seq.to_string())
        .event(e.event.kind())
        .data(data)
}

/// The event log: a page of events after `from`, or with `follow=true` a
/// live `text/event-stream` (each event's SSE `id` is its sequence number,
/// so a reconnecting client resumes with `Last-Event-ID`). A tenant token
/// sees only its own jobs' events.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, nullable = false, minimum = 0, maximum = 9_223_372_036_854_775_807_u64,
            description = "Resume after this sequence number")),
    responses(
        (status = 200, description = "A page (JSON), or with follow=true a text/event-stream",
            content((EventPage = "application/json"), (SseFrame = "text/event-stream"))),
        (status = 400, description = "A parameter broke a rule (named in `field`)", body = ErrorBody),
        Unauthorized,
        LogUnavailable),
    security(("bearer" = [])))]
pub async fn events(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    if q.from.is_some_and(|f| f > MAX_SEQ) {
        return Err(ApiError::field(
            "from",
            format!("must be a sequence number (0 to {MAX_SEQ})"),
        ));
    }
    let from = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|s| *s <= MAX_SEQ)
            .ok_or_else(|| {
                ApiError::field(
                    "Last-Event-ID",
                    format!("must be a sequence number (0 to {MAX_SEQ})"),
                )
            })?,
        None => q.from.unwrap_or(0),
    };
    let limit = q.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::field("limit", "must be 1 to 10000"));
    }
    let mut vis = Visibility::new(&who);
    if !q.follow.unwrap_or(false) {
        let page = read_page(&gw.log, from, limit).await?;
        let last_seq = page.last().map_or(from, |e| e.seq);
        let events = vis
            .filter(&gw.view, page)
            .into_iter()
            .map(|e| LogEntry {
                seq: e.seq,
                kind: e.event.kind().to_string(),
                event: e.event,
            })
            .collect();
        return Ok(Json(EventPage { events, last_seq }).into_response());
    }
    let (log, view) = (gw.log.clone(), gw.view.clone());
    let pages = stream::unfold((from, vis), move |(after, mut vis)| {
        let (log, view) = (log.clone(), view.clone());
        async move {
            loop {
                match log.read_from(after, 1000).await {
                    Ok(page) if !page.is_empty() => {
                        let next = page.last().map_or(after, |e| e.seq);
                        let shown: Vec<Result<SseEvent, Infallible>> = vis
                            .filter(&view, page)
                            .iter()
                            .map(|e| Ok(sse_of(e)))
                            .collect();
                        return Some((stream::iter(shown), (next, vis)));
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "event stream: log unreachable; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
    })
    .flatten();
    Ok(Sse::new(pages)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
