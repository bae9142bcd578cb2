//! `GET /metrics`: what the state holds, from the gateway's view, in the
//! Prometheus text format — jobs by state, pending jobs by tenant, flavor
//! and reason with the age of the oldest, quota use per tenant and flavor
//! (nominal, used, borrowed, lent) — and how the view follows the log.
//!
//! Owns: the names and labels of these series. The per-flavor figures are
//! those of `GET /v1/queues` (one rule: `cluster::queue_rows`). Deciding
//! services export their own loops (`gpusched_runtime`'s metrics).
//!
//! Must never: need a token (Prometheus scrapes without one; nothing here
//! names a job or a user), or hold the view's lock longer than one pass
//! over its jobs.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use axum::extract::State as AxState;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use gpusched_core::tally::RECLAIM_BUCKETS_S;
use gpusched_core::LogTally;
use gpusched_core::{Phase, State};
use gpusched_runtime::{
    family, gauge, histogram_seconds, metrics_text, read_view, wall_clock, FollowerHealth,
    SharedView,
    Values::{Counters, Gauges},
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::{Registry, Unit};

use crate::cluster::{queue_rows, BudgetStanding, QueueRow};
use crate::jobs::phase_name;
use crate::Gateway;

/// The view's collector.
struct ViewCollector {
    view: SharedView,
    follower: Arc<FollowerHealth>,
}

impl fmt::Debug for ViewCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ViewCollector")
    }
}

/// The registry `/metrics` answers from.
pub fn registry(view: SharedView, follower: Arc<FollowerHealth>) -> Registry {
    let mut r = Registry::with_prefix("gpusched");
    r.register_collector(Box::new(ViewCollector { view, follower }));
    r
}

/// Prometheus metrics of the state and of the view (text format 0.0.4;
/// no token needed).
#[utoipa::path(get, path = "/metrics", tag = "cluster",
    responses((status = 200, body = String, content_type = "text/plain")))]
pub async fn metrics(AxState(gw): AxState<Gateway>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        metrics_text(&registry(gw.view.clone(), gw.follower.clone())),
    )
}

/// Pending jobs of one tenant and flavor (its first choice) for one
/// reason, and the oldest one's submission time.
#[derive(Default)]
struct Pending {
    jobs: u64,
    oldest_ms: u64,
}

