//! Test support: a private nats-server that a test may kill and restart,
//! so fault tests never touch the shared server on 4222. It is the one
//! launcher in `gpusched_testkit` ([`gpusched_testkit::PrivateNats`]), with
//! a test's panics.
//!
//! Owns: [`NatsServer`], the panicking face of the private server (the
//! launcher owns its process, port and store directory).
//!
//! Must never: launch a server itself (that is `gpusched_testkit`'s), be
//! used outside tests (it panics on failure), or leave a process or
//! directory behind (the launcher kills and removes them on drop, also
//! when a test panics).

#![allow(clippy::panic)]

/// A private nats-server with JetStream on a free port and its own store
/// directory, killed and removed on drop.
pub struct NatsServer {
    server: gpusched_testkit::PrivateNats,
}

/// The value, or a panic naming what failed.
fn must<T>(what: &str, r: std::io::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

impl NatsServer {
    /// Picks a free port and a fresh store directory; starts nothing.
    pub fn new() -> NatsServer {
        NatsServer {
            server: must(
                "a private nats-server",
                gpusched_testkit::PrivateNats::new(),
            ),
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
        self.server.url()
    }

    /// Starts the server (keeping what its store holds) and waits until it
    /// accepts connections.
    pub fn start(&mut self) {
        must("starting the private nats-server", self.server.start());
    }

    /// SIGKILLs the server (if it runs) and waits for it to be gone.
    pub fn kill(&mut self) {
        if self.server.is_running() {
            must("killing the private nats-server", self.server.kill());
        }
    }

    /// Starts the server again, first emptying its store if `wipe` (so the
    /// streams and consumers are gone).
    pub fn restart(&mut self, wipe: bool) {
        self.kill();
        if wipe {
            must("emptying the store", self.server.wipe());
        }
        self.start();
    }
}

impl Default for NatsServer {
    fn default() -> Self {
        NatsServer::new()
    }
}
