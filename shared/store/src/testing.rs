//! Throwaway databases for tests of gpusched and of crates that use the
//! store: each `TestDb` is a fresh, migrated database with a random name,
//! dropped when the value is dropped, even when the test fails. For fault
//! tests, `PrivatePostgres` is a whole server of the test's own (its own
//! data directory and port) that the test may stop and start.
//!
//! Owns: the test databases and private servers it creates, and removing
//! them (and their processes and files) on drop.
//!
//! Must never: be used outside tests (it panics on setup failure, which is
//! what a test wants), or stop, restart or reconfigure a server it did not
//! start (the shared one included).

#![allow(clippy::expect_used, clippy::panic)]

use crate::EventStore;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
use std::path::{Path, PathBuf};
use std::process::Command;
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

/// Where the PostgreSQL server programs are unless `GPUSCHED_PG_BIN` says.
pub const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// How `PrivatePostgres::stop` shuts the server down (`pg_ctl -m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    /// Ends every session (their clients get 57P01), then shuts down cleanly.
    Fast,
    /// Kills the server outright, as a crash would; it recovers from WAL
    /// on the next start.
    Immediate,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// A Postgres server of the test's own: a fresh cluster in a temp dir,
/// listening on 127.0.0.1 at a free port, run as the `postgres` OS user
/// when the test runs as root (the server refuses to run as root). Stopped
/// (immediately) and its files removed when dropped, even on panic.
pub struct PrivatePostgres {
    ctl: PgCtl,
    root: PathBuf,
}

/// What it takes to run `pg_ctl` on the server (cheap to clone into a
/// blocking task).
#[derive(Clone, Debug)]
struct PgCtl {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PrivatePostgres {
    /// Creates the cluster and starts it. Blocks (a few seconds).
    pub fn start() -> PrivatePostgres {
        let root = std::env::temp_dir().join(format!(
            "gpusched-private-pg-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&root).expect("create the private Postgres directory");
        let as_postgres = running_as_root();
        let pg = PrivatePostgres {
            ctl: PgCtl {
                bin: std::env::var_os("GPUSCHED_PG_BIN")
                    .map_or_else(|| PathBuf::from(DEFAULT_PG_BIN), PathBuf::from),
                data: root.join("data"),
                log: root.join("server.log"),
                port: free_port(),
                as_postgres,
            },
            // From here on, drop removes the directory whatever happens.
            root,
        };
        if as_postgres {
            run(Command::new("chown").arg("postgres").arg(&pg.root));
        }
        pg.ctl.initdb();
        pg.ctl.start();
        pg
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.ctl.port
    }

    /// A URL for `database` on this server, as user `postgres`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.ctl.port)
    }

    /// Stops the server and waits until it is down.
    pub async fn stop(&self, mode: StopMode) {
        let ctl = self.ctl.clone();
        blocking(move || ctl.stop(mode)).await;
    }

    /// Starts the stopped server again (same data, same port) and waits
    /// until it accepts connections.
    pub async fn start_again(&self) {
        let ctl = self.ctl.clone();
        blocking(move || ctl.start()).await;
    }

    /// The server's log so far (for failure messages).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(&self.ctl.log).unwrap_or_default()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.ctl.kill();
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            eprintln!("warning: could not remove {}: {e}", self.root.display());
        }
    }
}

impl PgCtl {
    /// A command running server program `tool` as the right OS user.
    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    fn initdb(&self) {
        run(self.command("initdb").arg("-D").arg(&self.data).args([
            "--auth=trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ]));
    }

    fn start(&self) {
        let socket_dir = self.data.parent().unwrap_or(Path::new("/tmp"));
        let settings = format!(
            "-c port={} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c fsync=off -c full_page_writes=off -c shared_buffers=16MB -c max_connections=50",
            self.port,
            socket_dir.display()
        );
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "60", "-o", &settings, "start"]));
    }

    fn stop(&self, mode: StopMode) {
        run(self.command("pg_ctl").arg("-D").arg(&self.data).args([
            "-w",
            "-t",
            "60",
            "-m",
            mode.as_arg(),
            "stop",
        ]));
    }

    /// Stops the server however it can, without panicking (for drop).
    fn kill(&self) {
        let stopped = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "10", "-m", "immediate", "stop"])
            .output();
        let pid_file = self.data.join("postmaster.pid");
        if stopped.is_ok_and(|o| o.status.success()) || !pid_file.exists() {
            return;
        }
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.lines().next().map(str::trim).map(str::to_string));
        if let Some(pid) = pid.filter(|p| p.parse::<u32>().is_ok()) {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    }
}

/// Runs a setup command; panics with its output when it fails.
fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on the blocking pool, so the test's other tasks keep running.
async fn blocking(f: impl FnOnce() + Send + 'static) {
    tokio::task::spawn_blocking(f)
        .await
        .expect("pg_ctl task panicked");
}

/// True when this process runs as root (`/proc/self` belongs to its user).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A TCP port nothing listens on now (the OS picks it; 5432 is in use).
fn free_port() -> u16 {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe socket on 127.0.0.1");
    listener.local_addr().expect("probe socket address").port()
}
