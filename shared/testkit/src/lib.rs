//! The one place for test infrastructure that is no gpusched code: a free
//! TCP port ([`free_port`]), a private Postgres server ([`postgres`]) and a
//! private nats-server with JetStream ([`nats`]), each on its own port with
//! its own directory, which fault tests (and the load test's chaos run)
//! stop, kill, wipe and start again. The store's and the bus's `testing`
//! modules, the load test's `infra` and the process stack build on it.
//!
//! Owns: picking ports, the private servers' processes and directories, and
//! removing both on drop (on the panic and error paths too).
//!
//! Must never: depend on a gpusched crate (everything may depend on this
//! one), touch the shared servers (5432, 4222) or any directory it did not
//! create, or panic: every failure is an [`std::io::Error`] that says what
//! was being done; the callers decide whether to panic (tests) or report
//! (the load test).

pub mod nats;
pub mod postgres;

pub use nats::PrivateNats;
pub use postgres::{PostgresOptions, PrivatePostgres, StopMode};

use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it).
/// It is released before it is used: a clash shows as a server that fails
/// to start.
pub fn free_port() -> io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| context("finding a free port", e))?;
    Ok(l.local_addr()
        .map_err(|e| context("finding a free port", e))?
        .port())
}

/// Sends `kill -<sig>` (e.g. `TERM`, `KILL`, `STOP`, `CONT`) to a process
/// id; whether it was delivered.
pub fn signal_pid(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A path under the temp directory no other call of this process (nor,
/// by its pid and clock, of another one) returns: `<tmp>/<prefix>-...`.
/// Nothing is created.
pub fn unique_temp_path(prefix: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!(
        "{prefix}-{}-{nanos:09}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// `cause`, prefixed with what was being done.
pub(crate) fn context(what: impl std::fmt::Display, cause: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {cause}"))
}

/// Removes `dir` and what it holds; a warning on stderr if that fails
/// (for drop, which cannot fail).
pub(crate) fn remove_dir(dir: &std::path::Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => eprintln!("warning: could not remove {}: {e}", dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_can_be_bound() -> io::Result<()> {
        let port = free_port()?;
        assert_ne!(port, 0);
        std::net::TcpListener::bind(("127.0.0.1", port))?;
        Ok(())
    }

    #[test]
    fn temp_paths_differ() {
        assert_ne!(unique_temp_path("x"), unique_temp_path("x"));
    }
}
