//! Cluster routes: queues, nodes, and the admin's tenant and node changes.
//!
//! Owns: how quota use per tenant and flavor is reported, and the checks
//! an admin change must pass before its event is written. Must never:
//! write a change the state would refuse when the view says so (409
//! instead), or let a tenant token change anything here.

use std::collections::BTreeMap;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpusched_core::{NodeStatus, Phase, State};
use gpusched_events::{Event, QueueState};
use gpusched_model::{BudgetPeriod, Gpus, NodeId, TenantSpec, Timestamp, WhenSpent};
use gpusched_runtime::read_view;
use serde::Serialize;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use crate::answers::{
    AdminWrite, ConfigRefused, FieldBroken, NoSuchNode, NotJson, TooLarge, Unauthorized,
};
use crate::jobs::path_param;
use crate::{ApiError, ErrorBody, Gateway, Principal};

/// One tenant's quota and use in one flavor.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueRow {
    /// The tenant (queue).
    pub(crate) tenant: String,
    /// What its queue lets through: `open`, `held` (nothing admitted),
    /// `draining` (nothing admitted or accepted; running jobs finish) or
    /// `stopped` (as draining, and its running jobs are evicted).
    #[schema(value_type = String)]
    pub(crate) queue: QueueState,
    /// Its cohort, if it shares quota.
    cohort: Option<String>,
    /// The GPU flavor.
    pub(crate) flavor: String,
    /// GPUs it is entitled to.
    pub(crate) nominal: Gpus,
    /// GPUs it may borrow above nominal (`null`: bounded by the cohort only).
    borrowing_limit: Option<Gpus>,
    /// GPUs charged to its admitted, bound and running jobs.
    pub(crate) used: Gpus,
    /// GPUs of `used` above nominal, borrowed from the cohort.
    pub(crate) borrowed: Gpus,
    /// Its idle lendable quota that others in the cohort use now: the
    /// cohort's borrowing shared among its idle lenders in proportion to
    /// what each leaves idle.
    pub(crate) lent: Gpus,
    /// Jobs waiting for quota or GPUs whose first choice is this flavor.
    pub(crate) pending: u64,
    /// `pending` by the reason the last cycle gave (`quota_exceeded`,
    /// `cohort_exhausted`, `budget_spent`, `no_domain_fits`, `behind_head`; `none`: not
    /// examined yet), or what keeps a job out of the queue
    /// (`waiting_for_jobs`, `array_limit`, `dependency_failed`).
    pending_by_reason: BTreeMap<&'static str, u64>,
    /// Jobs bound or running in this flavor.
    pub(crate) running: u64,
    /// Where its cohort keeps use with a half-life: the mean GPUs it held
    /// in this flavor, weighted by age, up to now; `null` otherwise.
    pub(crate) decayed_gpus: Option<f64>,
    /// Its GPU-hour budget in this flavor and where it stands this period;
    /// `null` without one.
    pub(crate) budget: Option<BudgetStanding>,
}

/// A tenant's GPU-hour budget in one flavor, this period.
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetStanding {
    /// GPU-hours allowed per period.
    pub(crate) gpu_hours: u64,
    /// `day`, `week` or `month` (UTC calendar).
    pub(crate) period: BudgetPeriod,
    /// What its jobs do once it is spent: `wait` for the next period, or
    /// `borrow-only` (run only on quota the cohort lends, first reclaimed).
    pub(crate) when_spent: WhenSpent,
    /// GPU-hours held this period, up to now.
    pub(crate) used_gpu_hours: f64,
    /// GPU-hours left this period.
    pub(crate) left_gpu_hours: f64,
    /// Whether the log marks it spent (`budget_spent`): its policy applies.
    pub(crate) spent: bool,
    /// When this period began, ms since the epoch.
    pub(crate) period_start_ms: u64,
    /// When the next period begins, ms since the epoch.
    pub(crate) renews_at_ms: u64,
}

