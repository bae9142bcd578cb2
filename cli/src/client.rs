//! The API client commands: submit, get, list, cancel, explain, queues,
//! nodes, watch, and token helpers; and the connection, refusals and exit
//! codes every client command shares (`logs` included).
//!
//! Owns: turning flags and job spec files into API requests (a spec is
//! checked first, see `spec`), tables for people and JSON for scripts, the
//! server's refusals told with the flag that sets the field, and exit
//! codes by outcome. Must never: judge what needs the cluster (tenants,
//! flavors, fit: the server does and names the field), or print a token
//! except where `token new` is asked to make one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::nodes;
use crate::spec::{self, SpecFile, SpecFlags};

/// Exit codes of the client commands (also in `gpusched --help` and
/// docs/api.md).
pub mod exit {
    /// Something else failed (a server error, an unexpected answer).
    pub const ERROR: u8 = 1;
    /// Usage: bad flags or a bad spec file (clap also exits 2).
    pub const USAGE: u8 = 2;
    /// The job, node or route does not exist (404).
    pub const NOT_FOUND: u8 = 3;
    /// No token, an unknown token, or not allowed (401, 403).
    pub const AUTH: u8 = 4;
    /// The server refused the request (400, 409, 413, 415): the message
    /// names the field and the rule.
    pub const REFUSED: u8 = 5;
    /// The server cannot be reached or is overloaded (connection refused,
    /// 429, 503); retrying later may work.
    pub const UNAVAILABLE: u8 = 6;
    /// The reader of the output went away (`gpusched … | head`): the
    /// status a shell gives a process ended by SIGPIPE (128 + 13). Nothing
    /// is printed.
    pub const BROKEN_PIPE: u8 = 141;
}

/// An error that carries the exit code it should end the process with.
#[derive(Debug)]
pub struct Exit {
    /// The exit code.
    pub code: u8,
    /// What to print.
    pub message: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// `println!` that ignores a closed stdout (`gpusched list | head`).
macro_rules! say {
    () => {{
        let _ = writeln!(std::io::stdout().lock());
    }};
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

pub(crate) fn fail(code: u8, message: impl Into<String>) -> anyhow::Error {
    Exit {
        code,
        message: message.into(),
    }
    .into()
}

/// Where the server is and who we are: flags, then env, then the config
/// file, then defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct Conn {
    /// API server URL [default: http://127.0.0.1:8080, or `server` in the config file].
    #[arg(long, env = "GPUSCHED_SERVER")]
    server: Option<String>,
    /// Bearer token [or `token` in the config file].
    #[arg(long, env = "GPUSCHED_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Config file (TOML: `server = "..."`, `token = "..."`)
    /// [default: ~/.config/gpusched/config.toml].
    #[arg(long, env = "GPUSCHED_CONFIG")]
    config: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    server: Option<String>,
    token: Option<String>,
}

pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Whether to print JSON instead of tables (`--json`).
    pub(crate) json: bool,
}

impl Conn {
    pub(crate) fn client(&self) -> Result<Client> {
        let path = self.config.clone().or_else(|| {
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".config/gpusched/config.toml"))
                .filter(|p| p.exists())
        });
        let file = match path {
            Some(p) => {
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| fail(exit::USAGE, format!("--config {}: {e}", p.display())))?;
                toml::from_str::<ConfigFile>(&text)
                    .map_err(|e| fail(exit::USAGE, format!("--config {}: {e}", p.display())))?
            }
            None => ConfigFile::default(),
        };
        let base = self
            .server
            .clone()
            .or(file.server)
            .unwrap_or_else(|| "http://127.0.0.1:8080".to_string())
            .trim_end_matches('/')
            .to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(fail(
                exit::USAGE,
                format!("--server: {base:?} must start with http:// or https://"),
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .context("building the HTTP client")?;
        Ok(Client {
            http,
            base,
            token: self.token.clone().or(file.token),
            json: self.json,
        })
    }
}

impl Client {
    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends and returns the response; an unreachable server is exit 6.
    pub(crate) async fn open(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        req.send().await.map_err(|e| {
            fail(
                exit::UNAVAILABLE,
                format!("cannot reach {}: {e}", self.base),
            )
        })
    }

    /// The error a non-2xx response stands for, with its exit code.
    pub(crate) async fn refusal(&self, resp: reqwest::Response) -> anyhow::Error {
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        self.refused(status, &text)
    }

