//! Budget routes: set or remove a tenant's GPU-hour budget in one flavor
//! without restating the rest of the tenant.
//!
//! Owns: `PUT` and `DELETE /v1/tenants/{name}/budgets/{flavor}`, which
//! read the tenant's configuration from the view, change that flavor's
//! budget and write the whole configuration back (`TenantConfigured`).
//!
//! Must never: change anything of the tenant but that budget, or create a
//! tenant or a flavor quota (404: `PUT /v1/tenants/{name}` does that).
//! Two admins changing one tenant at once: the later write wins, as with
//! `PUT /v1/tenants/{name}`.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State as AxState};
use axum::response::Response;
use axum::Json;
use gpusched_model::{Budget, TenantSpec};
use gpusched_runtime::read_view;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::answers::{AdminWrite, ConfigRefused, FieldBroken, NotJson, TooLarge};
use crate::cluster::{configure_tenant, created_or_replaced, ChangeReply};
use crate::{ApiError, ErrorBody, Gateway, Principal};

/// The tenant's configuration with `flavor`'s budget set to `budget`, and
/// whether it had one; 404 without such a tenant or quota.
fn with_budget(
    gw: &Gateway,
    name: &str,
    flavor: &str,
    budget: Option<Budget>,
) -> Result<(TenantSpec, bool), ApiError> {
    let p = read_view(&gw.view);
    let s = p.state();
    let mut spec = s
        .tenant_idx(name)
        .map(|t| s.tenant(t).spec.clone())
        .ok_or_else(|| ApiError::not_found(format!("no tenant {name}")))?;
    let quota = spec
        .quotas
        .iter_mut()
        .find(|q| q.flavor == flavor)
        .ok_or_else(|| ApiError::not_found(format!("tenant {name} has no quota in {flavor}")))?;
    let had = quota.budget.is_some();
    quota.budget = budget;
    Ok((spec, had))
}

/// The path of a tenant's budget in one flavor.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct BudgetPath {
    /// Tenant name.
    #[param(min_length = 1)]
    name: String,
    /// A flavor the tenant has a quota in.
    #[param(min_length = 1)]
    flavor: String,
}

impl BudgetPath {
    /// The tenant and flavor the path names; 400 for a path that is not one.
    fn read(p: Result<Path<BudgetPath>, PathRejection>) -> Result<(String, String), ApiError> {
        let BudgetPath { name, flavor } = p?.0;
        Ok((name, flavor))
    }
}

/// Set a tenant's GPU-hour budget in one flavor (admin): GPU-hours per
/// calendar period (UTC `day`, `week` or `month`) and what its jobs there
/// do once they are spent (`wait` for the next period, or `borrow-only`).
/// A budget kept with the same period goes on counting; a new one, or a
/// new period, counts from now.
#[utoipa::path(put, path = "/v1/tenants/{name}/budgets/{flavor}", tag = "admin",
    request_body(content = Budget, content_type = "application/json"),
    params(BudgetPath),
    responses(
        (status = 201, description = "Set where there was none", body = ChangeReply),
        (status = 200, description = "Replaced", body = ChangeReply),
        FieldBroken,
        (status = 404, description = "No such tenant, or no quota of it in the flavor", body = ErrorBody),
        ConfigRefused,
        AdminWrite,
        TooLarge, NotJson),
    security(("bearer" = [])))]
pub async fn put_budget(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    path: Result<Path<BudgetPath>, PathRejection>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    who.require_admin()?;
    let (name, flavor) = BudgetPath::read(path)?;
    let Json(v) = body?;
    if !v.is_object() {
        return Err(ApiError::field("body", "must be a JSON object (a budget)"));
    }
    let budget: Budget = crate::from_json(v)?;
    budget
        .check_fields("")
        .map_err(|e| ApiError::field(&e.field, &e.rule))?;
    let (spec, had) = with_budget(&gw, &name, &flavor, Some(budget))?;
    let seq = configure_tenant(&gw, spec).await?;
    Ok(created_or_replaced(had, seq, name))
}

/// Remove a tenant's GPU-hour budget in one flavor (admin): its jobs there
/// are served by quota alone again.
#[utoipa::path(delete, path = "/v1/tenants/{name}/budgets/{flavor}", tag = "admin",
    params(BudgetPath),
    responses(
        (status = 200, description = "Removed", body = ChangeReply),
        (status = 404, description = "No such tenant, no quota of it in the flavor, or no budget there", body = ErrorBody),
        ConfigRefused,
        AdminWrite),
    security(("bearer" = [])))]
pub async fn delete_budget(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    path: Result<Path<BudgetPath>, PathRejection>,
) -> Result<Json<ChangeReply>, ApiError> {
    who.require_admin()?;
    let (name, flavor) = BudgetPath::read(path)?;
    let (spec, had) = with_budget(&gw, &name, &flavor, None)?;
    if !had {
        return Err(ApiError::not_found(format!(
            "tenant {name} has no budget in {flavor}"
        )));
    }
    let seq = configure_tenant(&gw, spec).await?;
    Ok(Json(ChangeReply { seq, now: name }))
}