impl BudgetStanding {
    /// Where `ledger` stands at `now`, `gpus` being held since its last
    /// event.
    fn of(ledger: &gpusched_core::BudgetLedger, gpus: Gpus, now: Timestamp) -> Self {
        let b = ledger.budget;
        let now = now.max(ledger.at);
        let hours = |ms: u64| ms as f64 / 3_600_000.0;
        BudgetStanding {
            gpu_hours: b.gpu_hours,
            period: b.period,
            when_spent: b.when_spent,
            used_gpu_hours: hours(ledger.used_at(gpus, now)),
            left_gpu_hours: hours(ledger.left_at(gpus, now)),
            spent: ledger.is_spent(),
            period_start_ms: b.period.start_of(now).0,
            renews_at_ms: b.period.next_start(now).0,
        }
    }
}

/// Every tenant's quota and use, per flavor.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueuesView {
    /// One row per tenant and flavor, by tenant then flavor order.
    queues: Vec<QueueRow>,
}

/// One row per tenant and flavor at `now` (also what `/metrics` exports).
pub(crate) fn queue_rows(s: &State, now: Timestamp) -> Vec<QueueRow> {
    let nf = s.flavors().len();
    let nt = s.tenants().len();
    // Jobs per tenant and flavor: one pass over the jobs.
    let mut pending = vec![vec![0u64; nf]; nt];
    let mut by_reason = vec![vec![BTreeMap::<&'static str, u64>::new(); nf]; nt];
    let mut running = vec![vec![0u64; nf]; nt];
    for j in s.jobs() {
        let Some(t) = j.tenant else { continue };
        let f = match j.phase {
            Phase::Queued => j.flavors.first().copied(),
            Phase::Admitted | Phase::Bound | Phase::Running | Phase::Preempting => j.flavor,
            _ => None,
        };
        let Some(f) = f.map(usize::from).filter(|f| *f < nf) else {
            continue;
        };
        match j.phase {
            Phase::Queued | Phase::Admitted => {
                pending[t as usize][f] += 1;
                let gate = (j.phase == Phase::Queued)
                    .then(|| gpusched_core::explain::gate_reason(j))
                    .flatten();
                let reason = gate
                    .as_ref()
                    .or(j.last_reason.as_ref())
                    .map_or("none", |r| r.kind());
                *by_reason[t as usize][f].entry(reason).or_default() += 1;
            }
            _ => running[t as usize][f] += 1,
        }
    }
    // Lent: per cohort and flavor, borrowing spread over idle lendable quota.
    let mut borrowed_in: BTreeMap<(u32, usize), u64> = BTreeMap::new();
    let mut idle_in: BTreeMap<(u32, usize), u64> = BTreeMap::new();
    let idle = |t: &gpusched_core::Tenant, f: usize| -> u64 {
        let q = t.quota(f as gpusched_core::FlavorIdx);
        let used = t.used(f as gpusched_core::FlavorIdx);
        q.map_or(0, |q| (q.nominal - used).min(q.lendable).get()) as u64
    };
    for t in s.tenants() {
        let Some(c) = t.cohort else { continue };
        for f in 0..nf {
            let fi = f as gpusched_core::FlavorIdx;
            let borrowed = t.used(fi) - t.nominal(fi);
            *borrowed_in.entry((c, f)).or_default() += u64::from(borrowed.get());
            *idle_in.entry((c, f)).or_default() += idle(t, f);
        }
    }
    let mut rows = Vec::new();
    for (ti, t) in s.tenants().iter().enumerate() {
        let half_life = s.usage_half_life_ms(ti as u32);
        let decayed = (half_life > 0).then(|| s.decayed_use(ti as u32, now));
        let mut flavors: Vec<usize> = t.flavor_order.iter().map(|f| usize::from(*f)).collect();
        for (f, n) in running[ti].iter().enumerate() {
            if !flavors.contains(&f) && (!t.used(f as gpusched_core::FlavorIdx).is_zero() || *n > 0)
            {
                flavors.push(f);
            }
        }
        for f in flavors {
            let fi = f as gpusched_core::FlavorIdx;
            let q = t.quota(fi);
            let (nominal, used) = (t.nominal(fi), t.used(fi));
            let lent = match t.cohort {
                None => 0,
                Some(c) => {
                    let key = (c, f);
                    let all_idle = idle_in.get(&key).copied().unwrap_or(0);
                    let borrowed = borrowed_in.get(&key).copied().unwrap_or(0).min(all_idle);
                    (borrowed * idle(t, f))
                        .checked_div(all_idle)
                        .map_or(0, |x| x as Gpus)
                }
            };
            rows.push(QueueRow {
                tenant: t.spec.name.clone(),
                queue: t.queue,
                cohort: t.spec.cohort.clone(),
                flavor: s.flavor_name(fi).to_string(),
                nominal: nominal.get(),
                borrowing_limit: q.and_then(|q| q.borrowing_limit).map(|b| b.get()),
                used: used.get(),
                borrowed: (used - nominal).get(),
                lent,
                pending: pending[ti][f],
                pending_by_reason: std::mem::take(&mut by_reason[ti][f]),
                running: running[ti][f],
                decayed_gpus: decayed.as_ref().map(|d| d.mean_gpus(f, half_life)),
                budget: t.budget(fi).map(|l| BudgetStanding::of(l, used.get(), now)),
            });
        }
    }
    rows
}

/// Quota and use per tenant and flavor: nominal, used, borrowed, lent,
/// pending and running. The admin sees every tenant; a tenant token only
/// its own rows.
#[utoipa::path(get, path = "/v1/queues", tag = "cluster",
    responses((status = 200, body = QueuesView), Unauthorized),
    security(("bearer" = [])))]
