//! `gpusched diff --from T1 --to T2`: what changed in between: jobs in each
//! state, admissions and bindings, preemptions by cause and the work they
//! lost, quota moves, and nodes lost, rejoined, cordoned or drained; then
//! each tenant's use per flavor at both ends.
//!
//! Owns: the tallies of a range of the log. Must never: count a decision
//! the state refused (a superseded one had no effect).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use gpusched_core::{Phase, State};
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
    log: super::LogArgs,
}

/// Each tenant's row per flavor, as `GET /v1/queues` has it:
/// (used, borrowed, pending, running) by (tenant, flavor).
type Use = BTreeMap<(String, String), [u64; 4]>;

fn use_of(s: &State) -> Result<Use> {
    let v = serde_json::to_value(gpusched_gateway::queues_view(s)).context("encoding queues")?;
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
    start: Option<(i64, gpusched_model::Timestamp, Use, Vec<u64>)>,
    /// Counts by what happened (kind, detail).
    counts: BTreeMap<(&'static str, String), u64>,
    /// Work lost by preemption and by lost nodes, GPU-ms.
    lost_preempted_gpu_ms: u64,
    lost_requeued_gpu_ms: u64,
    /// Lines for quota moves and node changes, in log order.
    changes: Vec<String>,
    /// The event under the fold and its count key, until it is known to
    /// have taken effect.
    pending: Vec<(&'static str, String)>,
    pending_lost: (u64, u64),
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
        if !range.contains(step.seq, step.time) {
            return;
        }
        if self.start.is_none() {
            match use_of(step.before) {
                Ok(u) => self.start = Some((step.seq - 1, step.time, u, phase_counts(step.before))),
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
            Event::JobAdmitted {
                job,
                flavor,
                borrowed,
                ..
            } => {
                let how = if *borrowed > 0 {
                    "borrowing"
                } else {
                    "own quota"
                };
                self.note("admitted", format!("{}/{flavor} ({how})", tenant(job)));
            }
            Event::JobBound {
                job, backfill_for, ..
            } => {
                let how = if backfill_for.is_some() {
                    " as backfill"
                } else {
                    ""
                };
                self.note("bound", format!("{}{how}", tenant(job)));
            }
            Event::JobFinished { job, outcome, .. } => {
                let how = match outcome {
                    Outcome::Succeeded => "succeeded",
                    Outcome::Failed => "failed",
                    Outcome::Cancelled => "cancelled",
                    Outcome::TimedOut => "timed out",
                };
                self.note("finished", format!("{} {how}", tenant(job)));
            }
            Event::JobCancelled { job, .. } => self.note("cancelled", tenant(job)),
            Event::PreemptionPlanned { cause, victims, .. } => {
                self.note("preemptions planned", cause_key(cause));
                for v in victims {
                    self.note(
                        "victims chosen",
                        format!("{} for {}", tenant(&v.job), cause_key(cause)),
                    );
                }
            }
            Event::JobPreempted {
                job, lost_gpu_ms, ..
            } => {
                self.note("preempted", tenant(job));
                self.pending_lost.0 += lost_gpu_ms;
            }
            Event::JobRequeued {
                job, lost_gpu_ms, ..
            } => {
                self.note("requeued (node lost)", tenant(job));
                self.pending_lost.1 += lost_gpu_ms;
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
            _ => {}
        }
    }

    fn after(&mut self, _seq: i64, applied: bool, _after: &State) {
        let notes = std::mem::take(&mut self.pending);
        let lost = std::mem::take(&mut self.pending_lost);
        let change = self.pending_change.take();
        if !applied {
            return;
        }
        for k in notes {
            *self.counts.entry(k).or_default() += 1;
        }
        self.lost_preempted_gpu_ms += lost.0;
        self.lost_requeued_gpu_ms += lost.1;
        self.changes.extend(change);
    }
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
        "from seq {from_seq} ({}) to seq {} ({})",
        time_text(from_time),
        w.seq,
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
    let rows: Vec<Vec<String>> = t
        .counts
        .iter()
        .map(|((k, d), n)| vec![k.to_string(), d.clone(), n.to_string()])
        .collect();
    if rows.is_empty() {
        println!("nothing was submitted, admitted, bound, preempted or ended");
    } else {
        println!("{}", table(&["WHAT", "DETAIL", "COUNT"], &rows));
    }
    println!();
    println!(
        "work lost: {:.2} GPU-hours to preemption, {:.2} GPU-hours to lost nodes",
        t.lost_preempted_gpu_ms as f64 / 3.6e6,
        t.lost_requeued_gpu_ms as f64 / 3.6e6
    );
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
