//! Test support: a private nats-server that a test may kill and restart,
//! so fault tests never touch the shared server on 4222.
//!
//! Owns: [`NatsServer`], nats-server with JetStream on a free port and its
//! own store directory, and the command line that starts one
//! ([`nats_server_command`], also used by the load test's servers).
//!
//! Must never: leave a process or directory behind (it is killed and
//! removed on drop, also when a test panics).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The command that runs nats-server with JetStream on 127.0.0.1:`port`,
/// keeping its streams in `store`.
pub fn nats_server_command(port: u16, store: &Path) -> Command {
    let mut c = Command::new("nats-server");
    c.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store);
    c
}

/// A private nats-server ([`nats_server_command`]), killed on drop.
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
            .expect("a free port")
            .local_addr()
            .expect("a free port")
            .port();
        let store = std::env::temp_dir().join(format!(
            "gpusched-nats-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&store).expect("a store directory");
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

    /// Its client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (keeping what its store holds) and waits until it
    /// accepts connections.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = nats_server_command(self.port, &self.store)
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
            std::fs::remove_dir_all(&self.store).expect("emptying the store");
            std::fs::create_dir_all(&self.store).expect("a store directory");
        }
        self.start();
    }
}

impl Default for NatsServer {
    fn default() -> Self {
        NatsServer::new()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}