    /// The error a non-2xx status and its body stand for, with its exit
    /// code.
    pub(crate) fn refused(&self, status: u16, text: &str) -> anyhow::Error {
        let body: Value =
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()));
        let msg = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| body.to_string());
        let msg = match body.pointer("/error/field").and_then(Value::as_str) {
            Some(field) => with_flag(field, &msg),
            None => msg,
        };
        let code = match status {
            401 | 403 => exit::AUTH,
            404 => exit::NOT_FOUND,
            400 | 409 | 413 | 415 | 422 => exit::REFUSED,
            429 | 502 | 503 | 504 => exit::UNAVAILABLE,
            _ => exit::ERROR,
        };
        let hint = if status == 401 && self.token.is_none() {
            " (set GPUSCHED_TOKEN or --token)"
        } else {
            ""
        };
        fail(code, format!("{status}: {msg}{hint}"))
    }

    /// Sends and returns (status, JSON body) for 2xx; maps the rest to exits.
    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(u16, Value)> {
        let resp = self.open(req).await?;
        if !resp.status().is_success() {
            return Err(self.refusal(resp).await);
        }
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    /// PUTs `body` as JSON; (status, JSON body) for 2xx.
    pub(crate) async fn put_json(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<(u16, Value)> {
        self.send(self.request(reqwest::Method::PUT, path).json(body))
            .await
    }

    /// DELETEs; (status, JSON body) for 2xx.
    pub(crate) async fn delete(&self, path: &str) -> Result<(u16, Value)> {
        self.send(self.request(reqwest::Method::DELETE, path)).await
    }

    /// POSTs with no body; (status, JSON body) for 2xx.
    pub(crate) async fn post_empty(&self, path: &str) -> Result<(u16, Value)> {
        self.send(self.request(reqwest::Method::POST, path)).await
    }

    pub(crate) async fn get(&self, path: &str) -> Result<Value> {
        Ok(self.send(self.request(reqwest::Method::GET, path)).await?.1)
    }

    pub(crate) fn print_json(&self, v: &Value) {
        say!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }
}

/// A refusal's message with the field told as the flag that sets it
/// (`gpus_per_worker: must be at least 1` → `--gpus: must be at least 1`).
fn with_flag(field: &str, msg: &str) -> String {
    match spec::flag_for(field) {
        Some(flag) => {
            let rule = msg.strip_prefix(&format!("{field}: ")).unwrap_or(msg);
            format!("{flag}: {rule}")
        }
        None => msg.to_string(),
    }
}

/// `gpusched submit`.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// Job spec file: .toml, .yaml/.yml or .json (`-`: JSON on stdin); or
    /// .jsonl, one job a line, sent in batches of 1000. Flags given next to
    /// it override its fields (every line's).
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    #[command(flatten)]
    spec: SpecFlags,
    /// Idempotency key: submitting again with it returns the same job.
    /// With a .jsonl file, line N's job gets the key KEY-N.
    #[arg(long)]
    key: Option<String>,
    /// Submit a job array: one job per index (`0-999`, `1,3,5-9`,
    /// `0-98:2`; at most 1000), each with GPUSCHED_ARRAY_INDEX in its
    /// environment; `%N` after the indices (`0-999%50`) runs at most N at
    /// once. Cancel it as one with `gpusched cancel --array ID`.
    #[arg(long, value_name = "INDICES")]
    array: Option<String>,
    #[command(flatten)]
    conn: Conn,
}

/// The request body: the spec file's fields with the flags over them,
/// checked here first; a bad one is a usage error (exit 2).
fn spec_body(a: &SubmitArgs) -> Result<Value> {
    let usage = |e: spec::BadSpec| fail(exit::USAGE, e.0);
    let file = a
        .file
        .as_deref()
        .map(SpecFile::read)
        .transpose()
        .map_err(usage)?;
    spec::body(file.as_ref(), &a.spec).map_err(usage)
}

/// `gpusched submit`.
pub async fn submit(a: SubmitArgs) -> Result<()> {
    if let Some(path) = a.file.as_deref().filter(|p| SpecFile::is_lines(p)) {
        if a.array.is_some() {
            return Err(fail(
                exit::USAGE,
                "--array takes one job spec, not a .jsonl file of many",
            ));
        }
        let c = a.conn.client()?;
        return crate::batch::submit_lines(&c, path, &a.spec, a.key.as_deref()).await;
    }
    let body = spec_body(&a)?;
    if let Some(indices) = &a.array {
        return submit_array(&a, body, indices).await;
    }
    if let Some((what, v)) = post_submission(&a, "/v1/jobs", &body).await? {
        say!("{what}job {}", u(&v, "id"));
    }
    Ok(())
}

/// `gpusched submit --array INDICES`.
async fn submit_array(a: &SubmitArgs, spec: Value, indices: &str) -> Result<()> {
    gpusched_model::parse_array_set(indices)
        .map_err(|e| fail(exit::USAGE, format!("--array: {e}")))?;
    let body = json!({ "spec": spec, "indices": indices });
    if let Some((what, v)) = post_submission(a, "/v1/arrays", &body).await? {
        say!("{what}array {} with {} tasks", u(&v, "id"), u(&v, "tasks"));
    }
    Ok(())
}

