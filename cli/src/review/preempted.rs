//! `gpusched why-preempted JOB`: why the preemption stage chose a job as a
//! victim. The log holds the plan (its beneficiary, cause and victims);
//! this runs the stage's victim search again on the state just before the
//! plan, at the plan's time, and prints every candidate and every victim
//! set the search costed, the set it chose, and who got the GPUs after.
//! The same report answers for a simulated run's in-memory log
//! (`gpusched simulate --why-preempted`, `why_preempted_in_run`), with
//! times on the run's virtual clock.
//!
//! Owns: the report, whichever log it reads. The search is the stage's own
//! (`preemption::search_report`), under the same cycle flags the services
//! take. Must never: present a search that chose differently from the
//! logged plan as the reason: it says so instead (the service ran with
//! other flags, or decided on a view a few events older).

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use gpusched_core::explain;
use gpusched_core::preemption::{search_report, SearchReport};
use gpusched_core::CycleConfig;
use gpusched_events::{Assignment, Event, PreemptionCause, Victim};
use gpusched_model::{JobId, NodeId, Timestamp};
use gpusched_runtime::CycleArgs;

use super::{time_text, walk, walk_events, Step, Visitor};
use crate::client::table;

/// `gpusched why-preempted`.
#[derive(clap::Args, Debug)]
pub struct WhyPreemptedArgs {
    /// The preempted job.
    job: u64,
    /// Which of the plans that chose it, 1 the first [default: the last].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    plan: Option<u64>,
    #[command(flatten)]
    cycle: CycleArgs,
    #[command(flatten)]
    log: gpusched_runtime::LogDatabaseArgs,
}

/// How the report writes a time.
#[derive(Clone, Copy, Debug)]
enum Clock {
    /// The log's clock, UTC (`time_text`).
    Log,
    /// A simulated run's virtual clock: `t=H:MM:SS.mmm` since its start.
    Virtual,
}

impl Clock {
    fn text(self, t: impl Into<Option<Timestamp>>) -> String {
        match (self, t.into()) {
            (Clock::Log, t) => time_text(t),
            (Clock::Virtual, None) => "-".to_string(),
            (Clock::Virtual, Some(t)) => {
                let s = t.0 / 1000;
                format!(
                    "t={}:{:02}:{:02}.{:03}",
                    s / 3600,
                    s / 60 % 60,
                    s % 60,
                    t.0 % 1000
                )
            }
        }
    }
}

/// A GPU-ms figure in GPU-hours.
fn gpu_h(ms: u64) -> String {
    format!("{:.2}", ms as f64 / 3.6e6)
}

/// What the walk gathers around the plan.
struct Around {
    victim: JobId,
    plan_seq: u64,
    cfg: CycleConfig,
    clock: Clock,
    /// The re-run search, and the victim's GPUs then.
    search: Option<SearchReport>,
    held: Vec<Assignment>,
    names: BTreeMap<NodeId, String>,
    /// After the plan: the victim stopping, and binds on its nodes.
    stopped: Option<String>,
    rebinds: Vec<String>,
    resumed: Option<String>,
}

impl Visitor for Around {
    fn before(&mut self, step: &Step<'_>) {
        let s = step.before;
        if step.seq == self.plan_seq {
            if let Event::PreemptionPlanned {
                beneficiary, at, ..
            } = step.event
            {
                self.search = search_report(s, &self.cfg, *beneficiary, *at);
                self.held = s
                    .job(self.victim)
                    .map(|j| j.assignments.clone())
                    .unwrap_or_default();
                for a in &self.held {
                    if let Some(n) = s.nodes().get(a.node.index()) {
                        self.names.insert(a.node, n.spec.name.clone());
                    }
                }
            }
            return;
        }
        if step.seq < self.plan_seq || self.resumed.is_some() {
            return;
        }
        let line = || {
            format!(
                "seq {} at {}: {}",
                step.seq,
                self.clock.text(step.time),
                explain::log_line(s, step.event)
            )
        };
        match step.event {
            Event::JobPreempted { job, .. } if *job == self.victim && self.stopped.is_none() => {
                self.stopped = Some(line());
            }
            Event::JobBound {
                job, assignments, ..
            } => {
                if *job == self.victim {
                    self.resumed = Some(line());
                } else if self.stopped.is_some()
                    && self.rebinds.len() < 8
                    && assignments
                        .iter()
                        .any(|a| self.held.iter().any(|h| h.node == a.node))
                {
                    self.rebinds.push(line());
                }
            }
            _ => {}
        }
    }
}

