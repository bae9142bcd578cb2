//! A nats-server with JetStream of a test's own: 127.0.0.1 at a free port,
//! its streams in a store directory of its own, its output appended to a
//! log beside the store, so fault tests never touch the shared server on
//! 4222 and may kill, stop, wipe and start it again.
//!
//! Owns: the server's directory (store and log), its process, and every
//! operation on it (start, SIGKILL, SIGTERM, wipe).
//!
//! Must never: leave the process or its directory behind (drop kills it
//! and removes the directory, also when a test panics), or touch a server
//! or directory it did not create.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::context;

/// How long [`PrivateNats::start`] waits for the server to listen.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`PrivateNats::stop`] waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The command that runs nats-server with JetStream on 127.0.0.1:`port`,
/// keeping its streams in `store`.
pub fn nats_server_command(port: u16, store: &Path) -> Command {
    let mut c = Command::new("nats-server");
    c.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store);
    c
}

/// A private nats-server ([`nats_server_command`]); killed and its
/// directory removed when dropped.
#[derive(Debug)]
pub struct PrivateNats {
    port: u16,
    dir: PathBuf,
    store: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl PrivateNats {
    /// Picks a free port and a fresh directory under the temp directory;
    /// starts nothing.
    pub fn new() -> io::Result<PrivateNats> {
        PrivateNats::new_in(&crate::unique_temp_path("gpusched-nats"))
    }

    /// Picks a free port and takes `dir` (created; removed on drop) for the
    /// store (`dir/store`) and the log (`dir/nats-server.log`); starts
    /// nothing.
    pub fn new_in(dir: &Path) -> io::Result<PrivateNats> {
        let port = crate::free_port()?;
        std::fs::create_dir_all(dir)
            .map_err(|e| context(format!("creating {}", dir.display()), e))?;
        Ok(PrivateNats {
            port,
            store: dir.join("store"),
            log: dir.join("nats-server.log"),
            dir: dir.to_path_buf(),
            child: None,
        })
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its directory (store and log; removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its server log (every start appends).
    pub fn log_file(&self) -> &Path {
        &self.log
    }

    /// Whether this value started the server and has not killed or stopped
    /// it since (a server that exited by itself counts until then).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the server (with whatever its store holds) and waits (up to
    /// [`START_TIMEOUT`]) until it accepts connections; a server that exits
    /// meanwhile is an error naming its log.
    pub fn start(&mut self) -> io::Result<()> {
        if self.child.is_some() {
            return Err(io::Error::other("nats-server is already running"));
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| context(format!("opening {}", self.log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| context("the nats-server log", e))?;
        let child = nats_server_command(self.port, &self.store)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| context("starting nats-server (is it installed?)", e))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    self.child = None;
                    return Err(io::Error::other(format!(
                        "nats-server exited at start ({st}); see {}",
                        self.log.display()
                    )));
                }
            }
            if Instant::now() > deadline {
                self.kill_now();
                return Err(io::Error::other(format!(
                    "nats-server did not listen on {} in {} s; see {}",
                    self.port,
                    START_TIMEOUT.as_secs(),
                    self.log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs the server and waits for it to be gone (its store stays as
    /// the kill left it). An error when it is not running.
    pub fn kill(&mut self) -> io::Result<()> {
        let mut c = self
            .child
            .take()
            .ok_or_else(|| io::Error::other("nats-server is not running"))?;
        c.kill().map_err(|e| context("SIGKILL nats-server", e))?;
        let _ = c.wait();
        Ok(())
    }

    /// Stops the server with SIGTERM and waits for it (SIGKILL after
    /// [`STOP_GRACE`]). An error when it is not running.
    pub fn stop(&mut self) -> io::Result<()> {
        let mut c = self
            .child
            .take()
            .ok_or_else(|| io::Error::other("nats-server is not running"))?;
        crate::signal_pid(c.id(), "TERM");
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        Ok(())
    }

    /// Removes the store (streams, consumers, messages). Only while stopped.
    pub fn wipe(&self) -> io::Result<()> {
        if self.child.is_some() {
            return Err(io::Error::other("wipe: nats-server is running"));
        }
        match std::fs::remove_dir_all(&self.store) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(context(format!("removing {}", self.store.display()), e)),
        }
    }

    /// SIGKILLs the server if it runs; never fails (for drop).
    fn kill_now(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.kill_now();
        crate::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listening(port: u16) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }

    /// Killed, wiped, stopped and started again; nothing left on drop.
    #[test]
    fn survives_its_faults_and_vanishes_on_drop() -> io::Result<()> {
        let mut n = PrivateNats::new()?;
        let (port, dir) = (n.port(), n.dir().to_path_buf());
        assert_ne!(port, 4222);
        assert!(!listening(port));
        n.start()?;
        assert!(listening(port) && n.is_running());
        assert!(n.start().is_err(), "a second start");
        assert!(n.wipe().is_err(), "a wipe while running");
        n.kill()?;
        assert!(!listening(port));
        assert!(n.kill().is_err(), "a kill of nothing");
        n.wipe()?;
        n.start()?;
        n.stop()?;
        assert!(!listening(port));
        n.start()?;
        assert!(n.log_file().exists());
        drop(n);
        assert!(!listening(port));
        assert!(!dir.exists(), "{} left behind", dir.display());
        Ok(())
    }
}