pub async fn queues(who: Principal, AxState(gw): AxState<Gateway>) -> Json<QueuesView> {
    let p = read_view(&gw.view);
    let mut view = queues_view(p.state(), gpusched_runtime::wall_clock());
    view.queues.retain(|r| who.may_touch(&r.tenant));
    Json(view)
}

/// `GET /v1/queues`'s answer for a state (also what `gpusched replay
/// --show queues` prints).
pub fn queues_view(s: &State, now: Timestamp) -> QueuesView {
    QueuesView {
        queues: queue_rows(s, now),
    }
}

/// A node as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeView {
    /// Its id.
    id: u32,
    /// Its name.
    name: String,
    /// Its GPU flavor.
    flavor: String,
    /// Its topology path, outermost level first.
    path: Vec<String>,
    /// `ready`, `cordoned`, `drained`, `evicted` (emptied for maintenance)
    /// or `lost`.
    #[schema(value_type = String)]
    status: NodeStatus,
    /// GPUs on it.
    gpus: Gpus,
    /// GPUs allocated.
    used: Gpus,
    /// Jobs holding GPUs on it.
    jobs: Vec<u64>,
    /// The job it is reserved for, if any.
    reserved_for: Option<u64>,
}

/// The nodes.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodesView {
    /// Every node, by id.
    nodes: Vec<NodeView>,
}

/// Every node: flavor, topology, status and use. A tenant token sees
/// every node's capacity but only its own tenant's jobs on them (and a
/// reservation only when it is its own job's).
#[utoipa::path(get, path = "/v1/nodes", tag = "cluster",
    responses((status = 200, body = NodesView), Unauthorized),
    security(("bearer" = [])))]
pub async fn nodes(who: Principal, AxState(gw): AxState<Gateway>) -> Json<NodesView> {
    let p = read_view(&gw.view);
    let s = p.state();
    let mut view = nodes_view(s);
    if who != Principal::Admin {
        let own = |j: &u64| {
            s.job(gpusched_model::JobId(*j))
                .is_some_and(|j| who.may_touch(&j.spec.tenant))
        };
        for n in &mut view.nodes {
            n.jobs.retain(own);
            n.reserved_for = n.reserved_for.filter(own);
        }
    }
    Json(view)
}

/// `GET /v1/nodes`'s answer for a state (also what `gpusched replay
/// --show nodes` prints).
pub fn nodes_view(s: &State) -> NodesView {
    let nodes = s
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let id = NodeId(u32::try_from(i).unwrap_or(u32::MAX));
            NodeView {
                id: id.0,
                name: n.spec.name.clone(),
                flavor: s.flavor_name(n.flavor).to_string(),
                path: n.spec.path.clone(),
                status: n.status,
                gpus: n.spec.gpus,
                used: s.capacity().node_used(id),
                jobs: n.jobs.iter().map(|j| j.0).collect(),
                reserved_for: n.reserved_for.map(|j| j.0),
            }
        })
        .collect();
    NodesView { nodes }
}

