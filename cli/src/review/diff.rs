//! `gpusched diff --from T1 --to T2`: what changed in between: jobs in each
//! state, admissions and bindings, preemptions by cause and the work they
//! lost, quota moves, and nodes lost, rejoined, cordoned or drained; then
//! each tenant's use per flavor at both ends.
//!
//! Owns: the tallies of a range of the log beyond those the metrics keep
//! (admissions, bindings, preemptions and lost work are counted by
//! `gpusched_core::tally`, the gateway's rules). Must never: count a
//! decision the state refused (a superseded one had no effect).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use gpusched_core::{LogTally, Phase, State};
use gpusched_events::{Event, Outcome, PreemptionCause};
use serde_json::Value;

use super::{time_text, walk, RangeArgs, Step, Visitor};
use crate::client::table;

/// `gpusched diff`.
#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    #[command(flatten)]
    range: RangeArgs,
    #[command(flatten)]
    log: gpusched_runtime::LogDatabaseArgs,
}

/// Each tenant's row per flavor, as `GET /v1/queues` has it:
/// (used, borrowed, pending, running) by (tenant, flavor).
type Use = BTreeMap<(String, String), [u64; 4]>;

fn use_of(s: &State) -> Result<Use> {
    let v = serde_json::to_value(gpusched_gateway::queues_view(s, s.clock()))
        .context("encoding queues")?;
    let mut out = Use::new();
    for q in v
        .get("queues")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| q.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
        let u = |k: &str| q.get(k).and_then(Value::as_u64).unwrap_or(0);
        out.insert(
            (s("tenant"), s("flavor")),
            [u("used"), u("borrowed"), u("pending"), u("running")],
        );
    }
    Ok(out)
}

