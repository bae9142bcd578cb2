//! Throwaway databases for tests of gpusched and of crates that use the
//! store: each `TestDb` is a fresh, migrated database with a random name,
//! dropped when the value is dropped, even when the test fails.
//!
//! Must never: be used outside tests (it panics on setup failure, which is
//! what a test wants).

#![allow(clippy::expect_used, clippy::panic)]

use crate::EventStore;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
use std::str::FromStr;

/// Where the maintenance database is when `DATABASE_URL` is unset.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

fn admin_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

async fn admin_connection(url: &str) -> PgConnection {
    match PgConnection::connect(url).await {
        Ok(c) => c,
        Err(e) => panic!(
            "Postgres is not reachable at {url}: {e}. These tests need a running \
             Postgres (CI starts one); start it or point DATABASE_URL at one."
        ),
    }
}

/// A fresh database with the store's schema, dropped when this is dropped.
pub struct TestDb {
    /// The store on it.
    pub store: EventStore,
    /// Its URL.
    pub url: String,
    // Dropped after `store`: removes the database.
    _guard: DropDb,
}

/// Drops the database named when dropped.
struct DropDb {
    name: String,
    admin_url: String,
}

impl TestDb {
    /// Creates `gpusched_test_<random>` and migrates it.
    pub async fn new() -> TestDb {
        let admin_url = admin_url();
        let name = format!("gpusched_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = admin_connection(&admin_url).await;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        let _ = admin.close().await;
        // From here on, the guard removes the database whatever happens.
        let guard = DropDb {
            name: name.clone(),
            admin_url: admin_url.clone(),
        };
        let opts = PgConnectOptions::from_str(&admin_url)
            .expect("DATABASE_URL parses")
            .database(&name)
            .disable_statement_logging();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(opts)
            .await
            .expect("connect to the test database");
        let store = EventStore::new(pool);
        store.migrate().await.expect("migrate the test database");
        let url = format!(
            "{}/{name}",
            admin_url
                .rsplit_once('/')
                .map_or(admin_url.as_str(), |(base, _)| base)
        );
        TestDb {
            store,
            url,
            _guard: guard,
        }
    }
}

impl Drop for DropDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let url = self.admin_url.clone();
        // Drop cannot await; a private runtime on its own thread can. The
        // test's pool lives on the test's runtime, which is blocked here, so
        // it is not closed: FORCE ends its sessions.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let mut admin = PgConnection::connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await
                .map_err(|e| e.to_string())?;
                let _ = admin.close().await;
                Ok::<(), String>(())
            })
        })
        .join();
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!("warning: dropping test database {} panicked", self.name),
        }
    }
}
