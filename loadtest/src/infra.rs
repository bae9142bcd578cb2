//! Private infrastructure for fault injection: a Postgres 15 cluster and a
//! `nats-server` with JetStream, each on a free port with its data under
//! one temporary directory of this run, which the chaos run restarts,
//! stops, kills and wipes at will.
//!
//! Postgres' tools refuse to run as root, so when this process is root
//! they run as the `postgres` OS user (`runuser`), in a directory owned by
//! it. Authentication is `trust`, on 127.0.0.1 and a socket in the run's
//! directory only; `fsync` is off (the faults here stop and kill servers,
//! never the machine, so the page cache keeps every commit).
//!
//! Owns: the temporary directory, both server processes, their ports,
//! data and logs, and every operation on them (restart, stop for a while,
//! SIGKILL, wipe).
//!
//! Must never: touch the shared servers (5432, 4222) or any directory but
//! its own, or leave a process or a directory behind: [`Infra`]'s `Drop`
//! stops both servers and removes the directory, on the error and panic
//! paths too.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Where Postgres 15's programs are, unless `LOADTEST_PG_BIN` says otherwise.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A free TCP port on 127.0.0.1 (released before it is used; a clash shows
/// as a server that fails to start).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr().context("finding a free port")?.port())
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Numeric id of an OS user or its group (`id -u` / `id -g`).
fn os_id(flag: &str, user: &str) -> Result<u32> {
    let out = Command::new("id")
        .args([flag, user])
        .output()
        .with_context(|| format!("running id {flag} {user}"))?;
    if !out.status.success() {
        bail!("no OS user {user} (needed to run Postgres' tools as non-root)");
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .with_context(|| format!("id {flag} {user}: not a number"))
}

/// A private Postgres cluster: `initdb` into the run's directory, started
/// with `pg_ctl` on its own port and socket directory.
#[derive(Debug)]
pub struct PrivatePostgres {
    bin: PathBuf,
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    as_postgres: bool,
}

impl PrivatePostgres {
    /// Creates the cluster in `dir` (which must not exist) and starts it.
    pub async fn create(dir: &Path) -> Result<Self> {
        let bin = std::env::var_os("LOADTEST_PG_BIN")
            .map_or_else(|| PathBuf::from(PG_BIN), PathBuf::from);
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let as_postgres = running_as_root();
        if as_postgres {
            let (uid, gid) = (os_id("-u", "postgres")?, os_id("-g", "postgres")?);
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .with_context(|| format!("chown postgres {}", dir.display()))?;
        }
        let pg = PrivatePostgres {
            data: dir.join("data"),
            log: dir.join("postgres.log"),
            dir: dir.to_path_buf(),
            bin,
            port: free_port()?,
            as_postgres,
        };
        let data = pg.data.display().to_string();
        pg.tool(
            "initdb",
            &[
                "-D",
                &data,
                "--auth=trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )
        .await?;
        pg.start().await?;
        Ok(pg)
    }

    /// Connection URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Its server log.
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    fn command(&self, tool: &str, args: &[&str]) -> tokio::process::Command {
        let program = self.bin.join(tool);
        let mut c = if self.as_postgres {
            let mut c = tokio::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            tokio::process::Command::new(program)
        };
        c.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    async fn tool(&self, tool: &str, args: &[&str]) -> Result<()> {
        let out = self
            .command(tool, args)
            .output()
            .await
            .with_context(|| format!("running {tool}"))?;
        if !out.status.success() {
            bail!(
                "{tool} {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn server_options(&self) -> String {
        format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200",
            self.port,
            self.dir.display()
        )
    }

    fn pg_ctl_args(&self, action: &str) -> Vec<String> {
        vec![
            "-D".into(),
            self.data.display().to_string(),
            "-l".into(),
            self.log.display().to_string(),
            "-w".into(),
            "-t".into(),
            "60".into(),
            "-o".into(),
            self.server_options(),
            action.into(),
        ]
    }

    async fn pg_ctl(&self, action: &str, extra: &[&str]) -> Result<()> {
        let mut args = self.pg_ctl_args(action);
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.tool("pg_ctl", &refs).await
    }

    /// Starts the server and waits until it accepts connections.
    pub async fn start(&self) -> Result<()> {
        self.pg_ctl("start", &[]).await
    }

    /// Stops the server (`fast`: sessions are ended, a clean shutdown).
    pub async fn stop(&self) -> Result<()> {
        self.pg_ctl("stop", &["-m", "fast"]).await
    }

    /// Restarts the server (fast shutdown, then start) and waits for it.
    pub async fn restart(&self) -> Result<()> {
        self.pg_ctl("restart", &["-m", "fast"]).await
    }

    /// Stops the server at once and for good (Drop): `pg_ctl stop -m
    /// immediate`, then SIGKILL of the postmaster if it is still there.
    fn shut_down_now(&self) {
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(self.bin.join("pg_ctl"));
            c
        } else {
            Command::new(self.bin.join("pg_ctl"))
        };
        let _ = c
            .args([
                "-D",
                &self.data.display().to_string(),
                "-m",
                "immediate",
                "-w",
                "-t",
                "20",
                "stop",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let pid_file = self.data.join("postmaster.pid");
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            if let Some(pid) = text
                .lines()
                .next()
                .and_then(|l| l.trim().parse::<u32>().ok())
            {
                signal_pid(pid, "KILL");
            }
        }
    }
}

pub use gpusched_stack::signal_pid;

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

/// A private `nats-server -js` on its own port and store directory.
#[derive(Debug)]
pub struct PrivateNats {
    store: PathBuf,
    log: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
}

impl PrivateNats {
    /// Starts a server with its store in `dir/store`, logging to `dir/nats-server.log`.
    pub async fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut n = PrivateNats {
            store: dir.join("store"),
            log: dir.join("nats-server.log"),
            port: free_port()?,
            child: None,
        };
        n.start().await?;
        Ok(n)
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
        if self.child.is_some() {
            bail!("nats-server is already running");
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let err = out.try_clone().context("nats-server log")?;
        let child = gpusched_bus::testing::nats_server_command(self.port, &self.store)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .context("starting nats-server")?;
        self.child = Some(child);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    self.child = None;
                    bail!(
                        "nats-server exited at start ({st}); see {}",
                        self.log.display()
                    );
                }
            }
            if Instant::now() > deadline {
                bail!("nats-server did not listen on {} in 30 s", self.port);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs the server (its store stays as the kill left it).
    pub fn kill(&mut self) -> Result<()> {
        let mut c = self.child.take().context("nats-server is not running")?;
        c.kill().context("SIGKILL nats-server")?;
        let _ = c.wait();
        Ok(())
    }

    /// Stops the server with SIGTERM (SIGKILL after 10 s).
    pub async fn stop(&mut self) -> Result<()> {
        let mut c = self.child.take().context("nats-server is not running")?;
        signal_pid(c.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = c.kill();
        let _ = c.wait();
        Ok(())
    }

    /// Removes the store (streams, consumers, messages). Only while stopped.
    pub fn wipe(&self) -> Result<()> {
        if self.child.is_some() {
            bail!("wipe: nats-server is running");
        }
        match std::fs::remove_dir_all(&self.store) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", self.store.display())),
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Both private servers under one temporary directory.
#[derive(Debug)]
pub struct Infra {
    root: PathBuf,
    /// Postgres.
    pub pg: PrivatePostgres,
    /// nats-server.
    pub nats: PrivateNats,
}

impl Infra {
    /// Creates the directory and starts both servers; on error nothing is
    /// left behind.
    pub async fn start() -> Result<Infra> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let root = std::env::temp_dir().join(format!("gpusched-chaos-{}", &id[..12]));
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let guard = DirGuard(Some(root.clone()));
        let pg = PrivatePostgres::create(&root.join("pg")).await?;
        let mut pg_guard = PgGuard(Some(pg));
        let nats = PrivateNats::create(&root.join("nats")).await?;
        let pg = pg_guard.0.take().context("the private Postgres")?;
        guard.release();
        Ok(Infra { root, pg, nats })
    }

    /// The run's temporary directory (removed on drop).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Copies both servers' logs into `dir`.
    pub fn copy_logs(&self, dir: &Path) {
        let _ = std::fs::copy(self.pg.log_file(), dir.join("postgres.log"));
        let _ = std::fs::copy(self.nats.log_file(), dir.join("nats-server.log"));
    }
}

impl Drop for Infra {
    fn drop(&mut self) {
        if let Some(mut c) = self.nats.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.pg.shut_down_now();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Removes a directory on drop unless released.
struct DirGuard(Option<PathBuf>);

impl DirGuard {
    fn release(mut self) {
        self.0 = None;
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Stops a Postgres on drop unless taken.
struct PgGuard(Option<PrivatePostgres>);

impl Drop for PgGuard {
    fn drop(&mut self) {
        if let Some(pg) = self.0.take() {
            pg.shut_down_now();
        }
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
