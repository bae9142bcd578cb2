//! A Postgres server of a test's own: a fresh cluster (`initdb`) in a
//! directory of its own, listening on 127.0.0.1 at a free port and on a
//! socket in that directory, started and stopped with `pg_ctl`.
//! Authentication is `trust`; `fsync` is off (the faults stop and kill the
//! server, never the machine, so the page cache keeps every commit).
//!
//! Postgres' tools refuse to run as root, so when this process is root they
//! run as the `postgres` OS user (`runuser`), in a directory owned by it.
//!
//! Owns: the cluster's directory (data, log, socket), the server process,
//! and every operation on it (start, stop fast or immediate, restart).
//!
//! Must never: leave the server running or its directory behind (drop
//! stops it immediately, SIGKILLs the postmaster if that fails, and
//! removes the directory, also when a test panics or setup fails), or
//! touch a server or directory it did not create.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::context;

/// Where the PostgreSQL server programs are unless `GPUSCHED_PG_BIN` says.
pub const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// How [`PrivatePostgres::stop`] shuts the server down (`pg_ctl -m`).
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

/// How the server is set up.
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// The directory of `initdb` and `pg_ctl`.
    pub bin: PathBuf,
    /// `max_connections`.
    pub max_connections: u32,
    /// `shared_buffers` (`None`: Postgres' default).
    pub shared_buffers: Option<String>,
}

impl Default for PostgresOptions {
    /// `GPUSCHED_PG_BIN` (else [`DEFAULT_PG_BIN`]), 50 connections, 16 MB of
    /// shared buffers: enough for a test's pools, small beside the shared
    /// server.
    fn default() -> Self {
        PostgresOptions {
            bin: std::env::var_os("GPUSCHED_PG_BIN")
                .map_or_else(|| PathBuf::from(DEFAULT_PG_BIN), PathBuf::from),
            max_connections: 50,
            shared_buffers: Some("16MB".into()),
        }
    }
}

/// A private Postgres server; stopped (immediately) and its directory
/// removed when dropped.
#[derive(Debug)]
pub struct PrivatePostgres {
    ctl: PgControl,
}

/// What it takes to run `pg_ctl` on a [`PrivatePostgres`]: cheap to clone
/// and `'static`, so an async caller can move it into a blocking task. It
/// does not own the server; dropping it does nothing.
#[derive(Clone, Debug)]
pub struct PgControl {
    bin: PathBuf,
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    as_postgres: bool,
    settings: String,
}

impl PrivatePostgres {
    /// Creates the cluster in a fresh directory under the temp directory
    /// and starts it. Blocks (a few seconds).
    pub fn start(opts: &PostgresOptions) -> io::Result<PrivatePostgres> {
        PrivatePostgres::start_in(&crate::unique_temp_path("gpusched-private-pg"), opts)
    }

    /// Creates the cluster in `dir` (created; removed on drop) and starts
    /// it. Blocks (a few seconds). On error nothing is left behind.
    pub fn start_in(dir: &Path, opts: &PostgresOptions) -> io::Result<PrivatePostgres> {
        std::fs::create_dir_all(dir)
            .map_err(|e| context(format!("creating {}", dir.display()), e))?;
        let port = crate::free_port()?;
        let mut settings = format!(
            "-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c fsync=off -c full_page_writes=off -c max_connections={}",
            dir.display(),
            opts.max_connections
        );
        if let Some(b) = &opts.shared_buffers {
            settings.push_str(&format!(" -c shared_buffers={b}"));
        }
        // From here on, drop stops what runs and removes the directory.
        let pg = PrivatePostgres {
            ctl: PgControl {
                bin: opts.bin.clone(),
                data: dir.join("data"),
                log: dir.join("postgres.log"),
                dir: dir.to_path_buf(),
                port,
                as_postgres: running_as_root(),
                settings,
            },
        };
        if pg.ctl.as_postgres {
            run(Command::new("chown").arg("postgres").arg(dir))?;
        }
        let data = pg.ctl.data.display().to_string();
        run(pg.ctl.command("initdb").args([
            "-D",
            &data,
            "--auth=trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ]))?;
        pg.ctl.start()?;
        Ok(pg)
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.ctl.port
    }

    /// A URL for `database` on this server, as user `postgres`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.ctl.port)
    }

    /// Its directory (data, log, socket; removed on drop).
    pub fn dir(&self) -> &Path {
        &self.ctl.dir
    }

    /// Its server log (every start appends).
    pub fn log_file(&self) -> &Path {
        &self.ctl.log
    }

    /// The server's log so far (for failure messages; empty if unreadable).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(&self.ctl.log).unwrap_or_default()
    }

    /// A handle that runs `pg_ctl` on this server from anywhere (a
    /// blocking task); valid while this value lives.
    pub fn control(&self) -> PgControl {
        self.ctl.clone()
    }

    /// Starts the stopped server again (same data, same port) and waits
    /// until it accepts connections.
    pub fn start_again(&self) -> io::Result<()> {
        self.ctl.start()
    }

    /// Stops the server and waits until it is down.
    pub fn stop(&self, mode: StopMode) -> io::Result<()> {
        self.ctl.stop(mode)
    }

    /// Restarts the server (fast shutdown, then start) and waits for it.
    pub fn restart(&self) -> io::Result<()> {
        self.ctl.restart()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.ctl.kill();
        crate::remove_dir(&self.ctl.dir);
    }
}

impl PgControl {
    /// A command running server program `tool` as the right OS user.
    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        c.current_dir(&self.dir).stdin(Stdio::null());
        c
    }

