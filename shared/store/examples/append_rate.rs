//! Measures `EventStore::append` throughput: batches of `BATCH` job
//! submissions (≈ 230 B of JSON each) from one task, into a throwaway
//! database that is dropped afterwards.
//!
//! `cargo run --release -p gpusched-store --example append_rate [batches] [batch] [keys|nokeys]`
//! (`keys`, the default, gives every event an idempotency key, as client
//! submissions have; scheduler decisions carry none)
//! (DATABASE_URL names the maintenance database; default
//! `postgres://postgres@127.0.0.1:5432/postgres`).

use gpusched_events::Event;
use gpusched_model::{JobId, JobSpec, Timestamp};
use gpusched_store::{EventStore, Fence, NewEvent, StoreError};
use std::time::Instant;

mod common;

#[tokio::main]
async fn main() -> Result<(), common::Error> {
    let mut args = std::env::args().skip(1);
    let batches: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let size: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let keys = args.next().as_deref() != Some("nokeys");
    common::on_throwaway_store("gpusched_bench", |store, fence| {
        run(store, fence, batches, size, keys)
    })
    .await
}

async fn run(
    store: EventStore,
    fence: Fence,
    batches: usize,
    size: usize,
    keys: bool,
) -> Result<(), common::Error> {
    let ceiling = store.raw_append_ceiling(100_000, 100).await?;
    println!("raw ceiling (UNNEST into a scratch table, 100 rows/tx): {ceiling:.0} events/s");
    let mut next = 1u64;
    let mut make = |n: usize| -> Vec<NewEvent> {
        (0..n)
            .map(|_| {
                let job = JobId(next);
                next += 1;
                let ev = NewEvent::new(Event::JobSubmitted {
                    job,
                    spec: JobSpec {
                        flavors: vec!["h100".into()],
                        topology: "block".into(),
                        max_runtime_s: Some(86_400),
                        ..JobSpec::new("tenant-17", 4, 8)
                    },
                    at: Timestamp(job.0 * 1000),
                });
                if keys {
                    ev.idempotency_key(format!("submit-{}", job.0))
                } else {
                    ev
                }
            })
            .collect()
    };
    // Warm up (connection, prepared statement, first pages).
    store.append(&make(size), &fence).await?;
    let work: Vec<Vec<NewEvent>> = (0..batches).map(|_| make(size)).collect();
    let start = Instant::now();
    for b in &work {
        store.append(b, &fence).await?;
    }
    let secs = start.elapsed().as_secs_f64();
    let total = (batches * size) as f64;
    println!(
        "append: {batches} batches × {size} events in {secs:.2}s = {:.0} events/s ({:.0}% of the raw ceiling)",
        total / secs,
        100.0 * total / secs / ceiling
    );
    let start = Instant::now();
    let (mut after, mut read) = (0, 0usize);
    loop {
        let page = store.read_from(after, gpusched_store::REPLAY_PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        read += page.len();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "read_from (decoded, no apply): {read} events in {secs:.2}s = {:.0} events/s",
        read as f64 / secs
    );
    let start = Instant::now();
    let state = store.replay(gpusched_store::Until::All).await;
    let secs = start.elapsed().as_secs_f64();
    match state {
        Ok(s) => println!(
            "replay: {} events in {secs:.2}s = {:.0} events/s",
            s.applied(),
            s.applied() as f64 / secs
        ),
        // Submissions for an unconfigured tenant are still folded; report
        // a refusal rather than fail the measurement.
        Err(StoreError::Apply { seq, source }) => println!("replay stopped at {seq}: {source}"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
