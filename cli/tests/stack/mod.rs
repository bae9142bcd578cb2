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
pub fn service_binaries() -> PathBuf {
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
    /// Where its `/healthz`, `/readyz` and `/metrics` answer.
    pub health: String,
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

    /// Adds command-line arguments for every instance of `service`
    /// started from now on.
    pub fn args(&mut self, service: &str, args: &[&str]) {
        self.extra
            .entry(service.to_string())
            .or_default()
            .extend(args.iter().map(|a| a.to_string()));
    }

    /// Starts one instance of `service`; returns its instance name.
    pub fn start(&mut self, service: &str) -> String {
        self.next_instance += 1;
        let instance = format!("{service}-{}", self.next_instance);
        let out =
            std::fs::File::create(self.logs.join(format!("{instance}.log"))).expect("log file");
        let err = out.try_clone().expect("log file");
        let (health, health_args) = if service == "gateway" {
            (self.http.clone(), Vec::new())
        } else {
            let addr = format!("127.0.0.1:{}", free_port());
            (
                format!("http://{addr}"),
                vec!["--health-listen".to_string(), addr],
            )
        };
        let child = Command::new(self.dir.join(format!("gpusched-{service}")))
            .args(self.extra.get(service).cloned().unwrap_or_default())
            .args(health_args)
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
            health,
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
    pub async fn lease_holder(&self, service: &str) -> Option<(String, u64)> {
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

/// A sample's labels, in the order written.
pub type Labels = Vec<(String, String)>;

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the Prometheus text format (0.0.4) strictly: every sample's
/// family has a `# TYPE` line before it, names and label names are valid,
/// label values are quoted with only the format's escapes, values are
/// numbers, histogram buckets are cumulative and end in `+Inf` equal to
/// `_count`. An error names the line.
pub fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut out: Vec<Sample> = Vec::new();
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    for (i, line) in text.lines().enumerate() {
        let at = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(at("unknown type"));
                    }
                    if types.insert(name.to_string(), kind.to_string()).is_some() {
                        return Err(at("a second TYPE for the family"));
                    }
                }
                (Some("HELP"), Some(_), _) => {}
                _ => return Err(at("a comment that is neither HELP nor TYPE")),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or_else(|| at("no value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|_| at("a value that is no number"))?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| at("unclosed labels"))?;
                (name, parse_labels(body).map_err(|e| at(&e))?)
            }
        };
        if !valid_name(name) || labels.iter().any(|(k, _)| !valid_name(k)) {
            return Err(at("an invalid metric or label name"));
        }
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|sfx| {
                name.strip_suffix(sfx)
                    .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        if !types.contains_key(family) {
            return Err(at("a sample before its family's TYPE"));
        }
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    check_histograms(&types, &out)?;
    Ok(out)
}

fn parse_labels(body: &str) -> Result<Vec<(String, String)>, String> {
    let mut labels = Vec::new();
    let mut chars = body.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next() != Some('"') {
            return Err("a label value without quotes".into());
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c @ ('\\' | '"')) => value.push(c),
                    _ => return Err("a bad escape in a label value".into()),
                },
                Some(c) => value.push(c),
                None => return Err("an unclosed label value".into()),
            }
        }
        labels.push((key, value));
        match chars.next() {
            None | Some(',') => {}
            Some(_) => return Err("labels not separated by commas".into()),
        }
    }
    Ok(labels)
}

fn check_histograms(types: &HashMap<String, String>, samples: &[Sample]) -> Result<(), String> {
    for (family, _) in types.iter().filter(|(_, t)| *t == "histogram") {
        let bucket = format!("{family}_bucket");
        let count = format!("{family}_count");
        let mut series: HashMap<Labels, Vec<(f64, f64)>> = HashMap::new();
        for s in samples.iter().filter(|s| s.name == bucket) {
            let le = s.label("le").ok_or(format!("{bucket} without le"))?;
            let le: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().map_err(|_| format!("{bucket}: le {le}"))?
            };
            let key: Vec<_> = s
                .labels
                .iter()
                .filter(|(k, _)| k != "le")
                .cloned()
                .collect();
            series.entry(key).or_default().push((le, s.value));
        }
        for (key, buckets) in series {
            if !buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
            {
                return Err(format!(
                    "{family}{key:?}: buckets not cumulative: {buckets:?}"
                ));
            }
            let last = buckets.last().copied().unwrap_or((0.0, 0.0));
            let total = samples
                .iter()
                .find(|s| s.name == count && s.labels == key)
                .map(|s| s.value);
            if last.0 != f64::INFINITY || total != Some(last.1) {
                return Err(format!(
                    "{family}{key:?}: +Inf bucket {last:?} against _count {total:?}"
                ));
            }
        }
    }
    Ok(())
}

/// The families a text exposition declares (`# TYPE` lines).
pub fn families(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// Scrapes `{base}/metrics` and parses it (panics with the reason): the
/// families declared and the samples.
pub async fn scrape(base: &str) -> (Vec<String>, Vec<Sample>) {
    let r = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("scrape");
    assert_eq!(r.status(), 200, "{base}/metrics");
    let ctype = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(
        ctype.starts_with("text/plain; version=0.0.4"),
        "{base}/metrics: content type {ctype}"
    );
    let text = r.text().await.expect("metrics body");
    let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("{base}/metrics: {e}\n{text}"));
    (families(&text), samples)
}
