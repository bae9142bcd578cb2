//! `gpusched replay --at T --show queues|nodes|jobs`: the state at an
//! instant, printed as the live commands print it (`queues`, `nodes`,
//! `list`), from the same views the gateway serves.
//!
//! Owns: which of the state's parts is shown and how jobs are filtered.
//! Must never: print a view of its own making that the gateway would show
//! differently.

use anyhow::{Context, Result};
use clap::ValueEnum;
use gpusched_core::State;
use serde_json::Value;

use super::{time_text, walk, Instant, Quiet};
use crate::client::{self, Flavors};

/// What `--show` prints.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ShowWhat {
    /// Quota and use per tenant and flavor, as `gpusched queues`.
    Queues,
    /// Nodes summed up by flavor and topology, as `gpusched nodes` (with
    /// --long, every node).
    Nodes,
    /// Jobs, as `gpusched list`.
    Jobs,
}

/// `replay --show`'s own flags.
#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// Print this part of the state at --at (or at the log's end) instead
    /// of the replay summary.
    #[arg(long, value_enum, conflicts_with_all = ["from_snapshot", "verify"])]
    pub show: Option<ShowWhat>,
    /// With --show jobs: only this tenant's jobs.
    #[arg(long, requires = "show")]
    pub tenant: Option<String>,
    /// With --show jobs: only these states, comma-separated (queued,running,…).
    #[arg(long, requires = "show", value_delimiter = ',')]
    pub state: Vec<String>,
    /// With --show jobs: at most this many jobs, by id.
    #[arg(long, requires = "show", default_value_t = 1000)]
    pub limit: usize,
    /// With --show nodes: every node, not only the summary.
    #[arg(long, requires = "show")]
    pub long: bool,
}

/// Folds the log to `at` and prints what `args` asks for.
pub async fn show(url: &str, at: Option<Instant>, what: ShowWhat, args: &ShowArgs) -> Result<()> {
    let store = super::connect(url).await?;
    let w = walk(&store, at, &mut Quiet).await?;
    println!(
        "the log at seq {} ({}): {} events applied",
        w.seq,
        time_text(w.time),
        w.state.applied()
    );
    println!();
    let text = match what {
        ShowWhat::Queues => {
            let v = serde_json::to_value(gpusched_gateway::queues_view(&w.state, w.state.clock()))
                .context("encoding the queues")?;
            client::queues_table(&v)
        }
        ShowWhat::Nodes => nodes_text(&w.state, args.long)?,
        ShowWhat::Jobs => jobs_text(&w.state, args, w.time.map_or(0, |t| t.0))?,
    };
    println!("{text}");
    Ok(())
}

fn nodes_text(s: &State, long: bool) -> Result<String> {
    let v = serde_json::to_value(gpusched_gateway::nodes_view(s)).context("encoding the nodes")?;
    let nodes: Vec<Value> = v
        .get("nodes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = crate::nodes::summarize(&nodes, 1).to_text();
    if long {
        out.push_str("\n\n");
        out.push_str(&client::nodes_table(&nodes));
    }
    Ok(out)
}

fn jobs_text(s: &State, args: &ShowArgs, now_ms: u64) -> Result<String> {
    if let Some(t) = &args.tenant {
        if !s.tenants().iter().any(|x| &x.spec.name == t) {
            anyhow::bail!("--tenant {t}: no such tenant in the log at this instant");
        }
    }
    for st in &args.state {
        if !gpusched_core::Phase::ALL
            .iter()
            .any(|p| gpusched_gateway::phase_name(*p) == st)
        {
            anyhow::bail!("--state {st}: not a job state (queued, admitted, bound, running, …)");
        }
    }
    let mut jobs: Vec<Value> = Vec::new();
    for j in s.jobs() {
        if args.tenant.as_ref().is_some_and(|t| &j.spec.tenant != t) {
            continue;
        }
        let name = gpusched_gateway::phase_name(j.phase);
        if !args.state.is_empty() && !args.state.iter().any(|st| st == name) {
            continue;
        }
        jobs.push(
            serde_json::to_value(gpusched_gateway::job_view(s, j)).context("encoding a job")?,
        );
    }
    jobs.sort_by_key(|j| j.get("id").and_then(Value::as_u64));
    let total = jobs.len();
    jobs.truncate(args.limit);
    let mut out = client::jobs_table(&jobs, &Flavors::default(), now_ms);
    if total > jobs.len() {
        out.push_str(&format!(
            "\n({} of {total} jobs shown; --limit shows more)",
            jobs.len()
        ));
    }
    Ok(out)
}