/// Posts a submission with `--key` as its idempotency key. With `--json`
/// prints the answer and returns `None`; otherwise returns the answer and
/// the words that start the line to print: `submitted ` for a new one,
/// `already submitted with this key: ` for a repeat.
async fn post_submission(
    a: &SubmitArgs,
    path: &str,
    body: &Value,
) -> Result<Option<(&'static str, Value)>> {
    let c = a.conn.client()?;
    let mut req = c.request(reqwest::Method::POST, path).json(body);
    if let Some(k) = &a.key {
        req = req.header("Idempotency-Key", k);
    }
    let (status, v) = c.send(req).await?;
    if c.json {
        c.print_json(&v);
        return Ok(None);
    }
    let what = if status == 200 {
        "already submitted with this key: "
    } else {
        "submitted "
    };
    Ok(Some((what, v)))
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `1-02:03:04` like squeue's TIME, from milliseconds.
fn duration_text(ms: u64) -> String {
    let s = ms / 1000;
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{sec:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{sec:02}")
    } else {
        format!("{m}:{sec:02}")
    }
}

/// A plain left-aligned table.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(x) = w.get_mut(i) {
                *x = (*x).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<width$}  ", width = w[i]));
            }
        }
        l.trim_end().to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.clone()));
    }
    out
}

/// How long a job's current or last run took: to now while it runs, to
/// its end once ended; `0:00` if it has not started (again).
fn run_time(j: &Value, now: u64) -> String {
    match (
        j.get("started_at_ms").and_then(Value::as_u64),
        j.get("ended_at_ms").and_then(Value::as_u64),
    ) {
        (Some(st), None) => duration_text(now.saturating_sub(st)),
        (Some(st), Some(end)) => duration_text(end.saturating_sub(st)),
        (None, _) => "0:00".to_string(),
    }
}

/// Each tenant's flavors from `GET /v1/queues`, in its order.
type TenantFlavors = BTreeMap<String, Vec<String>>;

/// Whether a job ran and `GET /v1/jobs` no longer says on which flavor:
/// the gateway reports `flavor` only while the job holds quota.
fn flavor_gone(j: &Value) -> bool {
    let held = ["flavor", "last_flavor"]
        .iter()
        .any(|k| j.get(*k).and_then(Value::as_str).is_some());
    !held && u(j, "starts") > 0
}

/// The flavor a job holds, or last ran on once it let go: `flavor` while it
/// holds quota (`last_flavor` where the gateway says it); after, the one
/// flavor its spec allowed, or its tenant's only flavor when the spec named
/// none. `-` when it never ran or that does not settle it (then
/// [`Flavors`] reads the job's log).
fn job_flavor(j: &Value, tenants: &TenantFlavors) -> String {
    for k in ["flavor", "last_flavor"] {
        if let Some(f) = j.get(k).and_then(Value::as_str) {
            return f.to_string();
        }
    }
    if !flavor_gone(j) {
        return "-".to_string();
    }
    let asked: Vec<&str> = j
        .pointer("/spec/flavors")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let only = match asked.as_slice() {
        [one] => Some(one.to_string()),
        [] => match tenants.get(s(j, "tenant")).map(Vec::as_slice) {
            Some([one]) => Some(one.clone()),
            _ => None,
        },
        _ => None,
    };
    only.unwrap_or_else(|| "-".to_string())
}

/// Each tenant's flavors, only when a job's flavor needs them to be told
/// (best effort: without them the column says `-`).
async fn tenant_flavors(c: &Client, jobs: &[Value]) -> TenantFlavors {
    let needed = jobs.iter().any(|j| {
        flavor_gone(j)
            && j.pointer("/spec/flavors")
                .and_then(Value::as_array)
                .is_none_or(|a| a.is_empty())
    });
    let mut out = TenantFlavors::new();
    if !needed {
        return out;
    }
    if let Ok(v) = c.get("/v1/queues").await {
        for q in v
            .get("queues")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let f = out.entry(s(q, "tenant").to_string()).or_default();
            if !f.iter().any(|x| x == s(q, "flavor")) {
                f.push(s(q, "flavor").to_string());
            }
        }
    }
    out
}