/// An admin change's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChangeReply {
    /// Log sequence of the change.
    pub(crate) seq: u64,
    /// What it is now (a tenant's or cohort's name, or a node's status).
    pub(crate) now: String,
}

/// `PUT /v1/tenants/{name}`'s body: a [`TenantSpec`] whose `name` may be
/// left out, as the path names the tenant. Its schema is `TenantSpec`'s
/// with `name` no longer required, so the two cannot drift apart.
pub struct TenantUpdate;

/// `T`'s schema with `name` no longer required, as the path names the
/// `what` (the body of a `PUT /v1/{what}s/{name}`).
pub(crate) fn name_from_path<T: utoipa::PartialSchema>(what: &str) -> RefOr<Schema> {
    let mut schema = T::schema();
    if let RefOr::T(Schema::Object(o)) = &mut schema {
        o.required.retain(|r| r != "name");
        o.description = Some(format!(
            "A {what} spec; `name` may be left out (the path names the {what}) and, \
             when given, must match the path."
        ));
    }
    schema
}

impl utoipa::PartialSchema for TenantUpdate {
    fn schema() -> RefOr<Schema> {
        name_from_path::<TenantSpec>("tenant")
    }
}

impl ToSchema for TenantUpdate {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        <TenantSpec as ToSchema>::schemas(schemas);
    }
}

/// Writes one admin change and waits (a while) until the view has folded
/// it: its log sequence, and whether the view has it now. 503 when the
/// log did not take it.
pub(crate) async fn write_change(gw: &Gateway, event: Event) -> Result<(u64, bool), ApiError> {
    let w = gw
        .submitter
        .write(vec![event], None)
        .await
        .map_err(ApiError::unavailable)?;
    Ok((w.seq, gw.caught_up(w.seq).await))
}

/// An admin `PUT` of a named spec (a tenant, a cohort), read: the admin's
/// token, the name in the path, and the body as `T` (see [`named_spec`])
/// that `check` passes; an error names the field.
pub(crate) fn admin_put<T: serde::de::DeserializeOwned>(
    who: &Principal,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
    what: &str,
    check: impl FnOnce(&T) -> Result<(), gpusched_model::FieldError>,
) -> Result<(String, T), ApiError> {
    who.require_admin()?;
    let name = path_param(name)?;
    let Json(v) = body?;
    let spec: T = named_spec(v, &name, what)?;
    check(&spec).map_err(|e| ApiError::field(&e.field, &e.rule))?;
    Ok((name, spec))
}

/// A `PUT` body naming what the path names: a JSON object whose `name`,
/// when given, must match `name`; read as `T`, an error naming the field.
fn named_spec<T: serde::de::DeserializeOwned>(
    mut v: serde_json::Value,
    name: &str,
    what: &str,
) -> Result<T, ApiError> {
    let Some(obj) = v.as_object_mut() else {
        return Err(ApiError::field(
            "body",
            format!("must be a JSON object (a {what} spec)"),
        ));
    };
    match obj.get("name") {
        None => {
            obj.insert("name".into(), serde_json::Value::String(name.to_string()));
        }
        Some(serde_json::Value::String(n)) if n == name => {}
        Some(_) => {
            return Err(ApiError::field(
                "name",
                format!("must match the {what} name in the path"),
            ))
        }
    }
    crate::from_json(v)
}

/// Create or replace a tenant (admin). The body is a tenant spec
/// (`TenantUpdate`); its `name`, when given, must match the path.
///
/// Besides the rules of the schema: the name must not be blank, a flavor
/// must not be listed twice in `quotas` (400), and a configuration the
/// scheduler refuses is logged without effect and answers 409.
#[utoipa::path(put, path = "/v1/tenants/{name}", tag = "admin",
    request_body(content = TenantUpdate, content_type = "application/json"),
    params(("name" = String, Path, min_length = 1, description = "Tenant name")),
    responses(
        (status = 201, description = "Created", body = ChangeReply),
        (status = 200, description = "Replaced", body = ChangeReply),
        FieldBroken,
        ConfigRefused,
        AdminWrite,
        TooLarge, NotJson),
    security(("bearer" = [])))]
