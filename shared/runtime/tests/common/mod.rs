//! Helpers for the runtime's integration tests: a private nats-server
//! they can kill, and (`stage`) a deciding service's workload over the
//! embedded log.
//!
//! Owns: [`NatsServer`], a nats-server with JetStream on a free port and
//! its own store directory, and [`Timings`], a record of how long calls
//! took against what they were allowed. Must never: touch the shared
//! server on 4222, or leave a process or directory behind (the guard kills
//! and removes them on drop, also when a test panics).
#![allow(dead_code, clippy::unwrap_used, missing_docs)]

pub mod stage;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A private nats-server (`-js -p <port> -sd <dir>`), killed on drop.
pub struct NatsServer {
    port: u16,
    store: PathBuf,
    child: Option<Child>,
}

impl NatsServer {
    /// Picks a free port and a fresh store directory; starts nothing.
    pub fn new() -> NatsServer {
        static N: AtomicU64 = AtomicU64::new(0);
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let store = std::env::temp_dir().join(format!(
            "gpusched-bus-faults-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&store).unwrap();
        NatsServer {
            port,
            store,
            child: None,
        }
    }

    /// A new server, started.
    pub fn started() -> NatsServer {
        let mut s = NatsServer::new();
        s.start();
        s
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (keeping what its store holds) and waits until it
    /// accepts connections.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("nats-server")
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server must be installed");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs the server and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again, first emptying its store if `wipe` (so the
    /// streams and consumers are gone).
    pub fn restart(&mut self, wipe: bool) {
        self.kill();
        if wipe {
            std::fs::remove_dir_all(&self.store).unwrap();
            std::fs::create_dir_all(&self.store).unwrap();
        }
        self.start();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// How long calls took against what each was allowed.
#[derive(Debug, Default)]
pub struct Timings {
    pub calls: u64,
    /// Calls that took longer than allowed + slack: (allowed, took).
    pub overruns: Vec<(Duration, Duration)>,
    /// The most any call took beyond what it was allowed.
    pub max_excess: Duration,
}

impl Timings {
    /// Records a call allowed `allowed` that took `took`.
    pub fn record(&mut self, allowed: Duration, took: Duration, slack: Duration) {
        self.calls += 1;
        self.max_excess = self.max_excess.max(took.saturating_sub(allowed));
        if took > allowed + slack {
            self.overruns.push((allowed, took));
        }
    }
}