/// The flavor of the last `job_admitted` in a job's events
/// (`GET /v1/jobs/{id}/events`).
fn last_admitted_flavor(events: &Value) -> Option<String> {
    events
        .as_array()?
        .iter()
        .rev()
        .find(|e| s(e, "kind") == "job_admitted")
        .and_then(|e| e.pointer("/event/flavor"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// At most this many jobs' logs are read per table to tell the flavor of
/// ended jobs the other clues do not settle (the rest show `-`).
const FLAVOR_LOOKUPS: usize = 100;

/// What tells ended jobs' flavors: each tenant's flavors, and the flavor
/// read from the log of jobs those do not settle.
#[derive(Default)]
pub struct Flavors {
    tenants: TenantFlavors,
    logged: BTreeMap<u64, String>,
}

impl Flavors {
    /// Best effort: a failed read leaves the column `-`.
    async fn read(c: &Client, jobs: &[Value]) -> Flavors {
        let tenants = tenant_flavors(c, jobs).await;
        let ids: Vec<u64> = jobs
            .iter()
            .filter(|j| flavor_gone(j) && job_flavor(j, &tenants) == "-")
            .map(|j| u(j, "id"))
            .take(FLAVOR_LOOKUPS)
            .collect();
        let logged = futures::stream::iter(ids)
            .map(|id| async move {
                let events = c.get(&format!("/v1/jobs/{id}/events")).await.ok()?;
                Some((id, last_admitted_flavor(&events)?))
            })
            .buffer_unordered(8)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        Flavors { tenants, logged }
    }

    fn of(&self, j: &Value) -> String {
        let f = job_flavor(j, &self.tenants);
        if f != "-" {
            return f;
        }
        self.logged.get(&u(j, "id")).cloned().unwrap_or(f)
    }
}

/// Jobs as `gpusched list` prints them, their run times counted to `now`
/// (ms since the Unix epoch).
pub fn jobs_table(jobs: &[Value], flavors: &Flavors, now: u64) -> String {
    let rows: Vec<Vec<String>> = jobs.iter().map(|j| job_row(j, flavors, now)).collect();
    table(&JOB_HEADER, &rows)
}

fn job_row(j: &Value, flavors: &Flavors, now: u64) -> Vec<String> {
    let spec = j.get("spec").cloned().unwrap_or(Value::Null);
    let time = run_time(j, now);
    let where_ = {
        let nodes: Vec<&str> = j
            .get("nodes")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !nodes.is_empty() {
            let mut n: Vec<&str> = nodes;
            n.dedup();
            n.join(",")
        } else if let Some(r) = j.get("reason").and_then(Value::as_str) {
            format!("({r})")
        } else if let Some(r) = j.get("rejection").and_then(Value::as_str) {
            format!("(rejected: {r})")
        } else {
            String::new()
        }
    };
    vec![
        u(j, "id").to_string(),
        s(j, "tenant").to_string(),
        s(j, "state").to_uppercase(),
        u(j, "gpus").to_string(),
        format!("{}x{}", u(&spec, "workers"), u(&spec, "gpus_per_worker")),
        flavors.of(j),
        s(&spec, "topology").to_string(),
        time,
        where_,
    ]
}

const JOB_HEADER: [&str; 9] = [
    "JOBID",
    "TENANT",
    "STATE",
    "GPUS",
    "SHAPE",
    "FLAVOR",
    "TOPOLOGY",
    "TIME",
    "NODES(REASON)",
];

/// `gpusched get`.
#[derive(clap::Args, Debug)]
pub struct JobArg {
    /// Job id.
    job: u64,
    #[command(flatten)]
    conn: Conn,
}

/// `gpusched get JOB`.
pub async fn get(a: JobArg) -> Result<()> {
    let c = a.conn.client()?;
    let v = c.get(&format!("/v1/jobs/{}", a.job)).await?;
    if c.json {
        c.print_json(&v);
    } else {
        let v = [v];
        let flavors = Flavors::read(&c, &v).await;
        say!(
            "{}",
            table(&JOB_HEADER, &[job_row(&v[0], &flavors, now_ms())])
        );
        for line in run_lines(v[0].get("spec").unwrap_or(&Value::Null)) {
            say!("{line}");
        }
    }
    Ok(())
}

/// What a job runs, for `get` under its row, when it has a command: the
/// command as a shell would take it, its env's names (never the values:
/// they may be secrets), working directory and checkpoint signal.
fn run_lines(spec: &Value) -> Vec<String> {
    let argv: Vec<&str> = spec
        .get("command")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if argv.is_empty() {
        return Vec::new();
    }
    let words: Vec<String> = argv.iter().map(|a| shell_word(a)).collect();
    let mut out = vec![format!("command: {}", words.join(" "))];
    if let Some(env) = spec.get("env").and_then(Value::as_object) {
        if !env.is_empty() {
            let names: Vec<&str> = env.keys().map(String::as_str).collect();
            out.push(format!("env: {}", names.join(", ")));
        }
    }
    if let Some(d) = spec.get("working_dir").and_then(Value::as_str) {
        out.push(format!("working_dir: {d}"));
    }
    if let Some(sig) = spec.get("checkpoint_signal").and_then(Value::as_str) {
        out.push(format!("checkpoint_signal: {sig}"));
    }
    out
}

/// One argument as a POSIX shell reads it back: as is when it is plain,
/// else in single quotes.
fn shell_word(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', r"'\''"))
    }
}

/// `gpusched list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Only this tenant's jobs.
    #[arg(long, short = 't')]
    tenant: Option<String>,
    /// Only these states, comma-separated (queued,running,...).
    #[arg(long, short = 's')]
    state: Option<String>,
    /// Show at most this many jobs (pages are followed).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    #[command(flatten)]
    conn: Conn,
}

/// `gpusched list`: every page up to `--limit` jobs.
pub async fn list(a: ListArgs) -> Result<()> {
    let c = a.conn.client()?;
    let mut jobs: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    while jobs.len() < a.limit {
        let page = (a.limit - jobs.len()).min(1000);
        let mut q: Vec<(&str, String)> = vec![("limit", page.to_string())];
        if let Some(t) = &a.tenant {
            q.push(("tenant", t.clone()));
        }
        if let Some(st) = &a.state {
            q.push(("state", st.clone()));
        }
        if let Some(cur) = &cursor {
            q.push(("cursor", cur.clone()));
        }
        let (_, v) = c
            .send(c.request(reqwest::Method::GET, "/v1/jobs").query(&q))
            .await?;
        if let Some(a) = v.get("jobs").and_then(Value::as_array) {
            jobs.extend(a.iter().cloned());
        }
        cursor = v
            .get("next_cursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    if c.json {
        c.print_json(&Value::Array(jobs));
    } else {
        let flavors = Flavors::read(&c, &jobs).await;
        say!("{}", jobs_table(&jobs, &flavors, now_ms()));
    }
    Ok(())
}

/// `gpusched cancel`.
#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    /// Job ids.
    #[arg(required_unless_present = "array", conflicts_with = "array")]
    jobs: Vec<u64>,
    /// Cancel every task of this job array (its id, as `submit --array`
    /// printed it) instead.
    #[arg(long, value_name = "ID")]
    array: Option<u64>,
    #[command(flatten)]
    conn: Conn,
}

/// `gpusched cancel --array ID`.
async fn cancel_array(c: &Client, id: u64) -> Result<()> {
    let (_, v) = c
        .send(c.request(reqwest::Method::DELETE, &format!("/v1/arrays/{id}")))
        .await?;
    if c.json {
        c.print_json(&v);
    } else {
        say!(
            "array {id}: {} cancelled, {} cancelling (they stop after a final checkpoint if they checkpoint), {} had ended",
            u(&v, "cancelled"),
            u(&v, "cancelling"),
            u(&v, "ended")
        );
    }
    Ok(())
}

/// `gpusched cancel JOB...`: stops at the first failure.
pub async fn cancel(a: CancelArgs) -> Result<()> {
    let c = a.conn.client()?;
    if let Some(id) = a.array {
        return cancel_array(&c, id).await;
    }
    let mut out = Vec::new();
    for id in &a.jobs {
        let (_, v) = c
            .send(c.request(reqwest::Method::DELETE, &format!("/v1/jobs/{id}")))
            .await?;
        if !c.json {
            match s(&v, "state") {
                "cancelling" => say!(
                    "job {id}: cancelling (it stops after a final checkpoint if it checkpoints)"
                ),
                st => say!("job {id}: {st}"),
            }
        }
        out.push(v);
    }
    if c.json {
        c.print_json(&Value::Array(out));
    }
    Ok(())
}

/// `gpusched explain JOB`.
pub async fn explain(a: JobArg) -> Result<()> {
    let c = a.conn.client()?;
    let v = c.get(&format!("/v1/jobs/{}/explain", a.job)).await?;
    if c.json {
        c.print_json(&v);
        return Ok(());
    }
    say!("job {} is {}", a.job, s(&v, "state"));
    if let Some(p) = v.get("pending").filter(|p| !p.is_null()) {
        say!("waiting because {}", s(p, "text"));
    }
    if let Some(q) = v.get("queue_position").filter(|q| !q.is_null()) {
        say!(
            "position {} of {} in its queue",
            u(q, "position"),
            u(q, "of")
        );
    }
    if let Some(r) = v.get("reservation_ahead").and_then(Value::as_u64) {
        say!("GPUs of its flavor are reserved for job {r} ahead of it");
    }
    match v.get("guaranteed_start_ms").and_then(Value::as_u64) {
        Some(t) => say!(
            "a reservation guarantees a start within {}",
            duration_text(t.saturating_sub(now_ms()))
        ),
        None if matches!(s(&v, "state"), "queued" | "admitted") => {
            say!("no start time: no reservation guarantees one")
        }
        None => {}
    }
    say!();
    for line in v
        .get("history")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        say!("{}", line.as_str().unwrap_or(""));
    }
    Ok(())
}

