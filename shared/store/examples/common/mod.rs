//! What the store's benchmarks share: a throwaway database, migrated, with
//! a lease held, dropped afterwards whatever the benchmark did.

use gpusched_store::{EventStore, Fence};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection};
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

pub type Error = Box<dyn std::error::Error>;

/// Runs `bench` on a new database named `<prefix>_<pid>` (DATABASE_URL
/// names the maintenance database; default
/// `postgres://postgres@127.0.0.1:5432/postgres`), then drops it.
pub async fn on_throwaway_store<F, Fut>(prefix: &str, bench: F) -> Result<(), Error>
where
    F: FnOnce(EventStore, Fence) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    let name = format!("{prefix}_{}", std::process::id());
    let mut admin = PgConnection::connect(&admin_url).await?;
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await?;
    let result = run(&admin_url, &name, bench).await;
    sqlx::query(AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)")))
        .execute(&mut admin)
        .await?;
    result
}

async fn run<F, Fut>(admin_url: &str, name: &str, bench: F) -> Result<(), Error>
where
    F: FnOnce(EventStore, Fence) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let opts = PgConnectOptions::from_str(admin_url)?.database(name);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(opts)
        .await?;
    let store = EventStore::new(pool.clone());
    store.migrate().await?;
    let lease = store
        .acquire_lease("bench", "p", "bench-1", Duration::from_secs(3600))
        .await?
        .ok_or("lease taken")?;
    let result = bench(store, lease.fence()).await;
    pool.close().await;
    result
}