    /// `pg_ctl -D data -l log -w -t 60 -o settings <action> [extra]`.
    fn pg_ctl(&self, action: &str, extra: &[&str]) -> io::Result<()> {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "60", "-o", &self.settings, action])
            .args(extra))
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start(&self) -> io::Result<()> {
        self.pg_ctl("start", &[])
    }

    /// Stops the server and waits until it is down.
    pub fn stop(&self, mode: StopMode) -> io::Result<()> {
        self.pg_ctl("stop", &["-m", mode.as_arg()])
    }

    /// Restarts the server (fast shutdown, then start) and waits for it.
    pub fn restart(&self) -> io::Result<()> {
        self.pg_ctl("restart", &["-m", "fast"])
    }

    /// Stops the server however it can, without failing (for drop):
    /// `pg_ctl stop -m immediate`, then SIGKILL of the postmaster if it is
    /// still there.
    fn kill(&self) {
        let stopped = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "10", "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let pid_file = self.data.join("postmaster.pid");
        if stopped.is_ok_and(|s| s.success()) || !pid_file.exists() {
            return;
        }
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()));
        if let Some(pid) = pid {
            crate::signal_pid(pid, "KILL");
        }
    }
}

/// Runs a setup command; an error with its output when it fails.
fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd
        .output()
        .map_err(|e| context(format!("cannot run {cmd:?}"), e))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{cmd:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// True when this process runs as root (`/proc/self` belongs to its user).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listening(port: u16) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }

    /// Stopped both ways, started again, restarted; nothing left on drop.
    #[test]
    fn stops_starts_and_vanishes_on_drop() -> io::Result<()> {
        let pg = PrivatePostgres::start(&PostgresOptions::default())?;
        let (port, dir) = (pg.port(), pg.dir().to_path_buf());
        assert_ne!(port, 5432);
        assert!(listening(port));
        assert!(pg.url("x").ends_with(&format!(":{port}/x")));
        pg.stop(StopMode::Fast)?;
        assert!(!listening(port));
        pg.start_again()?;
        pg.stop(StopMode::Immediate)?;
        let ctl = pg.control();
        std::thread::spawn(move || ctl.start())
            .join()
            .map_err(|_| io::Error::other("the start thread panicked"))??;
        pg.restart()?;
        assert!(listening(port));
        assert!(!pg.server_log().is_empty());
        drop(pg);
        assert!(!listening(port));
        assert!(!dir.exists(), "{} left behind", dir.display());
        Ok(())
    }

    /// A setup failure leaves no directory.
    #[test]
    fn a_failed_start_leaves_nothing() {
        let dir = crate::unique_temp_path("gpusched-private-pg-broken");
        let opts = PostgresOptions {
            bin: PathBuf::from("/nonexistent"),
            ..PostgresOptions::default()
        };
        assert!(PrivatePostgres::start_in(&dir, &opts).is_err());
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