/// `gpusched queues`.
#[derive(clap::Args, Debug)]
pub struct Plain {
    #[command(flatten)]
    conn: Conn,
}

/// `gpusched queues`: every queue, or one change to one queue.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct QueuesArgs {
    #[command(subcommand)]
    op: Option<crate::ops::QueueOp>,
    #[command(flatten)]
    conn: Conn,
}

fn opt(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_u64)
        .map_or("-".to_string(), |x| x.to_string())
}

/// `gpusched queues`.
pub async fn queues(a: QueuesArgs) -> Result<()> {
    if let Some(op) = a.op {
        return crate::ops::queue_op(op).await;
    }
    let c = a.conn.client()?;
    let v = c.get("/v1/queues").await?;
    if c.json {
        c.print_json(&v);
        return Ok(());
    }
    say!("{}", queues_table(&v));
    Ok(())
}

/// A row's GPU-hour budget as `gpusched queues` shows it: used of the
/// budget this period, and once spent what its jobs do (`-`: none).
fn budget_cell(q: &Value) -> String {
    let Some(b) = q.get("budget").filter(|b| b.is_object()) else {
        return "-".to_string();
    };
    let used = b
        .get("used_gpu_hours")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let mut cell = format!(
        "{used:.1}/{} GPU-h per {}",
        u(b, "gpu_hours"),
        s(b, "period")
    );
    if b.get("spent").and_then(Value::as_bool) == Some(true) {
        cell.push_str(&format!(", spent: {}", s(b, "when_spent")));
    }
    cell
}

