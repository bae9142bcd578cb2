//! A live stack for integration tests: every service as its own process
//! (the real binaries) over the real Postgres and NATS on 127.0.0.1, with
//! this test's own database and stream names, all removed afterwards
//! (`gpusched_stack`, the harness the load test runs too); and reading the
//! services' `/metrics`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use gpusched_stack::Stack;
use gpusched_stack::{Build, StackOptions};

/// The service binaries beside this test's `gpusched`, built (or found up
/// to date) by cargo first, so a test never runs a stale binary against a
/// freshly migrated database.
pub fn service_binaries() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = Path::new(env!("CARGO_BIN_EXE_gpusched"));
            let dir = exe.parent().expect("binary directory");
            gpusched_stack::service_binaries(dir, Build::Always)
                .unwrap_or_else(|e| panic!("the service binaries: {e}"))
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

/// A fresh database and namespace for a test; no process started yet. The
/// agent runs its built-in demo cluster 3,600 times faster than real time;
/// leases last 2 s.
pub async fn new() -> Stack {
    let admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| gpusched_store::testing::DEFAULT_URL.to_string());
    let label = "test".to_string();
    let logs =
        std::env::temp_dir().join(format!("gpusched-stack-{}", uuid::Uuid::new_v4().simple()));
    let opts = StackOptions {
        admin_url,
        nats_url: nats_url(),
        cluster_file: None,
        time_scale: 3600.0,
        lease_ttl_s: 2.0,
        logs,
        token: ADMIN_TOKEN.to_string(),
        keep_log: false,
        label,
    };
    Stack::create(opts, service_binaries())
        .await
        .unwrap_or_else(|e| panic!("a stack: {e}"))
}

/// Starts every service once and waits for the gateway and for the
/// agent's cluster description (its tenants) to be in the log.
pub async fn start_all(stack: &mut Stack) {
    stack.start_all().await.unwrap_or_else(|e| panic!("{e}"));
    stack
        .wait_tenant("vision")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Stops every process, removes the streams, the database and the logs.
pub async fn teardown(stack: Stack) {
    let logs = stack.opts.logs.clone();
    stack
        .teardown()
        .await
        .unwrap_or_else(|e| panic!("teardown: {e}"));
    let _ = std::fs::remove_dir_all(logs);
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