type Key = (String, String, &'static str);

/// A quota series: its name, its help, and its value in a queue row.
type QuotaSeries = (&'static str, &'static str, fn(&QueueRow) -> u64);
type BudgetSeries = (&'static str, &'static str, fn(&BudgetStanding) -> f64);

/// Pending jobs (queued or admitted, not yet bound) by tenant, flavor and
/// the reason the last cycle gave (`none` before one did).
fn pending(s: &State) -> BTreeMap<Key, Pending> {
    let mut pending: BTreeMap<Key, Pending> = BTreeMap::new();
    for j in s.jobs() {
        if !matches!(j.phase, Phase::Queued | Phase::Admitted) {
            continue;
        }
        let Some(t) = j.tenant.and_then(|t| s.tenants().get(t as usize)) else {
            continue;
        };
        let flavor = j.flavor.or_else(|| j.flavors.first().copied());
        let flavor = flavor.map_or("", |f| s.flavor_name(f));
        let reason = j.last_reason.as_ref().map_or("none", |r| r.kind());
        let p = pending
            .entry((t.spec.name.clone(), flavor.to_string(), reason))
            .or_default();
        p.jobs += 1;
        if p.oldest_ms == 0 || j.submitted_at.0 < p.oldest_ms {
            p.oldest_ms = j.submitted_at.0;
        }
    }
    pending
}

/// What the log did since this gateway started folding it (counters
/// start from the snapshot it started at, as Prometheus counters do at a
/// restart).
fn encode_tally(e: &mut DescriptorEncoder, t: &LogTally) -> fmt::Result {
    let yes_no = |b: bool| if b { "true" } else { "false" }.to_string();
    family(
        e,
        Counters,
        "admissions",
        "Jobs admitted (quota charged), by tenant, flavor and whether they borrowed.",
        None,
        t.admissions.iter().map(|((tenant, flavor, b), n)| {
            (
                vec![
                    ("tenant", tenant.clone()),
                    ("flavor", flavor.clone()),
                    ("borrowing", yes_no(*b)),
                ],
                *n,
            )
        }),
    )?;
    family(
        e,
        Counters,
        "bindings",
        "Gangs bound to GPUs, by tenant, flavor and whether as backfill.",
        None,
        t.bindings.iter().map(|((tenant, flavor, b), n)| {
            (
                vec![
                    ("tenant", tenant.clone()),
                    ("flavor", flavor.clone()),
                    ("backfill", yes_no(*b)),
                ],
                *n,
            )
        }),
    )?;
    family(
        e,
        Counters,
        "preemptions",
        "Victims stopped, by the cause of their plan (reclaim, priority, reservation) and the victim's tenant.",
        None,
        t.preemptions.iter().map(|((cause, tenant), n)| {
            (
                vec![("cause", cause.to_string()), ("tenant", tenant.clone())],
                *n,
            )
        }),
    )?;
    family(
        e,
        Counters,
        "lost_gpu",
        "GPU-seconds of work lost since the last complete checkpoint, by cause (a preemption cause, or node_lost).",
        Some(&Unit::Seconds),
        t.lost_gpu_ms
            .iter()
            .map(|(cause, ms)| (vec![("cause", cause.to_string())], *ms as f64 / 1e3)),
    )?;
    let h = &t.reclaim_latency;
    let buckets: Vec<(f64, u64)> = RECLAIM_BUCKETS_S
        .iter()
        .zip(h.counts.iter())
        .map(|(b, c)| (*b, *c))
        .collect();
    histogram_seconds(
        e,
        "reclaim_latency",
        "From the plan that reclaims for a quota owner's job to that job bound (log time).",
        h.sum_ms as f64 / 1e3,
        h.count(),
        &buckets,
    )
}

impl Collector for ViewCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let now_ms = wall_clock().0;
        let (seq, rows, pending, by_state, tally) = {
            let p = read_view(&self.view);
            let s = p.state();
            let by_state: Vec<(&str, u64)> = Phase::ALL
                .iter()
                .map(|ph| (phase_name(*ph), s.phase_counts().get(*ph)))
                .collect();
            let tally = p.tally().cloned().unwrap_or_default();
            (
                p.seq(),
                queue_rows(s, gpusched_model::Timestamp(now_ms)),
                pending(s),
                by_state,
                tally,
            )
        };
        let e = &mut enc;
        encode_tally(e, &tally)?;
        family(
            e,
            Gauges,
            "jobs",
            "Jobs in the state, by state.",
            None,
            by_state
                .iter()
                .map(|(st, n)| (vec![("state", st.to_string())], *n)),
        )?;
        let labels = |(t, f, r): &Key| {
            vec![
                ("tenant", t.clone()),
                ("flavor", f.clone()),
                ("reason", r.to_string()),
            ]
        };
        family(
            e,
            Gauges,
            "pending_jobs",
            "Jobs waiting (queued or admitted, not yet bound) by tenant, flavor and the reason the last cycle gave (none: not examined yet).",
            None,
            pending.iter().map(|(k, p)| (labels(k), p.jobs)),
        )?;
        family(
            e,
            Gauges,
            "oldest_pending_age",
            "Age of the oldest waiting job by tenant, flavor and reason.",
            Some(&Unit::Seconds),
            pending
                .iter()
                .map(|(k, p)| (labels(k), now_ms.saturating_sub(p.oldest_ms) as f64 / 1e3)),
        )?;
        let tf = |r: &QueueRow| vec![("tenant", r.tenant.clone()), ("flavor", r.flavor.clone())];
        let quota: [QuotaSeries; 4] = [
            (
                "quota_nominal_gpus",
                "GPUs the tenant is entitled to in the flavor.",
                |r| r.nominal.into(),
            ),
            (
                "quota_used_gpus",
                "GPUs charged to the tenant's admitted, bound and running jobs.",
                |r| r.used.into(),
            ),
            (
                "quota_borrowed_gpus",
                "GPUs of the tenant's use above its nominal quota.",
                |r| r.borrowed.into(),
            ),
            (
                "quota_lent_gpus",
                "The tenant's idle lendable quota that others in its cohort use now.",
                |r| r.lent.into(),
            ),
        ];
        for (name, help, value) in quota {
            family(
                e,
                Gauges,
                name,
                help,
                None,
                rows.iter().map(|r| (tf(r), value(r))),
            )?;
        }
        family(
            e,
            Gauges,
            "quota_decayed_use_gpus",
            "Where the tenant's cohort keeps use with a half-life: the mean GPUs it held in the flavor, weighted by age (borrowers are served lowest per weight first).",
            None,
            rows.iter()
                .filter_map(|r| r.decayed_gpus.map(|g| (tf(r), g))),
        )?;
        let budgets: [BudgetSeries; 3] = [
            (
                "quota_budget_gpu_hours",
                "The tenant's GPU-hour budget in the flavor per period.",
                |b| b.gpu_hours as f64,
            ),
            (
                "quota_budget_used_gpu_hours",
                "GPU-hours the tenant held in the flavor this budget period.",
                |b| b.used_gpu_hours,
            ),
            (
                "quota_budget_spent",
                "1 while the tenant's budget in the flavor is spent and its policy applies.",
                |b| f64::from(u8::from(b.spent)),
            ),
        ];
        for (name, help, value) in budgets {
            let series = rows
                .iter()
                .filter_map(|r| r.budget.as_ref().map(|b| (tf(r), value(b))));
            family(e, Gauges, name, help, None, series)?;
        }
        gauge(
            e,
            "view_sequence",
            "Sequence of the last event the gateway's view folded.",
            None,
            seq,
        )?;
        gauge(
            e,
            "view_caught_up",
            "1 once the view has folded the log as it stood at the start.",
            None,
            u64::from(self.follower.is_caught_up()),
        )?;
        gauge(
            e,
            "view_log_reachable",
            "1 while the log answers the view's reads.",
            None,
            u64::from(self.follower.log_reachable()),
        )?;
        gauge(
            e,
            "view_loop_age",
            "Time since the view's follower last went round.",
            Some(&Unit::Seconds),
            self.follower.loop_age_ms() as f64 / 1e3,
        )
    }
}