fn victims_text(v: &[Victim]) -> String {
    v.iter()
        .map(|v| v.job.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn print_search(r: &SearchReport, logged: &[Victim], state_seq: u64) {
    println!("the victim search, run again on the state just before the plan (seq {state_seq}):");
    if r.quota_deficit > 0 {
        println!("  quota to free: {} GPUs", r.quota_deficit);
    }
    println!(
        "  {} jobs looked at, {} candidates costed (cost = GPUs × work since the last complete checkpoint + restart + thrash penalty, in GPU-hours):",
        r.looked,
        r.candidates.len()
    );
    let rows: Vec<Vec<String>> = r
        .candidates
        .iter()
        .take(20)
        .map(|c| {
            vec![
                c.job.to_string(),
                gpu_h(c.expected_lost_gpu_ms),
                gpu_h(c.cost),
                if logged.iter().any(|v| v.job == c.job) {
                    "chosen".to_string()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    println!(
        "{}",
        indent(&table(&["JOB", "EXPECTED_LOSS", "COST", ""], &rows))
    );
    if r.candidates.len() > 20 {
        println!("  … and {} more candidates", r.candidates.len() - 20);
    }
    println!("  victim sets costed ({}):", r.sets.len());
    let rows: Vec<Vec<String>> = r
        .sets
        .iter()
        .enumerate()
        .map(|(i, s)| {
            vec![
                format!("{}{}", i + 1, if r.chosen == Some(i) { " *" } else { "" }),
                s.domain
                    .clone()
                    .unwrap_or_else(|| "(room exists)".to_string()),
                victims_text(&s.victims),
                s.key.to_string(),
                if s.suffices { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    println!(
        "{}",
        indent(&table(
            &["SET", "DOMAIN", "VICTIMS", "KEY", "SUFFICES"],
            &rows
        ))
    );
    println!("  (KEY: the summed cost in GPU-ms the search minimises, or the number of victims in Kueue order; * the set chosen)");
}

fn indent(t: &str) -> String {
    t.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Prints why the job was preempted.
pub async fn why_preempted(args: WhyPreemptedArgs) -> Result<()> {
    let store = super::connect(&args.log.database_url).await?;
    let victim = JobId(args.job);
    let stored = store
        .plans_naming_victim(victim)
        .await
        .context("reading the preemption plans")?;
    if stored.is_empty() {
        bail!("job {victim}: no preemption plan in the log chose it as a victim");
    }
    let plans: Vec<(u64, &Event)> = stored.iter().map(|p| (p.seq, &p.event)).collect();
    let question = Question::ask(victim, &plans, args.plan)?;
    let mut around = question.around(args.cycle.config(), Clock::Log);
    walk(&store, None, &mut around).await?;
    question.answer(&around);
    Ok(())
}

/// Prints why the job was preempted in a simulated run: the same report
/// as `why_preempted`, on the run's own log (its events numbered from 1)
/// and under the run's own cycle configuration, about the last plan that
/// chose the job.
pub fn why_preempted_in_run(log: &[Event], victim: JobId, cfg: CycleConfig) -> Result<()> {
    let plans: Vec<(u64, &Event)> = (1u64..)
        .zip(log)
        .filter(|(_, e)| {
            matches!(e, Event::PreemptionPlanned { victims, .. }
                if victims.iter().any(|v| v.job == victim))
        })
        .collect();
    if plans.is_empty() {
        bail!("job {victim}: no preemption plan in this run chose it as a victim");
    }
    let question = Question::ask(victim, &plans, None)?;
    let mut around = question.around(cfg, Clock::Virtual);
    walk_events(log, &mut around);
    question.answer(&around);
    Ok(())
}

/// One logged plan, as the report reads it.
struct Plan<'a> {
    beneficiary: JobId,
    cause: &'a PreemptionCause,
    victims: &'a [Victim],
    at: Timestamp,
}

/// The plan a report is about: the `k`th of the `of` plans naming the
/// victim, at sequence number `seq`.
struct Question<'a> {
    victim: JobId,
    seq: u64,
    k: usize,
    of: usize,
    plan: Plan<'a>,
}

impl<'a> Question<'a> {
    /// Picks the plan `which` (1 the first; `None` the last) among
    /// `plans`, the (sequence number, event) of every plan naming `victim`
    /// in log order.
    fn ask(victim: JobId, plans: &[(u64, &'a Event)], which: Option<u64>) -> Result<Self> {
        let k = which.map_or(plans.len(), |k| k as usize);
        let Some((seq, event)) = k.checked_sub(1).and_then(|i| plans.get(i)) else {
            bail!(
                "--plan {k}: the log holds {} plans naming job {victim}",
                plans.len()
            );
        };
        let Event::PreemptionPlanned {
            beneficiary,
            cause,
            victims,
            at,
            ..
        } = event
        else {
            bail!("seq {seq}: not a preemption plan");
        };
        Ok(Question {
            victim,
            seq: *seq,
            k,
            of: plans.len(),
            plan: Plan {
                beneficiary: *beneficiary,
                cause,
                victims,
                at: *at,
            },
        })
    }

    /// The visitor that gathers, over a walk of the whole log, what the
    /// report shows around the plan.
    fn around(&self, cfg: CycleConfig, clock: Clock) -> Around {
        Around {
            victim: self.victim,
            plan_seq: self.seq,
            cfg,
            clock,
            search: None,
            held: Vec::new(),
            names: BTreeMap::new(),
            stopped: None,
            rebinds: Vec::new(),
            resumed: None,
        }
    }

    /// Prints the report from what the walk gathered.
    fn answer(&self, around: &Around) {
        let p = &self.plan;
        print_plan(around, self);
        match &around.search {
            _ if matches!(p.cause, PreemptionCause::Reservation) => {
                println!("no search: backfill leaves when the reservation it used is due");
            }
            Some(r) => {
                print_search(r, p.victims, self.seq.saturating_sub(1));
                let chosen = r.chosen.map(|i| &r.sets[i].victims);
                if chosen.map(|c| victims_text(c)) != Some(victims_text(p.victims)) {
                    println!(
                        "note: run again, the search does not choose the logged victims; the \
                         preemption service ran with other flags than these, or decided on a \
                         view a few events older than seq {}",
                        self.seq.saturating_sub(1)
                    );
                }
            }
            None => println!(
                "the search cannot be run again: just before the plan, job {} was not \
                 waiting for preemption (the service decided on an older view)",
                p.beneficiary
            ),
        }
        print_after(around);
    }
}

fn print_plan(a: &Around, q: &Question<'_>) {
    let p = &q.plan;
    let why = match p.cause {
        PreemptionCause::Reclaim {
            tenant,
            flavor,
            quota_deficit,
        } => format!(
            "tenant {tenant} reclaimed its lent {flavor} quota ({quota_deficit} GPUs of quota missing)"
        ),
        PreemptionCause::Priority { tenant, flavor } => {
            format!("a higher-priority job of {tenant} needed {flavor} GPUs")
        }
        PreemptionCause::Reservation => "the reservation it backfilled was due".to_string(),
    };
    println!(
        "job {} was chosen as a victim at {} (seq {}, plan {} of {}) for job {}: {why}",
        a.victim,
        a.clock.text(p.at),
        q.seq,
        q.k,
        q.of,
        p.beneficiary
    );
    let held: Vec<String> = a
        .held
        .iter()
        .map(|h| {
            let n = a
                .names
                .get(&h.node)
                .cloned()
                .unwrap_or_else(|| h.node.to_string());
            format!("{n}:{}", h.gpus)
        })
        .collect();
    if !held.is_empty() {
        println!("it held {}", held.join(", "));
    }
    let rows: Vec<Vec<String>> = p
        .victims
        .iter()
        .map(|v| {
            vec![
                v.job.to_string(),
                gpu_h(v.expected_lost_gpu_ms),
                gpu_h(v.cost),
                a.clock.text(v.deadline),
            ]
        })
        .collect();
    println!("the plan's victims (GPU-hours):");
    println!(
        "{}",
        indent(&table(&["JOB", "EXPECTED_LOSS", "COST", "STOP_BY"], &rows))
    );
    println!();
}

fn print_after(a: &Around) {
    println!();
    match &a.stopped {
        Some(l) => println!("it stopped: {l}"),
        None => println!("it has not stopped yet (the log ends first)"),
    }
    if a.rebinds.is_empty() {
        println!("no other job was bound on its nodes after it stopped");
    } else {
        println!("who got its GPUs:");
        for l in &a.rebinds {
            println!("  {l}");
        }
    }
    match &a.resumed {
        Some(l) => println!("it ran again: {l}"),
        None => println!("it has not been bound again (the log ends first)"),
    }
}