/// `GET /v1/queues`'s answer as `gpusched queues` prints it (a BUDGET
/// column where some tenant has a GPU-hour budget).
pub fn queues_table(v: &Value) -> String {
    let queues: Vec<&Value> = v
        .get("queues")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let budgets = queues
        .iter()
        .any(|q| q.get("budget").is_some_and(Value::is_object));
    let rows: Vec<Vec<String>> = queues
        .into_iter()
        .map(|q| {
            let mut row = vec![
                s(q, "tenant").to_string(),
                q.get("queue")
                    .and_then(Value::as_str)
                    .unwrap_or("open")
                    .to_string(),
                q.get("cohort")
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_string(),
                s(q, "flavor").to_string(),
                u(q, "nominal").to_string(),
                opt(q, "borrowing_limit"),
                u(q, "used").to_string(),
                u(q, "borrowed").to_string(),
                u(q, "lent").to_string(),
                u(q, "pending").to_string(),
                u(q, "running").to_string(),
            ];
            if budgets {
                row.push(budget_cell(q));
            }
            row
        })
        .collect();
    let mut header = vec![
        "TENANT",
        "QUEUE",
        "COHORT",
        "FLAVOR",
        "NOMINAL",
        "BORROW_LIMIT",
        "USED",
        "BORROWED",
        "LENT",
        "PENDING",
        "RUNNING",
    ];
    if budgets {
        header.push("BUDGET");
    }
    table(&header, &rows)
}

/// `gpusched nodes`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodesArgs {
    #[command(subcommand)]
    op: Option<crate::ops::NodeOp>,
    /// List every node (after the filters) instead of the summary.
    #[arg(long, short = 'l')]
    all: bool,
    /// Only nodes of this flavor (repeatable, or comma-separated).
    #[arg(long = "flavor", value_delimiter = ',')]
    flavors: Vec<String>,
    /// Only nodes in this status (repeatable, or comma-separated).
    #[arg(long = "state", value_enum, value_delimiter = ',')]
    states: Vec<nodes::Status>,
    /// Topology levels that name a domain in the summary: 1 the outermost
    /// (racks), 2 the next (rack/block), ...
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    depth: u8,
    #[command(flatten)]
    conn: Conn,
}

/// `gpusched nodes`: a summary by flavor and by topology domain (nodes,
/// GPUs, used, free on ready nodes, nodes per status); `-l` for every node.
/// `--json` gives `{"nodes": [...], "summary": {...}}`, both filtered.
pub async fn nodes(a: NodesArgs) -> Result<()> {
    if let Some(op) = a.op {
        return crate::ops::node_op(op).await;
    }
    let c = a.conn.client()?;
    let v = c.get("/v1/nodes").await?;
    let all: Vec<Value> = v
        .get("nodes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    nodes::check_flavors(&all, &a.flavors).map_err(|e| fail(exit::USAGE, e))?;
    let kept: Vec<Value> = all
        .into_iter()
        .filter(|n| nodes::keep(n, &a.flavors, &a.states))
        .collect();
    let summary = nodes::summarize(&kept, usize::from(a.depth));
    if c.json {
        c.print_json(&json!({"nodes": kept, "summary": summary.to_json()}));
        return Ok(());
    }
    if !a.all {
        say!("{}", summary.to_text());
        return Ok(());
    }
    say!("{}", nodes_table(&kept));
    Ok(())
}

/// Nodes of `GET /v1/nodes` as `gpusched nodes -l` prints them.
pub fn nodes_table(nodes: &[Value]) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let path: Vec<&str> = n
                .get("path")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            vec![
                s(n, "name").to_string(),
                s(n, "flavor").to_string(),
                path.join("/"),
                s(n, "status").to_uppercase(),
                format!("{}/{}", u(n, "used"), u(n, "gpus")),
                n.get("jobs")
                    .and_then(Value::as_array)
                    .map(|a| a.len())
                    .unwrap_or(0)
                    .to_string(),
                opt(n, "reserved_for"),
            ]
        })
        .collect();
    table(
        &[
            "NODE",
            "FLAVOR",
            "TOPOLOGY",
            "STATUS",
            "GPUS_USED",
            "JOBS",
            "RESERVED_FOR",
        ],
        &rows,
    )
}

