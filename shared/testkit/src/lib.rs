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

/// Removes from `cmd`'s environment what cargo sets for the test process
/// that runs it (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, `CARGO_BIN_EXE_*`,
/// `OUT_DIR`, ...), so that the command sees what a terminal would. A cargo
/// started by a test needs this: build scripts that watch such a variable
/// (ring's watches `CARGO_MANIFEST_DIR`) would otherwise see it change and
/// recompile half the workspace, which the next plain `cargo test` then
/// recompiles back. User settings (`CARGO_HOME`, `CARGO_TARGET_DIR`,
/// `CARGO_PROFILE_*`, ...) stay.
pub fn outside_cargo(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if set_by_cargo_for_a_test(name) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Whether `name` is one of the variables cargo sets for a crate it
/// compiles or a test it runs (not one a user sets to configure cargo).
fn set_by_cargo_for_a_test(name: &str) -> bool {
    const NAMES: [&str; 10] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "CARGO_SBOM_PATH",
        "OUT_DIR",
    ];
    NAMES.contains(&name) || name.starts_with("CARGO_PKG_") || name.starts_with("CARGO_BIN_EXE_")
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
    fn only_what_cargo_sets_for_a_test_is_removed() {
        // Run by cargo test, this process has the variables itself.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let mut cmd = Command::new("env");
        outside_cargo(&mut cmd);
        let removed: Vec<String> = cmd
            .get_envs()
            .filter(|(_, v)| v.is_none())
            .filter_map(|(k, _)| k.to_str().map(str::to_string))
            .collect();
        assert!(removed.iter().any(|k| k == "CARGO_MANIFEST_DIR"));
        assert!(removed.iter().any(|k| k.starts_with("CARGO_PKG_")));
        for kept in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_PROFILE_DEV_DEBUG",
            "PATH",
        ] {
            assert!(!set_by_cargo_for_a_test(kept), "{kept}");
        }
    }

    #[test]
    fn temp_paths_differ() {
        assert_ne!(unique_temp_path("x"), unique_temp_path("x"));
    }
}
