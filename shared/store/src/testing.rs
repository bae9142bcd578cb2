//! Throwaway databases for tests of gpusched and of crates that use the
//! store: each `TestDb` is a fresh, migrated database with a random name,
//! dropped when the value is dropped, even when the test fails. For fault
//! tests, `PrivatePostgres` is a whole server of the test's own (its own
//! data directory and port) that the test may stop and start: the one
//! launcher in `gpusched_testkit`, with a test's panics and async stops.
//!
//! Owns: the test databases it creates and dropping them on drop; the
//! panicking face of the private server (the launcher owns its process
//! and files).
//!
//! Must never: be used outside tests (it panics on setup failure, which is
//! what a test wants), launch a server itself (that is `gpusched_testkit`'s),
//! or stop, restart or reconfigure a server it did not start (the shared
//! one included).

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

pub use gpusched_testkit::postgres::{StopMode, DEFAULT_PG_BIN};

/// A Postgres server of the test's own (`gpusched_testkit`'s launcher): a
/// fresh cluster in a temp dir, listening on 127.0.0.1 at a free port, run
/// as the `postgres` OS user when the test runs as root. Stopped
/// (immediately) and its files removed when dropped, even on panic.
pub struct PrivatePostgres {
    server: gpusched_testkit::PrivatePostgres,
}

impl PrivatePostgres {
    /// Creates the cluster and starts it. Blocks (a few seconds).
    pub fn start() -> PrivatePostgres {
        let opts = gpusched_testkit::PostgresOptions::default();
        match gpusched_testkit::PrivatePostgres::start(&opts) {
            Ok(server) => PrivatePostgres { server },
            Err(e) => panic!("a private Postgres: {e}"),
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// A URL for `database` on this server, as user `postgres`.
    pub fn url(&self, database: &str) -> String {
        self.server.url(database)
    }

    /// Stops the server and waits until it is down.
    pub async fn stop(&self, mode: StopMode) {
        let ctl = self.server.control();
        blocking(move || ctl.stop(mode)).await;
    }

    /// Starts the stopped server again (same data, same port) and waits
    /// until it accepts connections.
    pub async fn start_again(&self) {
        let ctl = self.server.control();
        blocking(move || ctl.start()).await;
    }

    /// The server's log so far (for failure messages).
    pub fn server_log(&self) -> String {
        self.server.server_log()
    }
}

/// Runs `pg_ctl` on the blocking pool, so the test's other tasks keep
/// running; panics when it fails.
async fn blocking(f: impl FnOnce() -> std::io::Result<()> + Send + 'static) {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{e}"),
        Err(e) => panic!("pg_ctl task: {e}"),
    }
}
