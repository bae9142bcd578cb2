//! `gpusched replay`: the state rebuilt from the event log, from the first
//! event or from the newest good snapshot, and the check that both give
//! the same state.
//!
//! Owns: the two ways of replaying and their report. Must never: write to
//! the log or the snapshots, or call a replay good whose state differs in
//! any field from the replay from zero.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use gpusched_core::{Phase, State};
use gpusched_store::{EventStore, Until};

/// A replayed state and how it was reached.
pub struct Replayed {
    /// The state.
    pub state: State,
    /// The snapshot it started from (sequence, size), if any.
    pub snapshot: Option<(u64, u64)>,
    /// Time reading and checking the snapshot took, seconds.
    pub load_s: f64,
    /// Events folded after the start.
    pub folded: u64,
    /// Superseded decisions skipped.
    pub superseded: u64,
    /// Time folding took, seconds.
    pub fold_s: f64,
}

/// The replay from the first event.
pub async fn from_zero(store: &EventStore, until: Until) -> Result<Replayed> {
    let started = Instant::now();
    let mut state = State::new();
    let out = store
        .replay_onto(&mut state, 0, until)
        .await
        .context("replay")?;
    Ok(Replayed {
        state,
        snapshot: None,
        load_s: 0.0,
        folded: out.applied + out.superseded,
        superseded: out.superseded,
        fold_s: started.elapsed().as_secs_f64(),
    })
}

/// The replay from the newest good snapshot at or before `end` (from the
/// first event when there is none); snapshots skipped are named on stderr.
pub async fn from_snapshot(store: &EventStore, end: u64, until: Until) -> Result<Replayed> {
    let started = Instant::now();
    let found = store
        .newest_snapshot(end)
        .await
        .context("reading snapshots")?;
    for s in &found.skipped {
        eprintln!("warning: snapshot at {} skipped: {}", s.seq, s.why);
    }
    let load_s = started.elapsed().as_secs_f64();
    let Some((snap, info)) = found.snapshot else {
        eprintln!("no usable snapshot: replaying from the first event");
        return from_zero(store, until).await;
    };
    let mut state = snap.state;
    let started = Instant::now();
    let out = store
        .replay_onto(&mut state, snap.seq, until)
        .await
        .context("replay after the snapshot")?;
    Ok(Replayed {
        state,
        snapshot: Some((snap.seq, info.bytes)),
        load_s,
        folded: out.applied + out.superseded,
        superseded: out.superseded,
        fold_s: started.elapsed().as_secs_f64(),
    })
}

/// Prints what a replay reached.
pub fn print(r: &Replayed, last: u64) {
    let s = &r.state;
    match r.snapshot {
        Some((seq, bytes)) => println!(
            "from snapshot at {seq} ({:.1} MiB, read and checked in {:.2} s)",
            bytes as f64 / (1 << 20) as f64,
            r.load_s
        ),
        None => println!("from the first event"),
    }
    println!(
        "events applied: {} (log holds {last}; {} superseded decisions skipped)",
        s.applied(),
        r.superseded
    );
    println!(
        "nodes: {}  tenants: {}  jobs: {}",
        s.nodes().len(),
        s.tenants().len(),
        s.job_count()
    );
    let c = s.phase_counts();
    for p in Phase::ALL {
        if c.get(p) > 0 {
            println!("  {:<12} {}", format!("{p:?}").to_lowercase(), c.get(p));
        }
    }
    println!(
        "folded {} events in {:.2} s ({:.0} events/s)",
        r.folded,
        r.fold_s,
        r.folded as f64 / r.fold_s.max(1e-9)
    );
    println!("state_hash: {}", s.state_hash());
}

/// Fails unless the two replays reached the same state, field for field.
pub fn verify(from_snapshot: &Replayed, from_zero: &Replayed) -> Result<()> {
    if from_snapshot.state != from_zero.state {
        bail!(
            "the replay from the snapshot differs from the replay from the first event \
             (state_hash {} vs {})",
            from_snapshot.state.state_hash(),
            from_zero.state.state_hash()
        );
    }
    let took = |r: &Replayed| r.load_s + r.fold_s;
    println!(
        "verified: both replays give the same state ({:.2} s from the snapshot, {:.2} s from the first event)",
        took(from_snapshot),
        took(from_zero)
    );
    Ok(())
}