pub async fn put_tenant(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (name, spec) = admin_put(&who, name, body, "tenant", TenantSpec::check_new)?;
    let existed = read_view(&gw.view).state().tenant_idx(&name).is_some();
    let seq = configure_tenant(&gw, spec).await?;
    Ok(created_or_replaced(existed, seq, name))
}

/// Writes a tenant's configuration; its log sequence, or 409 when the
/// scheduler refused it (it is then logged but has no effect).
pub(crate) async fn configure_tenant(gw: &Gateway, spec: TenantSpec) -> Result<u64, ApiError> {
    let name = spec.name.clone();
    let event = Event::TenantConfigured { spec: spec.clone() };
    let (seq, seen) = write_change(gw, event).await?;
    if seen {
        let p = read_view(&gw.view);
        let s = p.state();
        let took = s
            .tenant_idx(&name)
            .is_some_and(|t| s.tenant(t).spec == spec);
        if !took {
            return Err(ApiError::conflict(format!(
                "the scheduler refused this configuration of tenant {name} (event {seq}); the tenant is unchanged"
            )));
        }
    }
    Ok(seq)
}

/// A `PUT`'s answer: 200 when `name` existed before the change logged at
/// `seq`, 201 when it created it.
pub(crate) fn created_or_replaced(existed: bool, seq: u64, name: String) -> Response {
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    (status, Json(ChangeReply { seq, now: name })).into_response()
}

/// A node by id or name; 404 otherwise.
fn node_of(s: &State, raw: &str) -> Result<NodeId, ApiError> {
    let by_id = raw
        .parse::<u32>()
        .ok()
        .filter(|i| (*i as usize) < s.nodes().len())
        .map(NodeId);
    by_id
        .or_else(|| s.node_id(raw))
        .ok_or_else(|| ApiError::not_found(format!("no node {raw:?}")))
}

/// What an admin does to a node.
#[derive(Clone, Copy, Debug, serde::Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeAction {
    /// No new work is placed on it; running jobs stay. From ready.
    Cordon,
    /// Back to service. From cordoned, drained or evicted.
    Uncordon,
    /// No new work; it empties as its jobs end and stays out of service
    /// for maintenance. From ready or cordoned.
    Drain,
    /// Empty it for maintenance: no new work, and every job on it is
    /// evicted with the checkpoint protocol (asked for a checkpoint,
    /// stopped at its deadline or once one completes, then back in its
    /// queue to run elsewhere); it stays out of service once empty, until
    /// uncordoned. From ready, cordoned or drained.
    Evict,
}

impl NodeAction {
    /// The status it sets.
    fn to(self) -> NodeStatus {
        match self {
            NodeAction::Cordon => NodeStatus::Cordoned,
            NodeAction::Uncordon => NodeStatus::Ready,
            NodeAction::Drain => NodeStatus::Drained,
            NodeAction::Evict => NodeStatus::Evicted,
        }
    }

    /// The event that takes it on `node` at `at`.
    fn event(self, node: NodeId, at: Timestamp) -> Event {
        match self {
            NodeAction::Cordon => Event::NodeCordoned { node },
            NodeAction::Uncordon => Event::NodeUncordoned { node },
            NodeAction::Drain => Event::NodeDrained { node },
            NodeAction::Evict => Event::NodeEvicted { node, at },
        }
    }

    /// The action as the path names it.
    fn verb(self) -> &'static str {
        match self {
            NodeAction::Cordon => "cordon",
            NodeAction::Uncordon => "uncordon",
            NodeAction::Drain => "drain",
            NodeAction::Evict => "evict",
        }
    }
}

/// A node status as the API names it.
fn status_word(status: NodeStatus) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Cordon, uncordon, drain or evict a node (admin), by id or name.
/// `cordon`: no new work is placed on it; running jobs stay. `drain`: no
/// new work; it empties as its jobs end and stays out of service for
/// maintenance. `evict`: every job on it is evicted with the checkpoint
/// protocol, and it stays out of service once empty. `uncordon`: back to
/// service from cordoned, drained or evicted. 409 when the node's status
/// does not allow the action.
#[utoipa::path(post, path = "/v1/nodes/{id}/{action}", tag = "admin",
    params(("id" = String, Path, min_length = 1, description = "Node id or name"),
        ("action" = NodeAction, Path, description = "cordon, uncordon, drain or evict")),
    responses(
        (status = 200, body = ChangeReply),
        (status = 400, description = "Not one of the four actions", body = ErrorBody),
        NoSuchNode,
        (status = 409, description = "The node's status does not allow the action", body = ErrorBody),
        AdminWrite),
    security(("bearer" = [])))]
