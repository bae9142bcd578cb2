//! A job's timeline over HTTP: the bars and marks of its Gantt chart, as
//! the dashboard draws it.
//!
//! Owns: which logged events make a job's story (its own, and the plans
//! that chose it as a victim, which are logged under their beneficiary).
//! The bars themselves are `gpusched_core::explain::gantt`'s. Must never:
//! show a tenant token another tenant's job (404, as everywhere).

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State as AxState};
use axum::Json;
use gpusched_core::{explain, Phase};
use gpusched_events::Event;
use gpusched_model::JobId;
use gpusched_runtime::read_view;
use serde::Serialize;
use utoipa::ToSchema;

use crate::answers::{LogUnavailable, NoSuchJob, NotAJobId, Unauthorized};
use crate::jobs::{job_id, path_param, visible};
use crate::{ApiError, Gateway, Principal};

/// A job's logged events in log order: its own and, for a job ever
/// preempted, the plans that chose it as a victim. 404 for a job `who`
/// may not see; 503 while the log is unreachable.
pub(crate) async fn job_story(
    gw: &Gateway,
    who: &Principal,
    id: JobId,
) -> Result<Vec<Event>, ApiError> {
    gw.knows_job(id).await;
    let was_victim = {
        let p = read_view(&gw.view);
        let j = visible(p.state(), who, id)?;
        j.preemptions > 0 || j.phase == Phase::Preempting
    };
    let unavailable = ApiError::log_unavailable;
    let mut logged = gw.log.job_events(id).await.map_err(unavailable)?;
    if was_victim {
        logged.extend(gw.log.plans_naming_victim(id).await.map_err(unavailable)?);
        logged.sort_by_key(|e| e.seq);
        logged.dedup_by_key(|e| e.seq);
    }
    Ok(logged.into_iter().map(|e| e.event).collect())
}

/// A span of time in one state.
#[derive(Debug, Serialize, ToSchema)]
pub struct TimelineBar {
    /// `pending`, `admitted`, `bound`, `running` or `preempting`.
    state: &'static str,
    /// Why, in words: the pending reason, the flavor admitted to, where
    /// it was bound.
    text: String,
    /// When it began (ms since the Unix epoch, log time).
    from_ms: u64,
    /// When it ended; `null` while it lasts.
    to_ms: Option<u64>,
    /// Nodes the job held during it.
    nodes: Vec<String>,
}

/// A moment: a checkpoint, a plan that chose the job, a preemption with
/// the work lost, a requeue, the end.
#[derive(Debug, Serialize, ToSchema)]
pub struct TimelineMark {
    /// When (ms since the Unix epoch, log time).
    at_ms: u64,
    /// The event's kind, e.g. `job_checkpointed`.
    kind: &'static str,
    /// The event in words.
    text: String,
}

/// `GET /v1/jobs/{id}/timeline`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct TimelineView {
    /// The job.
    id: u64,
    /// Consecutive spans, oldest first; the last may be open.
    bars: Vec<TimelineBar>,
    /// Moments, in log order.
    marks: Vec<TimelineMark>,
}

/// A job's life as a Gantt chart: each span of time in a state with its
/// reason (pending reasons, admission, binding and where, preemption) and
/// the moments between (checkpoints, preemptions with the work lost).
#[utoipa::path(get, path = "/v1/jobs/{id}/timeline", tag = "jobs",
    params(("id" = u64, Path, minimum = 1, maximum = 9_223_372_036_854_775_807_u64, description = "Job id")),
    responses(
        (status = 200, body = TimelineView),
        LogUnavailable,
        NotAJobId, Unauthorized, NoSuchJob),
    security(("bearer" = [])))]
pub async fn job_timeline(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<TimelineView>, ApiError> {
    let id = job_id(&path_param(id)?)?;
    let events = job_story(&gw, &who, id).await?;
    let p = read_view(&gw.view);
    let s = p.state();
    let g = explain::gantt(s, &events, id);
    let name = |n: &gpusched_model::NodeId| {
        s.nodes()
            .get(n.index())
            .map_or_else(|| n.to_string(), |x| x.spec.name.clone())
    };
    Ok(Json(TimelineView {
        id: id.0,
        bars: g
            .bars
            .into_iter()
            .map(|b| TimelineBar {
                state: b.lane.name(),
                text: b.text,
                from_ms: b.from.0,
                to_ms: b.to.map(|t| t.0),
                nodes: b.nodes.iter().map(name).collect(),
            })
            .collect(),
        marks: g
            .marks
            .into_iter()
            .map(|m| TimelineMark {
                at_ms: m.at.0,
                kind: m.kind,
                text: m.text,
            })
            .collect(),
    }))
}
