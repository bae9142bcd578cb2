//! Private infrastructure for fault injection: a Postgres 15 cluster and a
//! `nats-server` with JetStream, each on a free port with its data under
//! one temporary directory of this run, which the chaos run restarts,
//! stops, kills and wipes at will. The servers are `gpusched_testkit`'s
//! launchers (the ones the store's and the bus's fault tests use); this
//! module gives them the load test's face: async, `anyhow` errors, the
//! load test's settings (`LOADTEST_PG_BIN`, 200 connections).
//!
//! Owns: the run's temporary directory, and running the launchers'
//! blocking operations off the runtime's threads.
//!
//! Must never: launch a server itself (that is `gpusched_testkit`'s),
//! touch the shared servers (5432, 4222) or any directory but its own, or
//! leave a process or a directory behind: [`Infra`]'s fields stop both
//! servers when dropped and then remove the directory, on the error and
//! panic paths too.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use gpusched_testkit::{PostgresOptions, StopMode};

/// Runs a blocking launcher call on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    Ok(tokio::task::spawn_blocking(f)
        .await
        .context("a launcher task")??)
}

/// A private Postgres cluster: `initdb` into the run's directory, started
/// with `pg_ctl` on its own port and socket directory; stopped and its
/// directory removed when dropped.
#[derive(Debug)]
pub struct PrivatePostgres {
    server: gpusched_testkit::PrivatePostgres,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl PrivatePostgres {
    /// Creates the cluster in `dir` and starts it.
    pub async fn create(dir: &Path) -> Result<Self> {
        let defaults = PostgresOptions::default();
        let opts = PostgresOptions {
            bin: std::env::var_os("LOADTEST_PG_BIN").map_or(defaults.bin, PathBuf::from),
            max_connections: 200,
            shared_buffers: None,
        };
        let dir = dir.to_path_buf();
        let server = blocking(move || gpusched_testkit::PrivatePostgres::start_in(&dir, &opts))
            .await
            .context("a private Postgres")?;
        Ok(PrivatePostgres {
            port: server.port(),
            server,
        })
    }

    /// Connection URL of its `postgres` database.
    pub fn url(&self) -> String {
        self.server.url("postgres")
    }

    /// Its server log.
    pub fn log_file(&self) -> &Path {
        self.server.log_file()
    }

    /// Starts the server and waits until it accepts connections.
    pub async fn start(&self) -> Result<()> {
        let ctl = self.server.control();
        blocking(move || ctl.start()).await
    }

    /// Stops the server (`fast`: sessions are ended, a clean shutdown).
    pub async fn stop(&self) -> Result<()> {
        let ctl = self.server.control();
        blocking(move || ctl.stop(StopMode::Fast)).await
    }

    /// Restarts the server (fast shutdown, then start) and waits for it.
    pub async fn restart(&self) -> Result<()> {
        let ctl = self.server.control();
        blocking(move || ctl.restart()).await
    }
}

/// The directory of the service binaries: `hint`, or the one this
/// executable is in (or its parent, for a test binary in `deps/`), built
/// with cargo where one is missing.
pub fn service_binaries(hint: Option<&Path>) -> Result<PathBuf> {
    let dir = match hint {
        Some(h) => h.to_path_buf(),
        None => std::env::current_exe()
            .context("locating the loadtest executable")?
            .parent()
            .map(Path::to_path_buf)
            .context("the loadtest executable has no directory")?,
    };
    Ok(gpusched_stack::service_binaries(
        &dir,
        gpusched_stack::Build::IfMissing,
    )?)
}

/// A private `nats-server -js` on its own port and store directory;
/// killed and its directory removed when dropped.
#[derive(Debug)]
pub struct PrivateNats {
    // Shared with the blocking task of a start or a stop in flight.
    server: Arc<Mutex<gpusched_testkit::PrivateNats>>,
    log: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl PrivateNats {
    /// Starts a server with its store in `dir/store`, logging to `dir/nats-server.log`.
    pub async fn create(dir: &Path) -> Result<Self> {
        let server = gpusched_testkit::PrivateNats::new_in(dir).context("a private nats-server")?;
        let mut n = PrivateNats {
            port: server.port(),
            log: server.log_file().to_path_buf(),
            server: Arc::new(Mutex::new(server)),
        };
        n.start().await?;
        Ok(n)
    }

    /// Runs `f` on the server on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut gpusched_testkit::PrivateNats) -> std::io::Result<T> + Send + 'static,
    ) -> Result<T> {
        let server = self.server.clone();
        blocking(move || {
            let mut s = server
                .lock()
                .map_err(|_| std::io::Error::other("the nats-server lock is poisoned"))?;
            f(&mut s)
        })
        .await
    }