/// `gpusched watch`.
#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// Only this job's events; exit when it ends.
    #[arg(long)]
    job: Option<u64>,
    /// Start after this sequence number [default: now; 0 replays the log].
    #[arg(long)]
    from: Option<u64>,
    #[command(flatten)]
    conn: Conn,
}

fn event_line(seq: u64, kind: &str, ev: &Value) -> String {
    let job = ev.get("job").and_then(Value::as_u64);
    let mut rest = ev.clone();
    if let Some(o) = rest.as_object_mut() {
        for k in ["type", "job", "at"] {
            o.remove(k);
        }
    }
    let detail = match &rest {
        Value::Object(o) if o.is_empty() => String::new(),
        v => v.to_string(),
    };
    match job {
        Some(j) => format!("{seq:>8}  {kind:<22} job {j:<8} {detail}"),
        None => format!("{seq:>8}  {kind:<22} {detail}"),
    }
}

/// `gpusched watch`: follows `/v1/events` as Server-Sent Events, resuming
/// after the last event seen if the connection drops.
pub async fn watch(a: WatchArgs) -> Result<()> {
    let c = a.conn.client()?;
    let mut after = match a.from {
        Some(f) => f,
        None => u(&c.get("/v1/status").await?, "seq"),
    };
    let ends = gpusched_events::ENDING_KINDS;
    let mut stdout = std::io::stdout();
    loop {
        let req = c
            .request(reqwest::Method::GET, "/v1/events")
            .query(&[("follow", "true".to_string()), ("from", after.to_string())]);
        let resp = c.open(req).await?;
        if !resp.status().is_success() {
            return Err(c.refusal(resp).await);
        }
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        let (mut id, mut kind, mut data) = (None::<u64>, String::new(), String::new());
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else { break };
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(nl) = buf.find('\n') {
                let line = buf[..nl].trim_end_matches('\r').to_string();
                buf.drain(..=nl);
                if line.is_empty() {
                    if let Some(seq) = id.take() {
                        after = seq;
                        let ev: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                        let this_job = ev.get("job").and_then(Value::as_u64);
                        if a.job.is_none() || this_job == a.job {
                            let out = if c.json {
                                json!({"seq": seq, "kind": kind, "event": ev}).to_string()
                            } else {
                                event_line(seq, &kind, &ev)
                            };
                            let _ = writeln!(stdout, "{out}");
                            let _ = stdout.flush();
                            if a.job.is_some() && ends.contains(&kind.as_str()) {
                                return Ok(());
                            }
                        }
                    }
                    kind.clear();
                    data.clear();
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    kind = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
        }
        // The stream ended (server restart, network): resume after `after`.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `gpusched token`.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCmd {
    /// Make a new random token and print it with its tokens-file entry.
    New {
        /// The tenant it acts for.
        #[arg(long, required_unless_present = "admin", conflicts_with = "admin")]
        tenant: Option<String>,
        /// An admin token.
        #[arg(long)]
        admin: bool,
    },
    /// Print the tokens-file hash of a token.
    Hash {
        /// The token.
        token: String,
    },
}

/// `gpusched token ...`.
pub fn token(cmd: TokenCmd) -> Result<()> {
    match cmd {
        TokenCmd::Hash { token } => say!("{}", gpusched_gateway::hash_token(&token)),
        TokenCmd::New { tenant, admin } => {
            let t = format!("gps_{}", uuid::Uuid::new_v4().simple());
            say!("token: {t}");
            say!("(give it to its user; the server keeps only the hash below)");
            say!();
            say!("[[tokens]]");
            match (&tenant, admin) {
                (Some(name), _) => {
                    say!("name = {:?}", name);
                    say!("tenant = {:?}", name);
                }
                (None, _) => {
                    say!("name = \"admin\"");
                    say!("admin = true");
                }
            }
            say!("blake3 = {:?}", gpusched_gateway::hash_token(&t));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_show_a_budget_column_only_where_a_tenant_has_a_budget() {
        let row = |tenant: &str, budget: Value| {
            json!({"tenant": tenant, "flavor": "h100", "nominal": 8, "used": 8,
                "borrowed": 0, "lent": 0, "pending": 1, "running": 1, "budget": budget})
        };
        let none = json!({"queues": [row("a", Value::Null)]});
        assert!(!queues_table(&none).contains("BUDGET"));
        let spent = json!({"gpu_hours": 10, "period": "day", "when_spent": "borrow-only",
            "used_gpu_hours": 10.25, "left_gpu_hours": 0.0, "spent": true});
        let left = json!({"gpu_hours": 500, "period": "month", "when_spent": "wait",
            "used_gpu_hours": 12.0, "left_gpu_hours": 488.0, "spent": false});
        let text = queues_table(
            &json!({"queues": [row("a", spent), row("b", left), row("c", Value::Null)]}),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("BUDGET"), "{text}");
        assert!(
            lines[1].ends_with("10.2/10 GPU-h per day, spent: borrow-only"),
            "{text}"
        );
        assert!(lines[2].ends_with("12.0/500 GPU-h per month"), "{text}");
        assert!(lines[3].ends_with(" -"), "{text}");
    }

    #[test]
    fn get_shows_what_a_job_runs() {
        let spec = json!({"tenant": "v", "command": ["sh", "-c", "echo 'hi' there", ""],
            "env": {"B": "secret", "A": "1"}, "working_dir": "/tmp",
            "checkpoint_signal": "USR2"});
        assert_eq!(
            run_lines(&spec),
            [
                r#"command: sh -c 'echo '\''hi'\'' there' ''"#,
                "env: A, B",
                "working_dir: /tmp",
                "checkpoint_signal: USR2",
            ]
        );
        assert_eq!(
            run_lines(&json!({"command": ["python", "train.py", "--lr", "3e-4"]})),
            ["command: python train.py --lr 3e-4"]
        );
        // A job for a simulated agent: nothing to show.
        assert!(run_lines(&json!({"tenant": "v", "env": {"A": "1"}})).is_empty());
        assert!(run_lines(&Value::Null).is_empty());
    }

    #[test]
    fn refusals_name_the_flag() {
        assert_eq!(
            with_flag("gpus_per_worker", "gpus_per_worker: must be at least 1"),
            "--gpus: must be at least 1"
        );
        assert_eq!(
            with_flag("tenant", "unknown tenant \"x\""),
            "--tenant: unknown tenant \"x\""
        );
        assert_eq!(
            with_flag("id", "id: must be a job number"),
            "id: must be a job number"
        );
    }

    #[test]
    fn ended_jobs_show_their_run_and_flavor() {
        let ended = json!({"tenant": "speech", "starts": 1, "flavor": null,
            "started_at_ms": 1_000, "ended_at_ms": 3_726_000,
            "spec": {"flavors": []}});
        assert_eq!(run_time(&ended, 99_999_999), "1:02:05");
        let running = json!({"started_at_ms": 1_000, "ended_at_ms": null});
        assert_eq!(run_time(&running, 61_000), "1:00");
        assert_eq!(run_time(&json!({"started_at_ms": null}), 5_000), "0:00");

        let mut tenants = TenantFlavors::new();
        assert_eq!(job_flavor(&ended, &tenants), "-");
        tenants.insert("speech".into(), vec!["a100".into()]);
        assert_eq!(job_flavor(&ended, &tenants), "a100");
        tenants.insert("speech".into(), vec!["a100".into(), "h100".into()]);
        assert_eq!(job_flavor(&ended, &tenants), "-");
        let asked = json!({"tenant": "speech", "starts": 1, "spec": {"flavors": ["h100"]}});
        assert_eq!(job_flavor(&asked, &tenants), "h100");
        let holding = json!({"flavor": "b200", "starts": 1, "spec": {"flavors": ["h100"]}});
        assert_eq!(job_flavor(&holding, &tenants), "b200");
        let never_ran = json!({"tenant": "speech", "starts": 0, "spec": {"flavors": ["h100"]}});
        assert_eq!(job_flavor(&never_ran, &tenants), "-");
        // From the log: the last admission's flavor (a requeued job may
        // have been admitted twice).
        let events = json!([
            {"seq": 1, "kind": "job_submitted", "event": {"type": "job_submitted"}},
            {"seq": 4, "kind": "job_admitted", "event": {"type": "job_admitted", "flavor": "h100"}},
            {"seq": 9, "kind": "job_admitted", "event": {"type": "job_admitted", "flavor": "a100"}},
            {"seq": 12, "kind": "job_finished", "event": {"type": "job_finished"}},
        ]);
        assert_eq!(last_admitted_flavor(&events), Some("a100".into()));
        assert_eq!(last_admitted_flavor(&json!([])), None);
    }
}
