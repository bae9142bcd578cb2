//! An admin's operations on queues and nodes: `gpusched queues
//! hold|release|drain|stop TENANT` and `gpusched nodes
//! cordon|uncordon|drain|evict NODE`, each one `POST` to the API.
//!
//! Owns: the words these commands print. Must never: decide whether an
//! operation is legal (the gateway answers 404 or 409, which this passes
//! on with its exit code), or send more than the one change asked for.

use anyhow::Result;
use serde_json::Value;

use crate::client::{Client, Conn};

/// A tenant's queue to change.
#[derive(clap::Args, Debug)]
pub struct QueueTarget {
    /// The tenant.
    tenant: String,
    #[command(flatten)]
    conn: Conn,
}

/// `gpusched queues ...`: a change to one queue.
#[derive(clap::Subcommand, Debug)]
pub enum QueueOp {
    /// Admit nothing new from the queue; submissions still queue and
    /// running jobs run on.
    Hold(QueueTarget),
    /// Open the queue again (after hold, drain or stop).
    Release(QueueTarget),
    /// Admit nothing new and refuse new submissions; running jobs finish.
    Drain(QueueTarget),
    /// As drain, and evict the queue's running jobs with the checkpoint
    /// protocol, those on borrowed quota first.
    Stop(QueueTarget),
}

/// A node to change.
#[derive(clap::Args, Debug)]
pub struct NodeTarget {
    /// The node, by name or id.
    node: String,
    #[command(flatten)]
    conn: Conn,
}

/// `gpusched nodes ...`: a change to one node.
#[derive(clap::Subcommand, Debug)]
pub enum NodeOp {
    /// Place no new work on the node; running jobs stay.
    Cordon(NodeTarget),
    /// Return a cordoned, drained or evicted node to service.
    Uncordon(NodeTarget),
    /// Place no new work; the node empties as its jobs end.
    Drain(NodeTarget),
    /// For maintenance: place no new work and evict every job on the node
    /// with the checkpoint protocol (they resume elsewhere); it stays out
    /// of service once empty, until uncordoned.
    Evict(NodeTarget),
}

/// A line on stdout; a closed stdout is not an error here.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// POSTs `/v1/{what}s/{name}/{verb}` and says what `name` is now
/// (`queue vision: held`), or prints the answer with `--json`.
async fn change(conn: &Conn, what: &str, name: &str, verb: &str) -> Result<()> {
    let c: Client = conn.client()?;
    let (_, v) = c.post_empty(&format!("/v1/{what}s/{name}/{verb}")).await?;
    if c.json {
        c.print_json(&v);
    } else {
        let now = v.get("now").and_then(Value::as_str).unwrap_or("?");
        say(&format!("{what} {name}: {now}"));
    }
    Ok(())
}

/// Sends one queue change and says what the queue is now.
pub async fn queue_op(op: QueueOp) -> Result<()> {
    let (verb, t) = match &op {
        QueueOp::Hold(t) => ("hold", t),
        QueueOp::Release(t) => ("release", t),
        QueueOp::Drain(t) => ("drain", t),
        QueueOp::Stop(t) => ("stop", t),
    };
    change(&t.conn, "queue", &t.tenant, verb).await
}

/// Sends one node change and says what the node is now.
pub async fn node_op(op: NodeOp) -> Result<()> {
    let (verb, t) = match &op {
        NodeOp::Cordon(t) => ("cordon", t),
        NodeOp::Uncordon(t) => ("uncordon", t),
        NodeOp::Drain(t) => ("drain", t),
        NodeOp::Evict(t) => ("evict", t),
    };
    change(&t.conn, "node", &t.node, verb).await
}
