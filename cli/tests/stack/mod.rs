//! A live stack for integration tests: every service as its own process
//! (the real binaries) over the real Postgres and NATS on 127.0.0.1, with
//! this test's own database and stream names, all removed afterwards.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpusched_bus::async_nats;
use gpusched_store::testing::TestDb;

pub const SERVICES: [&str; 6] = [
    "admission",
    "quota",
    "placement",
    "preemption",
    "agent",
    "gateway",
];

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_gpusched"))
        .parent()
        .expect("binary directory")
        .to_path_buf()
}

/// The service binaries, built (or found up to date) by cargo first, so a
/// test never runs a stale binary against a freshly migrated database.
///
/// `--workspace --bins --tests` resolves features exactly as `cargo test
/// --workspace` (the test command) does, so under it this build reuses
/// every artifact the test build made and only links the binaries; a build
/// of just the service packages would resolve other features and recompile
/// a dozen crates, then the test build would recompile them back.
fn service_binaries() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = bin_dir();
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "--quiet", "--workspace", "--bins", "--tests"]);
            if dir.ends_with("release") {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("cargo build of the service binaries");
            assert!(status.success(), "building the service binaries failed");
            dir
        })
        .clone()
}

/// The admin token every stack's gateway accepts.
pub const ADMIN_TOKEN: &str = "stack-admin-token";

/// An HTTP client that sends the admin token.
pub fn client() -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_str(&format!("Bearer {ADMIN_TOKEN}")).expect("header"),
    );
    reqwest::Client::builder()
        .default_headers(h)
        .build()
        .expect("http client")
}

pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One running service process.
pub struct Proc {
    pub service: String,
    pub instance: String,
    pub child: Child,
}

pub struct Stack {
    pub db: TestDb,
    pub namespace: String,
    pub http: String,
    pub procs: Vec<Proc>,
    dir: PathBuf,
    logs: PathBuf,
    extra: HashMap<String, Vec<String>>,
    next_instance: u32,
}

impl Stack {
    /// A fresh database and namespace; no process started yet.
    pub async fn new() -> Stack {
        let db = TestDb::new().await;
        let namespace = format!("t{}", uuid::Uuid::new_v4().simple());
        let logs = std::env::temp_dir().join(format!("gpusched-{namespace}"));
        std::fs::create_dir_all(&logs).expect("log dir");
        let port = free_port();
        let mut extra = HashMap::new();
        extra.insert(
            "agent".to_string(),
            vec!["--configure".into(), "--time-scale".into(), "3600".into()],
        );
        extra.insert(
            "gateway".to_string(),
            vec!["--listen".into(), format!("127.0.0.1:{port}")],
        );
        Stack {
            db,
            namespace,
            http: format!("http://127.0.0.1:{port}"),
            procs: Vec::new(),
            dir: service_binaries(),
            logs,
            extra,
            next_instance: 0,
        }
    }

    /// Starts one instance of `service`; returns its instance name.
    pub fn start(&mut self, service: &str) -> String {
        self.next_instance += 1;
        let instance = format!("{service}-{}", self.next_instance);
        let out =
            std::fs::File::create(self.logs.join(format!("{instance}.log"))).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = Command::new(self.dir.join(format!("gpusched-{service}")))
            .args(self.extra.get(service).cloned().unwrap_or_default())
            .env("DATABASE_URL", &self.db.url)
            .env("NATS_URL", nats_url())
            .env("GPUSCHED_NAMESPACE", &self.namespace)
            .env("GPUSCHED_INSTANCE", &instance)
            .env("GPUSCHED_LEASE_TTL_S", "2")
            .env("GPUSCHED_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting gpusched-{service}: {e}"));
        self.procs.push(Proc {
            service: service.to_string(),
            instance: instance.clone(),
            child,
        });
        instance
    }

    /// Starts every service once and waits for the gateway and for the
    /// agent's cluster description (tenants) to be in the log.
    pub async fn start_all(&mut self) {
        for s in SERVICES {
            self.start(s);
        }
        self.wait_http().await;
        self.wait_tenants().await;
    }

    /// Waits until the gateway knows the demo tenants (the agent registers
    /// them when it starts): a job for a tenant not yet configured is
    /// rightly refused.
    pub async fn wait_tenants(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = client()
                .get(format!("{}/v1/queues", self.http))
                .send()
                .await
            {
                if r.status().is_success() && r.text().await.is_ok_and(|t| t.contains("vision")) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the tenants never showed up; logs in {}",
                self.logs.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_http(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let client = reqwest::Client::new();
        loop {
            if let Ok(r) = client.get(format!("{}/healthz", self.http)).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "gateway did not come up; logs in {}",
                self.logs.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILLs the instance named `instance`.
    pub fn kill(&mut self, instance: &str) {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.instance == instance)
            .unwrap_or_else(|| panic!("no process {instance}"));
        p.child.kill().expect("SIGKILL");
        let _ = p.child.wait();
    }

    /// Sends SIGTERM and waits for a clean exit; returns whether it exited 0.
    pub fn terminate(&mut self, instance: &str) -> bool {
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.instance == instance)
            .unwrap_or_else(|| panic!("no process {instance}"));
        let status = Command::new("kill")
            .args(["-TERM", &p.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = p.child.try_wait().expect("wait") {
                return s.success();
            }
            assert!(Instant::now() < deadline, "{instance} ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The instance holding `service`'s lease now.
    pub async fn lease_holder(&self, service: &str) -> Option<(String, i64)> {
        self.db
            .store
            .lease(service, "default")
            .await
            .expect("lease")
            .map(|l| (l.holder, l.epoch))
    }

    /// Stops every process and removes the streams.
    pub async fn teardown(mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        if let Ok(client) = async_nats::connect(nats_url()).await {
            let js = async_nats::jetstream::new(client);
            let ns = gpusched_bus::Namespace::new(&self.namespace).expect("namespace");
            let _ = js.delete_stream(ns.evt_stream()).await;
            let _ = js.delete_stream(ns.cmd_stream()).await;
        }
        let _ = std::fs::remove_dir_all(&self.logs);
    }

    pub fn logs(&self) -> &Path {
        &self.logs
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}
