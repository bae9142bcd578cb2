//! Measures replay against the plain read of the same rows, in one run:
//! a simulated run on the 10,000-node cluster (`docs/clusters/10k-nodes.toml`,
//! a synthetic workload) is appended to a throwaway database, then read
//! back three ways, each the median of three passes:
//!
//! - `select`: `SELECT seq, recorded_at, payload::text` in pages of
//!   `REPLAY_PAGE`, rows fetched and dropped (the ceiling replay is judged by);
//! - `read_from`: the same pages with every column, decoded into
//!   `StoredEvent`s, not applied (what the events API reads);
//! - `replay`: `EventStore::replay`, decoded and folded into a state, the
//!   next pages read while one is folded.
//!
//! It also prints the fold alone (the same events from memory), the
//! share of the replay that is not the database's.
//!
//! `cargo run --release -p gpusched-store --example replay_rate [jobs]`
//! (default 100,000 jobs; DATABASE_URL names the maintenance database,
//! default `postgres://postgres@127.0.0.1:5432/postgres`).

use gpusched_core::CycleConfig;
use gpusched_sim::{workload, Cluster, SimOptions, Simulator};
use gpusched_store::{EventStore, Fence, NewEvent, Until, REPLAY_PAGE};
use std::path::Path;
use std::time::Instant;

mod common;
use common::Error;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let jobs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(100_000);
    common::on_throwaway_store("gpusched_bench_replay", |store, fence| {
        run(store, fence, jobs)
    })
    .await
}

/// The simulated log: cluster set-up, then every decision of the run.
fn simulated_log(jobs: usize) -> Result<Vec<gpusched_events::Event>, Error> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster = Cluster::load(&here.join("../../docs/clusters/10k-nodes.toml"))?;
    let work = workload::synthetic(&workload::SyntheticOptions {
        jobs,
        tenants: cluster.tenants.clone(),
        seed: 7,
        arrival_rate_per_s: jobs as f64 / 86_400.0 * 4.0,
        gpus_per_node: 8,
    });
    let opts = SimOptions {
        cycle: CycleConfig::default(),
        until: None,
        record_events: true,
        restore_ms: 0,
    };
    let mut sim = Simulator::new(&cluster, work, opts)?;
    sim.run(&mut |_| {})?;
    Ok(sim.log().to_vec())
}

async fn run(store: EventStore, fence: Fence, jobs: usize) -> Result<(), Error> {
    let pool = store.pool().clone();
    let log = simulated_log(jobs)?;
    for chunk in log.chunks(1000) {
        let batch: Vec<NewEvent> = chunk.iter().cloned().map(NewEvent::new).collect();
        store.append(&batch, &fence).await?;
    }
    sqlx::query("VACUUM ANALYZE events").execute(&pool).await?;
    println!("log: {} events from {jobs} simulated jobs", log.len());
    let start = Instant::now();
    gpusched_sim::replay(&log)?;
    let fold = start.elapsed().as_secs_f64();
    println!(
        "fold only (the events in memory, State::apply): {:.0} events/s",
        log.len() as f64 / fold
    );

    let select = median(|| plain_select(&pool)).await?;
    let read = median(|| decoded_read(&store)).await?;
    let replay = median(|| full_replay(&store)).await?;
    let n = log.len() as f64;
    for (what, secs) in [("select", select), ("read_from", read), ("replay", replay)] {
        println!(
            "{what:>9}: {secs:.3} s = {:>7.0} events/s ({:.0}% of select)",
            n / secs,
            100.0 * select / secs
        );
    }
    Ok(())
}

async fn median<F, Fut>(mut pass: F) -> Result<f64, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let mut secs = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        pass().await?;
        secs.push(start.elapsed().as_secs_f64());
    }
    secs.sort_by(f64::total_cmp);
    Ok(secs[1])
}

async fn plain_select(pool: &sqlx::PgPool) -> Result<(), Error> {
    let mut after = 0i64;
    loop {
        let rows: Vec<(i64, chrono::DateTime<chrono::Utc>, String)> = sqlx::query_as(
            "SELECT seq, recorded_at, payload::text FROM events WHERE seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(after)
        .bind(REPLAY_PAGE as i64)
        .fetch_all(pool)
        .await?;
        match rows.last() {
            Some(last) => after = last.0,
            None => return Ok(()),
        }
    }
}

async fn decoded_read(store: &EventStore) -> Result<(), Error> {
    let mut after = 0u64;
    loop {
        let page = store.read_from(after, REPLAY_PAGE).await?;
        match page.last() {
            Some(last) => after = last.seq,
            None => return Ok(()),
        }
    }
}

async fn full_replay(store: &EventStore) -> Result<(), Error> {
    store.replay(Until::All).await?;
    Ok(())
}
