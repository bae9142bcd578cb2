//! `gpusched timeline --job ID | --node NAME | --tenant T [--from --to]`:
//! every event that concerns one job, node or tenant, one line each, with
//! its sequence number and time on the log's clock.
//!
//! Owns: which events concern the subject (a job's own events and the plans
//! that name it as a victim; a node's events and those of jobs on it; a
//! tenant's configuration and its jobs' events). Must never: hide a
//! superseded decision: it is shown, marked as having had no effect.

use anyhow::{bail, Result};
use gpusched_core::{explain, State};
use gpusched_events::Event;
use gpusched_model::JobId;

use super::{time_text, walk, RangeArgs, Step, Visitor};

/// `gpusched timeline`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("subject").required(true).args(["job", "node", "tenant"])))]
pub struct TimelineArgs {
    /// One job's events, and the plans that chose it as a victim.
    #[arg(long, value_name = "ID")]
    job: Option<u64>,
    /// One node's events, and those of the jobs on it.
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// One tenant's configuration and its jobs' events.
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
    #[command(flatten)]
    range: RangeArgs,
    #[command(flatten)]
    log: gpusched_runtime::LogDatabaseArgs,
}

/// The subject of a timeline.
enum Subject {
    Job(JobId),
    Node(String),
    Tenant(String),
}

impl Subject {
    /// Whether `ev` concerns the subject, read against the state before it.
    fn touched_by(&self, before: &State, ev: &Event) -> bool {
        match self {
            Subject::Job(id) => {
                ev.job() == Some(*id)
                    || matches!(ev, Event::PreemptionPlanned { victims, .. }
                        if victims.iter().any(|v| v.job == *id))
            }
            Subject::Node(name) => match ev {
                Event::NodeAdded { spec, .. } => &spec.name == name,
                _ => before
                    .node_id(name)
                    .is_some_and(|n| explain::nodes_touched(before, ev).contains(&n)),
            },
            Subject::Tenant(t) => explain::tenant_touched(before, ev) == Some(t.as_str()),
        }
    }

    fn words(&self) -> String {
        match self {
            Subject::Job(id) => format!("job {id}"),
            Subject::Node(n) => format!("node {n}"),
            Subject::Tenant(t) => format!("tenant {t}"),
        }
    }
}

/// The timeline's lines as the walk finds them.
struct Lines {
    subject: Subject,
    range: RangeArgs,
    lines: Vec<String>,
    /// The last line's event, until the fold says whether it took effect.
    pending: Option<u64>,
    /// Whether the subject appeared in the log at all.
    seen: bool,
}

impl Visitor for Lines {
    fn before(&mut self, step: &Step<'_>) {
        if !self.subject.touched_by(step.before, step.event) {
            return;
        }
        self.seen = true;
        if !self.range.contains(step.seq, step.time) {
            return;
        }
        self.lines.push(format!(
            "{:>9}  {:<24}  {}",
            step.seq,
            time_text(step.time),
            explain::log_line(step.before, step.event)
        ));
        self.pending = Some(step.seq);
    }

    fn after(&mut self, seq: u64, _event: &Event, applied: bool, _after: &State) {
        if self.pending.take() == Some(seq) && !applied {
            if let Some(l) = self.lines.last_mut() {
                l.push_str("  [superseded: no effect]");
            }
        }
    }
}

/// Prints the timeline `args` asks for.
pub async fn timeline(args: TimelineArgs) -> Result<()> {
    let subject = match (args.job, &args.node, &args.tenant) {
        (Some(j), _, _) => Subject::Job(JobId(j)),
        (_, Some(n), _) => Subject::Node(n.clone()),
        (_, _, Some(t)) => Subject::Tenant(t.clone()),
        _ => bail!("give --job, --node or --tenant"),
    };
    let store = super::connect(&args.log.database_url).await?;
    let mut lines = Lines {
        subject,
        range: args.range,
        lines: Vec::new(),
        pending: None,
        seen: false,
    };
    let w = walk(&store, args.range.to, &mut lines).await?;
    if !lines.seen {
        let flag = match lines.subject {
            Subject::Job(_) => "--job",
            Subject::Node(_) => "--node",
            Subject::Tenant(_) => "--tenant",
        };
        bail!(
            "{flag}: no {} in the log up to seq {}",
            lines.subject.words(),
            w.seq
        );
    }
    println!("{:>9}  {:<24}  EVENT", "SEQ", "TIME");
    for l in &lines.lines {
        println!("{l}");
    }
    println!(
        "{} events about {} (the log read up to seq {})",
        lines.lines.len(),
        lines.subject.words(),
        w.seq
    );
    Ok(())
}