pub async fn change_node(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    path: Result<Path<(String, NodeAction)>, PathRejection>,
) -> Result<Json<ChangeReply>, ApiError> {
    let (raw, action) = path?.0;
    who.require_admin()?;
    let node = {
        let p = read_view(&gw.view);
        let s = p.state();
        let node = node_of(s, &raw)?;
        let status = s.nodes()[node.index()].status;
        if !status.may_be_set_to(action.to()) {
            let (status, verb) = (status_word(status), action.verb());
            return Err(ApiError::conflict(format!(
                "node {raw} is {status}; cannot {verb} it"
            )));
        }
        node
    };
    let event = action.event(node, gpusched_runtime::wall_clock());
    let (seq, _) = write_change(&gw, event).await?;
    let p = read_view(&gw.view);
    let now = p.state().nodes().get(node.index());
    Ok(Json(ChangeReply {
        seq,
        now: now.map(|n| status_word(n.status)).unwrap_or_default(),
    }))
}

/// Sets a tenant's queue to `to`, from any other state (admin).
async fn queue_change(
    who: Principal,
    gw: Gateway,
    name: String,
    to: QueueState,
) -> Result<Json<ChangeReply>, ApiError> {
    who.require_admin()?;
    {
        let p = read_view(&gw.view);
        let s = p.state();
        let t = s
            .tenant_idx(&name)
            .ok_or_else(|| ApiError::not_found(format!("no tenant {name:?}")))?;
        let now = s.tenant(t).queue;
        if now == to {
            return Err(ApiError::conflict(format!("queue {name} is already {now}")));
        }
    }
    let event = Event::QueueStateSet {
        tenant: name.clone(),
        state: to,
        at: gpusched_runtime::wall_clock(),
    };
    let (seq, _) = write_change(&gw, event).await?;
    Ok(Json(ChangeReply {
        seq,
        now: to.name().to_string(),
    }))
}

/// What an admin does to a tenant's queue.
#[derive(Clone, Copy, Debug, serde::Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum QueueAction {
    /// Admit nothing new; submissions still queue, running jobs run on.
    Hold,
    /// Open it again.
    Release,
    /// Admit nothing new and refuse new submissions; running jobs finish.
    Drain,
    /// As drain, and evict its running jobs.
    Stop,
}

impl QueueAction {
    fn to(self) -> QueueState {
        match self {
            QueueAction::Hold => QueueState::Held,
            QueueAction::Release => QueueState::Open,
            QueueAction::Drain => QueueState::Draining,
            QueueAction::Stop => QueueState::Stopped,
        }
    }
}

/// Hold, release, drain or stop a tenant's queue (admin). `hold`: nothing
/// new is admitted; submissions still queue and running jobs run on.
/// `drain`: also refuses new submissions (409); running jobs finish.
/// `stop`: as drain, and its running jobs are evicted with the checkpoint
/// protocol, those on borrowed quota first; admitted jobs not yet placed
/// give their quota back and wait. `release`: open again.
#[utoipa::path(post, path = "/v1/queues/{tenant}/{action}", tag = "admin",
    params(("tenant" = String, Path, min_length = 1, description = "Tenant name"),
        ("action" = QueueAction, Path, description = "hold, release, drain or stop")),
    responses(
        (status = 200, body = ChangeReply),
        (status = 400, description = "Not one of the four actions", body = ErrorBody),
        (status = 404, description = "No such tenant", body = ErrorBody),
        (status = 409, description = "The queue is already in that state", body = ErrorBody),
        AdminWrite),
    security(("bearer" = [])))]
pub async fn change_queue(
    who: Principal,
    AxState(gw): AxState<Gateway>,
    path: Result<Path<(String, QueueAction)>, PathRejection>,
) -> Result<Json<ChangeReply>, ApiError> {
    who.require_admin()?;
    let (tenant, action) = path?.0;
    queue_change(who, gw, tenant, action.to()).await
}
