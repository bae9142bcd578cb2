//! The agent binary's probes, as a kubelet sees them: a real
//! `gpusched-agent node` and `gpusched-agent relay` with `--health-listen`,
//! over a private nats-server this test kills and starts again (never the
//! shared one).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpusched_bus::testing::NatsServer;

fn free_addr() -> SocketAddr {
    let port = gpusched_testkit::free_port().expect("a free port");
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `GET path`: (status, body); (0, "") when nothing answers.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

/// Polls until `path` answers `code`; the last answer.
fn wait_for(addr: SocketAddr, path: &str, code: u16, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (c, body) = get(addr, path);
        if c == code {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {path} answered {c}: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sigterm(child: &mut Killed) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            return s;
        }
        assert!(Instant::now() < deadline, "no exit within 15 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_node_agent_is_ready_only_while_it_reaches_nats() {
    let mut nats = NatsServer::started();
    let dir = tempfile::tempdir().expect("tempdir");
    let health = free_addr();
    let mut agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_gpusched-agent"))
            .args([
                "node", "--name", "probe-1", "--flavor", "h100-80g", "--gpus", "0,1",
            ])
            .arg("--state-dir")
            .arg(dir.path())
            .args(["--heartbeat-s", "0.3", "--nats-url", &nats.url()])
            .args([
                "--namespace",
                "probe_test",
                "--health-listen",
                &health.to_string(),
            ])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("start gpusched-agent node"),
    );
    let body = wait_for(health, "/readyz", 200, "registered");
    assert!(
        body.contains("\"ready\":true") && body.contains("\"node\":\"probe-1\""),
        "{body}"
    );
    let (_, metrics) = get(health, "/metrics");
    for line in [
        "gpusched_node_gpus{node=\"probe-1\"} 2",
        "gpusched_node_nats_connected{node=\"probe-1\"} 1",
        "gpusched_node_workers{node=\"probe-1\",state=\"running\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }

    nats.kill();
    let body = wait_for(health, "/readyz", 503, "NATS gone");
    assert!(body.contains("NATS is unreachable"), "{body}");
    assert_eq!(get(health, "/healthz").0, 200, "alive all the same");

    nats.start();
    wait_for(health, "/readyz", 200, "NATS back");
    assert!(sigterm(&mut agent).success(), "a clean exit on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_serves_its_probes() {
    let nats = NatsServer::started();
    let db = gpusched_store::testing::TestDb::new().await;
    let health = free_addr();
    let mut relay = Killed(
        Command::new(env!("CARGO_BIN_EXE_gpusched-agent"))
            .args([
                "relay",
                "--database-url",
                &db.url,
                "--nats-url",
                &nats.url(),
            ])
            .args([
                "--namespace",
                "probe_relay",
                "--health-listen",
                &health.to_string(),
            ])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("start gpusched-agent relay"),
    );
    let body = tokio::task::spawn_blocking(move || wait_for(health, "/readyz", 200, "relay"))
        .await
        .expect("probe");
    assert!(
        body.contains("\"service\":\"nodes\"") && body.contains("\"ready\":true"),
        "{body}"
    );
    let (_, metrics) = get(health, "/metrics");
    assert!(
        metrics.contains("gpusched_leader{service=\"nodes\"} 1"),
        "{metrics}"
    );
    assert!(sigterm(&mut relay).success(), "a clean exit on SIGTERM");
}
