//! Cohort routes: each cohort's settings and its members' fair-share
//! standing, and the admin's change of a cohort's settings.
//!
//! Owns: how a cohort's borrowers are shown, in the order the quota stage
//! serves them (`quota::borrower_order`), with their decayed use. Must
//! never: write a change the state would refuse (400 instead), show a
//! tenant token another tenant's use, or let it change anything.

use std::collections::BTreeMap;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State as AxState};
use axum::response::Response;
use axum::Json;
use gpusched_core::{quota, State};
use gpusched_events::Event;
use gpusched_model::{CohortSpec, Timestamp};
use gpusched_runtime::read_view;
use serde::Serialize;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use crate::answers::{AdminWrite, FieldBroken, NotJson, TooLarge, Unauthorized};
use crate::cluster::{admin_put, created_or_replaced, name_from_path, write_change, ChangeReply};
use crate::{ApiError, ErrorBody, Gateway, Principal};

/// A member of a cohort, where it stands among its borrowers.
#[derive(Debug, Serialize, ToSchema)]
pub struct CohortMember {
    /// The tenant.
    tenant: String,
    /// Its fair-share weight.
    weight: f64,
    /// Its place in the order borrowable quota goes to the cohort's
    /// members (1: first), before the next cycle's admissions.
    place: u32,
    /// The share it is served by, divided by its weight (lower is served
    /// first): of the cohort's lendable quota, what it borrows now; with a
    /// half-life, what its decayed use fills.
    share: f64,
    /// Mean GPUs it held per flavor, weighted by age (use a half-life ago
    /// counts half); empty without a half-life.
    decayed_gpus: BTreeMap<String, f64>,
}

/// A cohort and its members.
#[derive(Debug, Serialize, ToSchema)]
pub struct CohortView {
    /// Its name.
    name: String,
    /// Seconds after which past use counts half; 0: borrowers are served
    /// by the share they borrow now.
    usage_half_life_s: u64,
    /// When its settings were last set (ms since the epoch); `null`: never.
    configured_at_ms: Option<u64>,
    /// Its members in the order they are served as borrowers (a tenant
    /// token sees only its own row).
    members: Vec<CohortMember>,
}

/// Every cohort.
#[derive(Debug, Serialize, ToSchema)]
pub struct CohortsView {
    /// By name.
    cohorts: Vec<CohortView>,
}

/// Every cohort at `now`, members in the order they are served.
pub fn cohorts_view(s: &State, now: Timestamp) -> CohortsView {
    let mut cohorts: Vec<CohortView> = (0..s.cohorts().len() as u32)
        .map(|c| {
            let cohort = s.cohort(c);
            let half_life = cohort.half_life_ms();
            let members = quota::borrower_order(s, c, now)
                .into_iter()
                .enumerate()
                .map(|(i, (t, share))| {
                    let tenant = s.tenant(t);
                    let decayed = s.decayed_use(t, now);
                    let decayed_gpus = if half_life == 0 {
                        BTreeMap::new()
                    } else {
                        tenant
                            .flavor_order
                            .iter()
                            .map(|&f| {
                                let gpus = decayed.mean_gpus(f as usize, half_life);
                                (s.flavor_name(f).to_string(), gpus)
                            })
                            .collect()
                    };
                    CohortMember {
                        tenant: tenant.spec.name.clone(),
                        weight: tenant.spec.weight,
                        place: i as u32 + 1,
                        share,
                        decayed_gpus,
                    }
                })
                .collect();
            CohortView {
                name: cohort.name.clone(),
                usage_half_life_s: cohort.usage_half_life_s,
                configured_at_ms: cohort.configured_at.map(|t| t.0),
                members,
            }
        })
        .collect();
    cohorts.sort_by(|a, b| a.name.cmp(&b.name));
    CohortsView { cohorts }
}

/// Every cohort: its usage half-life and its members in the order
/// borrowable quota goes to them, with their weighted share and decayed
/// use. The admin sees every cohort; a tenant token only its own cohort,
/// and in it only its own row (its place among all members).
#[utoipa::path(get, path = "/v1/cohorts", tag = "cluster",
    responses((status = 200, body = CohortsView), Unauthorized),
    security(("bearer" = [])))]
pub async fn cohorts(who: Principal, AxState(gw): AxState<Gateway>) -> Json<CohortsView> {
    let p = read_view(&gw.view);
    let mut view = cohorts_view(p.state(), gpusched_runtime::wall_clock());
    for c in &mut view.cohorts {
        c.members.retain(|m| who.may_touch(&m.tenant));
    }
    view.cohorts
        .retain(|c| !c.members.is_empty() || who.require_admin().is_ok());
    Json(view)
}

/// `PUT /v1/cohorts/{name}`'s body: a [`CohortSpec`] whose `name` may be
/// left out, as the path names the cohort.
pub struct CohortUpdate;

impl utoipa::PartialSchema for CohortUpdate {
    fn schema() -> RefOr<Schema> {
        name_from_path::<CohortSpec>("cohort")
    }
}

impl ToSchema for CohortUpdate {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        <CohortSpec as ToSchema>::schemas(schemas);
    }
}

/// Set a cohort's settings (admin): its usage half-life. Members' decayed
/// use is brought up to now under the old half-life, then the new one
/// applies; 0 drops it, and borrowers are served by the share they borrow
/// now. A cohort no tenant names yet is created, empty.
#[utoipa::path(put, path = "/v1/cohorts/{name}", tag = "admin",
    request_body(content = CohortUpdate, content_type = "application/json"),
    params(("name" = String, Path, min_length = 1, description = "Cohort name")),
    responses(
        (status = 201, description = "Created", body = ChangeReply),
        (status = 200, description = "Replaced", body = ChangeReply),
        FieldBroken,
        (status = 404, description = "No cohort name in the path (`/v1/cohorts/`)", body = ErrorBody),
        AdminWrite,
        TooLarge, NotJson),
    security(("bearer" = [])))]
pub async fn put_cohort(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (name, spec) = admin_put(&who, name, body, "cohort", CohortSpec::check_fields)?;
    let existed = read_view(&gw.view).state().cohort_idx(&name).is_some();
    let event = Event::CohortConfigured {
        spec,
        at: gpusched_runtime::wall_clock(),
    };
    let (seq, _) = write_change(&gw, event).await?;
    Ok(created_or_replaced(existed, seq, name))
}