    /// Its client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its server log (every start appends).
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// Starts the server (with whatever the store holds) and waits until it
    /// accepts connections.
    pub async fn start(&mut self) -> Result<()> {
        self.with(|s| s.start()).await
    }

    /// The server, locked (for the quick operations: no await).
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, gpusched_testkit::PrivateNats>> {
        self.server
            .lock()
            .map_err(|_| anyhow::anyhow!("the nats-server lock is poisoned"))
    }

    /// SIGKILLs the server (its store stays as the kill left it).
    pub fn kill(&mut self) -> Result<()> {
        Ok(self.lock()?.kill()?)
    }

    /// Stops the server with SIGTERM (SIGKILL after 10 s).
    pub async fn stop(&mut self) -> Result<()> {
        self.with(|s| s.stop()).await
    }

    /// Removes the store (streams, consumers, messages). Only while stopped.
    pub fn wipe(&self) -> Result<()> {
        Ok(self.lock()?.wipe()?)
    }
}

/// Both private servers under one temporary directory.
#[derive(Debug)]
pub struct Infra {
    // Fields drop in this order: both servers stop (each removing its own
    // directory), then the run's directory goes.
    /// Postgres.
    pub pg: PrivatePostgres,
    /// nats-server.
    pub nats: PrivateNats,
    root: DirGuard,
}

impl Infra {
    /// Creates the directory and starts both servers; on error nothing is
    /// left behind.
    pub async fn start() -> Result<Infra> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let root = std::env::temp_dir().join(format!("gpusched-chaos-{}", &id[..12]));
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        // Declared first, dropped last: after a server started here.
        let root = DirGuard(root);
        let pg = PrivatePostgres::create(&root.0.join("pg")).await?;
        let nats = PrivateNats::create(&root.0.join("nats")).await?;
        Ok(Infra { pg, nats, root })
    }

    /// The run's temporary directory (removed on drop).
    pub fn root(&self) -> &Path {
        &self.root.0
    }

    /// Copies both servers' logs into `dir`.
    pub fn copy_logs(&self, dir: &Path) {
        let _ = std::fs::copy(self.pg.log_file(), dir.join("postgres.log"));
        let _ = std::fs::copy(self.nats.log_file(), dir.join("nats-server.log"));
    }
}

/// Removes a directory on drop.
#[derive(Debug)]
struct DirGuard(PathBuf);

impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sqlx::Connection;

    async fn select_one(url: &str) -> bool {
        match sqlx::PgConnection::connect(url).await {
            Ok(mut c) => sqlx::query_scalar::<_, i32>("SELECT 1")
                .fetch_one(&mut c)
                .await
                .is_ok_and(|v| v == 1),
            Err(_) => false,
        }
    }

    /// Both servers start, survive their faults, and leave nothing behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn private_servers_restart_and_vanish_on_drop() {
        let mut infra = Infra::start().await.unwrap();
        let root = infra.root().to_path_buf();
        let (pg_port, nats_port) = (infra.pg.port, infra.nats.port);
        assert!(pg_port != 5432 && nats_port != 4222);
        assert!(select_one(&infra.pg.url()).await);
        infra.pg.restart().await.unwrap();
        assert!(select_one(&infra.pg.url()).await);
        infra.pg.stop().await.unwrap();
        assert!(!select_one(&infra.pg.url()).await);
        infra.pg.start().await.unwrap();
        assert!(select_one(&infra.pg.url()).await);
        infra.nats.kill().unwrap();
        infra.nats.wipe().unwrap();
        infra.nats.start().await.unwrap();
        assert!(gpusched_bus::async_nats::connect(infra.nats.url())
            .await
            .is_ok());
        drop(infra);
        assert!(!root.exists(), "{} left behind", root.display());
        assert!(std::net::TcpStream::connect(("127.0.0.1", pg_port)).is_err());
        assert!(std::net::TcpStream::connect(("127.0.0.1", nats_port)).is_err());
    }
}