/// What a range of the log did.
#[derive(Default)]
struct Tally {
    range: Option<RangeArgs>,
    /// Where the range starts: the state's use and jobs per state then.
    start: Option<(u64, Option<gpusched_model::Timestamp>, Use, Vec<u64>)>,
    /// What the metrics count, by the same rules (`gpusched_core::tally`).
    log: LogTally,
    /// Other counts by what happened (kind, detail).
    counts: BTreeMap<(&'static str, String), u64>,
    /// Lines for quota moves and node changes, in log order.
    changes: Vec<String>,
    /// The event under the fold: whether it is in the range, and its
    /// count key and change line, until it is known to have taken effect.
    in_range: bool,
    pending: Vec<(&'static str, String)>,
    pending_change: Option<String>,
    error: Option<anyhow::Error>,
}

fn phase_counts(s: &State) -> Vec<u64> {
    let c = s.phase_counts();
    Phase::ALL.iter().map(|p| c.get(*p)).collect()
}

fn cause_key(c: &PreemptionCause) -> String {
    match c {
        PreemptionCause::Reclaim { tenant, flavor, .. } => {
            format!("reclaim by {tenant} in {flavor}")
        }
        PreemptionCause::Priority { tenant, flavor } => format!("priority in {tenant}/{flavor}"),
        PreemptionCause::Reservation => "reservation due".to_string(),
    }
}

impl Tally {
    fn note(&mut self, kind: &'static str, detail: impl Into<String>) {
        self.pending.push((kind, detail.into()));
    }

    fn quota_move(before: &State, ev: &Event) -> Option<String> {
        let Event::TenantConfigured { spec } = ev else {
            return None;
        };
        let old = before.tenants().iter().find(|t| t.spec.name == spec.name);
        let Some(old) = old else {
            return Some(format!("tenant {} created", spec.name));
        };
        let mut moves = Vec::new();
        for q in &spec.quotas {
            let was = old
                .spec
                .quotas
                .iter()
                .find(|o| o.flavor == q.flavor)
                .map_or(0, |o| o.nominal);
            if was != q.nominal {
                moves.push(format!("{} nominal {was} → {}", q.flavor, q.nominal));
            }
        }
        for o in &old.spec.quotas {
            if !spec.quotas.iter().any(|q| q.flavor == o.flavor) {
                moves.push(format!("{} nominal {} → none", o.flavor, o.nominal));
            }
        }
        Some(if moves.is_empty() {
            format!("tenant {} reconfigured (quotas unchanged)", spec.name)
        } else {
            format!("tenant {}: {}", spec.name, moves.join(", "))
        })
    }
}

impl Visitor for Tally {
    fn before(&mut self, step: &Step<'_>) {
        let Some(range) = self.range else { return };
        self.in_range = range.contains(step.seq, step.time);
        if !self.in_range {
            return;
        }
        if self.start.is_none() {
            match use_of(step.before) {
                Ok(u) => {
                    self.start = Some((
                        step.seq.saturating_sub(1),
                        step.time,
                        u,
                        phase_counts(step.before),
                    ))
                }
                Err(e) => self.error = Some(e),
            }
        }
        let s = step.before;
        let node = |n: &gpusched_model::NodeId| {
            s.nodes()
                .get(n.index())
                .map_or_else(|| n.to_string(), |x| x.spec.name.clone())
        };
        let tenant = |j: &gpusched_model::JobId| {
            s.job(*j)
                .map_or_else(|| "?".to_string(), |x| x.spec.tenant.clone())
        };
        match step.event {
            Event::JobSubmitted { spec, .. } => self.note("submitted", spec.tenant.clone()),
            Event::JobRejected { job, .. } => self.note("rejected", tenant(job)),
            Event::JobFinished { job, outcome, .. } => {
                let how = match outcome {
                    Outcome::Succeeded => "succeeded",
                    Outcome::Failed => "failed",
                    Outcome::Cancelled => "cancelled",
                    Outcome::TimedOut => "timed out",
                };
                self.note("finished", format!("{} {how}", tenant(job)));
            }
            Event::JobCancelled { job, .. } | Event::JobDependencyFailed { job, .. } => {
                self.note("cancelled", tenant(job))
            }
            Event::PreemptionPlanned { cause, victims, .. } => {
                self.note("preemptions planned", cause_key(cause));
                for v in victims {
                    self.note(
                        "victims chosen",
                        format!("{} for {}", tenant(&v.job), cause_key(cause)),
                    );
                }
            }
            Event::NodeLost { node: n, .. } => {
                self.note("nodes", "lost");
                self.pending_change = Some(format!("node {} lost", node(n)));
            }
            Event::NodeRejoined { node: n, .. } => {
                self.note("nodes", "rejoined");
                self.pending_change = Some(format!("node {} rejoined", node(n)));
            }
            Event::NodeCordoned { node: n } => {
                self.note("nodes", "cordoned");
                self.pending_change = Some(format!("node {} cordoned", node(n)));
            }
            Event::NodeUncordoned { node: n } => {
                self.note("nodes", "uncordoned");
                self.pending_change = Some(format!("node {} uncordoned", node(n)));
            }
            Event::NodeDrained { node: n } => {
                self.note("nodes", "drained");
                self.pending_change = Some(format!("node {} drained", node(n)));
            }
            Event::NodeAdded { spec, .. } => {
                self.note("nodes", "added");
                self.pending_change = Some(format!("node {} added", spec.name));
            }
            ev @ Event::TenantConfigured { .. } => {
                self.note("tenants configured", "");
                self.pending_change = Tally::quota_move(s, ev);
            }
            Event::CohortConfigured { spec, .. } => {
                self.note("cohorts configured", "");
                self.pending_change = Some(format!(
                    "cohort {} usage half-life {} s",
                    spec.name, spec.usage_half_life_s
                ));
            }
            Event::BudgetSpent { tenant, flavor, .. } => {
                self.note("budgets spent", tenant.clone());
                self.pending_change = Some(format!("{tenant} spent its budget in {flavor}"));
            }
            Event::BudgetRenewed { tenant, flavor, .. } => {
                self.note("budgets renewed", tenant.clone());
                self.pending_change = Some(format!("{tenant}'s budget in {flavor} renewed"));
            }
            _ => {}
        }
    }

    fn after(&mut self, _seq: u64, event: &Event, applied: bool, after: &State) {
        let notes = std::mem::take(&mut self.pending);
        let change = self.pending_change.take();
        if !self.in_range || !applied {
            return;
        }
        self.log.observe(after, event, applied);
        for k in notes {
            *self.counts.entry(k).or_default() += 1;
        }
        self.changes.extend(change);
    }
}

/// The tally's counts as rows of (what, detail, count).
fn log_rows(t: &LogTally) -> Vec<(&'static str, String, u64)> {
    let yes = |b: bool, s: &str| if b { format!(" ({s})") } else { String::new() };
    let mut rows = Vec::new();
    for ((tenant, flavor, b), n) in &t.admissions {
        rows.push((
            "admitted",
            format!("{tenant}/{flavor}{}", yes(*b, "borrowing")),
            *n,
        ));
    }
    for ((tenant, flavor, b), n) in &t.bindings {
        rows.push((
            "bound",
            format!("{tenant}/{flavor}{}", yes(*b, "backfill")),
            *n,
        ));
    }
    for ((cause, tenant), n) in &t.preemptions {
        rows.push(("preempted", format!("{tenant} for {cause}"), *n));
    }
    rows
}

/// Prints what changed between `--from` and `--to`.
pub async fn diff(args: DiffArgs) -> Result<()> {
    let store = super::connect(&args.log.database_url).await?;
    let mut t = Tally {
        range: Some(args.range),
        ..Tally::default()
    };
    let w = walk(&store, args.range.to, &mut t).await?;
    if let Some(e) = t.error.take() {
        return Err(e);
    }
    let end_use = use_of(&w.state)?;
    let end_phases = phase_counts(&w.state);
    let Some((from_seq, from_time, start_use, start_phases)) = t.start.take() else {
        println!(
            "no events between the two instants (the log read up to seq {}, {})",
            w.seq,
            time_text(w.time)
        );
        return Ok(());
    };
    println!(
        "after seq {from_seq} up to seq {}: events from {} to {}",
        w.seq,
        time_text(from_time),
        time_text(w.time)
    );
    println!();
    let rows: Vec<Vec<String>> = Phase::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| start_phases[*i] > 0 || end_phases[*i] > 0)
        .map(|(i, p)| {
            vec![
                gpusched_gateway::phase_name(*p).to_string(),
                start_phases[i].to_string(),
                end_phases[i].to_string(),
            ]
        })
        .collect();
    println!("{}", table(&["JOBS", "FROM", "TO"], &rows));
    println!();
    let mut rows: Vec<(&str, String, u64)> = log_rows(&t.log);
    rows.extend(t.counts.iter().map(|((k, d), n)| (*k, d.clone(), *n)));
    rows.sort();
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(k, d, n)| vec![k.to_string(), d, n.to_string()])
        .collect();
    if rows.is_empty() {
        println!("nothing was submitted, admitted, bound, preempted or ended");
    } else {
        println!("{}", table(&["WHAT", "DETAIL", "COUNT"], &rows));
    }
    println!();
    let lost: Vec<String> = t
        .log
        .lost_gpu_ms
        .iter()
        .map(|(cause, ms)| format!("{:.2} GPU-hours to {cause}", *ms as f64 / 3.6e6))
        .collect();
    if lost.is_empty() {
        println!("work lost: none");
    } else {
        println!("work lost: {}", lost.join(", "));
    }
    let h = &t.log.reclaim_latency;
    if h.count() > 0 {
        println!(
            "reclaims: {} owner jobs bound after a plan reclaimed for them, {:.1} s on average from plan to bound",
            h.count(),
            h.sum_ms as f64 / 1e3 / h.count() as f64
        );
    }
    if !t.changes.is_empty() {
        println!();
        println!("quota and node changes:");
        for c in &t.changes {
            println!("  {c}");
        }
    }
    println!();
    let mut keys: Vec<&(String, String)> = start_use.keys().chain(end_use.keys()).collect();
    keys.sort();
    keys.dedup();
    let pair = |m: &Use, k: &(String, String), i: usize| m.get(k).map_or(0, |r| r[i]);
    let rows: Vec<Vec<String>> = keys
        .into_iter()
        .filter(|k| start_use.get(*k) != end_use.get(*k))
        .map(|k| {
            let mut r = vec![k.0.clone(), k.1.clone()];
            for i in 0..4 {
                r.push(format!(
                    "{} → {}",
                    pair(&start_use, k, i),
                    pair(&end_use, k, i)
                ));
            }
            r
        })
        .collect();
    if rows.is_empty() {
        println!("no tenant's use changed");
    } else {
        println!(
            "{}",
            table(
                &["TENANT", "FLAVOR", "USED", "BORROWED", "PENDING", "RUNNING"],
                &rows
            )
        );
    }
    Ok(())
}
