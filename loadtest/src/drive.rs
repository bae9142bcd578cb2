//! Driving the deployment: submitting jobs over the gateway's HTTP API
//! (closed loop: as fast as it takes them; open loop: each at its planned
//! time), watching progress through `GET /v1/status`, and sampling what
//! only exists while the run lasts (the stream's message count, peak
//! memory).
//!
//! Owns: the HTTP client (bearer token on every request, an idempotency
//! key per job), the progress bar, and the samples.
//!
//! Must never: read or write the log directly (that is `metrics`), or
//! decide anything a service decides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use gpusched_bus::{async_nats, Namespace};
use gpusched_model::JobSpec;
use gpusched_runtime::StatsSnapshot;
use indicatif::{ProgressBar, ProgressStyle};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::workload::Planned;

/// Submits jobs to the gateway.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    auth: String,
    run: String,
}

/// `GET {base}{path}` sending `auth`, its JSON body read as `T`; an
/// answer other than 2xx is an error naming the path.
pub(crate) async fn get_json<T: DeserializeOwned>(
    http: &reqwest::Client,
    base: &str,
    auth: &str,
    path: &str,
) -> Result<T> {
    let r = http
        .get(format!("{base}{path}"))
        .header("Authorization", auth)
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    if !r.status().is_success() {
        bail!("GET {path}: {}", r.status());
    }
    r.json().await.with_context(|| format!("reading {path}"))
}

/// `GET /v1/status`, the parts the load test reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Status {
    /// Jobs known.
    pub jobs: usize,
    /// Jobs per phase (lower-case phase names).
    #[serde(default)]
    pub phases: BTreeMap<String, u64>,
}

impl Status {
    fn count(&self, phases: &[&str]) -> u64 {
        phases
            .iter()
            .map(|p| self.phases.get(*p).copied().unwrap_or(0))
            .sum()
    }

    /// Jobs not bound yet (submitted, queued, admitted).
    pub fn waiting(&self) -> u64 {
        self.count(&["submitted", "queued", "admitted"])
    }

    /// Jobs that got GPUs at some point, or ended (bound or later).
    pub fn bound_or_later(&self) -> u64 {
        self.count(&[
            "bound",
            "running",
            "preempting",
            "succeeded",
            "failed",
            "cancelled",
        ])
    }

    /// Jobs refused by admission.
    pub fn rejected(&self) -> u64 {
        self.count(&["rejected"])
    }

    /// Jobs that ended.
    pub fn ended(&self) -> u64 {
        self.count(&["succeeded", "failed", "cancelled", "rejected"])
    }
}

/// What submitting a list of jobs gave.
#[derive(Clone, Debug, Default)]
pub struct SubmitOutcome {
    /// Jobs the gateway accepted (201).
    pub accepted: u64,
    /// Requests that failed (after retries).
    pub failed: u64,
    /// Wall time from the first to the last reply, seconds.
    pub seconds: f64,
    /// Client-side request latencies, ms.
    pub latencies_ms: Vec<f64>,
    /// Open loop: how late submissions started, worst case, ms.
    pub worst_lag_ms: f64,
    /// Batches: items the gateway answered busy (429/503) and that were
    /// sent again.
    pub resent: u64,
}

/// What one batch request gave, its busy items sent again until each was
/// in or refused.
#[derive(Debug, Default)]
pub struct BatchSent {
    /// Jobs accepted.
    pub accepted: u64,
    /// Each refused item's result.
    pub refused: Vec<String>,
    /// Items sent again after a busy answer.
    pub resent: u64,
}

impl Client {
    /// A client for the gateway at `base`, sending `token`; `run` scopes
    /// the idempotency keys.
    pub fn new(base: &str, token: &str, run: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .timeout(Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        Ok(Client {
            http,
            base: base.to_string(),
            auth: format!("Bearer {token}"),
            run: run.to_string(),
        })
    }

    /// Submits one job under idempotency key `<run>-<key>`; retries a
    /// failed request a few times and a 429 (back-pressure) until it is
    /// taken (the key makes both safe).
    pub async fn submit(&self, spec: &JobSpec, key: &str) -> Result<u64> {
        #[derive(Deserialize)]
        struct Reply {
            id: u64,
        }
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let r = self
                .http
                .post(format!("{}/v1/jobs", self.base))
                .header("Authorization", &self.auth)
                .header("Idempotency-Key", format!("{}-{key}", self.run))
                .json(spec)
                .send()
                .await;
            let err = match r {
                Ok(resp) if resp.status().is_success() => {
                    let reply: Reply = resp.json().await.context("reading the submit reply")?;
                    return Ok(reply.id);
                }
                // Back-pressure: the gateway's write queue is full. Not a
                // failure; wait and send again (the key keeps it safe).
                Ok(resp) if resp.status() == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    attempt -= 1;
                    continue;
                }
                Ok(resp) => {
                    let status = resp.status();
                    let body = resp.text().await.unwrap_or_default();
                    if status.is_client_error() {
                        bail!("submit refused: {status} {body}");
                    }
                    anyhow::anyhow!("submit failed: {status} {body}")
                }
                Err(e) => anyhow::Error::new(e).context("submit request"),
            };
            if attempt >= 5 {
                return Err(err);
            }
            tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
        }
    }

    /// Submits `items` (key, spec) through `POST /v1/jobs:batch`, sending
    /// the items that found the gateway busy or its log down again (their
    /// keys keep it safe) until each is in or refused. Returns the jobs
    /// accepted, the refusals of the others, and how many were sent again.
    pub async fn submit_batch(&self, items: &[(String, &JobSpec)]) -> Result<BatchSent> {
        let mut pending: Vec<&(String, &JobSpec)> = items.iter().collect();
        let mut sent = BatchSent::default();
        let mut failures = 0u32;
        while !pending.is_empty() {
            let jobs: Vec<serde_json::Value> = pending
                .iter()
                .map(|(k, spec)| {
                    serde_json::json!({"spec": spec, "idempotency_key": format!("{}-{k}", self.run)})
                })
                .collect();
            let r = self
                .http
                .post(format!("{}/v1/jobs:batch", self.base))
                .header("Authorization", &self.auth)
                .json(&serde_json::json!({ "jobs": jobs }))
                .send()
                .await;
            let reply: serde_json::Value = match r {
                Ok(resp) if resp.status().is_success() => {
                    resp.json().await.context("reading the batch reply")?
                }
                Ok(resp) if resp.status().is_client_error() && resp.status() != 429 => {
                    let status = resp.status();
                    bail!(
                        "batch refused: {status} {}",
                        resp.text().await.unwrap_or_default()
                    );
                }
                other => {
                    failures += 1;
                    if failures >= 5 {
                        bail!("batch submission kept failing: {other:?}");
                    }
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(failures))).await;
                    continue;
                }
            };
            let results = reply["results"].as_array().cloned().unwrap_or_default();
            if results.len() != pending.len() {
                bail!("{} results for {} jobs", results.len(), pending.len());
            }
            let mut again = Vec::new();
            for (item, r) in pending.into_iter().zip(&results) {
                match r["status"].as_u64() {
                    Some(200 | 201) => sent.accepted += 1,
                    Some(429 | 503) => again.push(item),
                    _ => sent.refused.push(r.to_string()),
                }
            }
            if !again.is_empty() {
                sent.resent += again.len() as u64;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            pending = again;
        }
        Ok(sent)
    }

    /// Submits `s.jobs` as fast as replies come, `batch` jobs a request
    /// (`POST /v1/jobs:batch`) with at most `s.in_flight` requests open.
    pub async fn submit_all_batched(
        &self,
        s: &Submission<'_>,
        batch: usize,
        cancel: &CancellationToken,
    ) -> Result<SubmitOutcome> {
        let started = Instant::now();
        let (mut accepted, mut failed, mut resent) = (0u64, 0u64, 0u64);
        let mut latencies_ms = Vec::with_capacity(s.jobs.len());
        let chunks: Vec<Vec<(String, &JobSpec)>> = s
            .jobs
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("{}{i}", s.key_prefix), &p.spec))
            .collect::<Vec<_>>()
            .chunks(batch.max(1))
            .map(<[_]>::to_vec)
            .collect();
        let mut run = futures::stream::iter(chunks.iter().map(|chunk| async move {
            let t = Instant::now();
            let out = self.submit_batch(chunk).await;
            (chunk.len(), out, t.elapsed().as_secs_f64() * 1000.0)
        }))
        .buffer_unordered(s.in_flight.max(1));
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                n = run.next() => n,
            };
            let Some((n, out, ms)) = next else { break };
            match out {
                Ok(sent) => {
                    accepted += sent.accepted;
                    failed += sent.refused.len() as u64;
                    resent += sent.resent;
                    if let Some(first) = sent.refused.first() {
                        eprintln!("first refused item: {first}");
                    }
                }
                Err(e) => {
                    failed += n as u64;
                    eprintln!("batch failed: {e:#}");
                }
            }
            latencies_ms.extend(std::iter::repeat_n(ms, n));
            s.bar.inc(n as u64);
        }
        Ok(SubmitOutcome {
            accepted,
            failed,
            seconds: started.elapsed().as_secs_f64(),
            latencies_ms,
            worst_lag_ms: 0.0,
            resent,
        })
    }

    /// The gateway's status.
    pub async fn status(&self) -> Result<Status> {
        get_json(&self.http, &self.base, &self.auth, "/v1/status").await
    }

    /// Submits `s.jobs` a request each, with at most `s.in_flight` requests
    /// open. With `open_loop` each job is sent at its planned offset from
    /// the start whatever the replies; otherwise as fast as replies come.
    pub async fn submit_all(
        &self,
        s: &Submission<'_>,
        open_loop: bool,
        cancel: &CancellationToken,
    ) -> Result<SubmitOutcome> {
        let started = Instant::now();
        let accepted = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let lat = Arc::new(Mutex::new(Vec::with_capacity(s.jobs.len())));
        let lag = Arc::new(Mutex::new(0f64));
        let first_error: Arc<Mutex<Option<String>>> = Arc::default();
        let stream = futures::stream::iter(s.jobs.iter().enumerate()).map(|(i, p)| {
            let (accepted, failed, lat, lag, first_error) = (
                accepted.clone(),
                failed.clone(),
                lat.clone(),
                lag.clone(),
                first_error.clone(),
            );
            let key = format!("{}{i}", s.key_prefix);
            async move {
                if open_loop {
                    let due = started + p.at;
                    tokio::time::sleep_until(due.into()).await;
                    let late = Instant::now().saturating_duration_since(due).as_secs_f64() * 1000.0;
                    if let Ok(mut l) = lag.lock() {
                        *l = l.max(late);
                    }
                }
                let t = Instant::now();
                match self.submit(&p.spec, &key).await {
                    Ok(_) => {
                        accepted.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut l) = lat.lock() {
                            l.push(t.elapsed().as_secs_f64() * 1000.0);
                        }
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut f) = first_error.lock() {
                            f.get_or_insert_with(|| format!("{e:#}"));
                        }
                    }
                }
                s.bar.inc(1);
            }
        });
        // Open loop: sends are paced by their due times, so the bound on
        // open requests is only a safety net.
        let limit = if open_loop {
            s.in_flight.max(4096)
        } else {
            s.in_flight.max(1)
        };
        let mut run = stream.buffer_unordered(limit);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                n = run.next() => if n.is_none() { break },
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        if let Some(e) = first_error.lock().ok().and_then(|f| f.clone()) {
            eprintln!("first submission error: {e}");
        }
        let latencies_ms = lat.lock().map(|l| l.clone()).unwrap_or_default();
        let worst_lag_ms = lag.lock().map(|l| *l).unwrap_or(0.0);
        Ok(SubmitOutcome {
            accepted: accepted.load(Ordering::Relaxed),
            failed: failed.load(Ordering::Relaxed),
            seconds,
            latencies_ms,
            worst_lag_ms,
            resent: 0,
        })
    }
}

/// Jobs to submit, and how: at most `in_flight` requests open, each job's
/// idempotency key `key_prefix` followed by its index (the prefix keeps
/// the keys of separate batches apart), each counted on `bar`.
#[derive(Clone, Copy)]
pub struct Submission<'a> {
    /// The jobs.
    pub jobs: &'a [Planned],
    /// Requests open at once.
    pub in_flight: usize,
    /// Prefix of every job's idempotency key.
    pub key_prefix: &'a str,
    /// Counts each job sent.
    pub bar: &'a ProgressBar,
}

/// A progress bar for `len` items.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let b = ProgressBar::new(len);
    let template = format!("{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what}  {{msg}}");
    b.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

/// Samples taken while the run lasts.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// Messages in the event stream, by second since the origin.
    pub stream_messages: BTreeMap<i64, u64>,
    /// Every service's stats four times a second: (seconds since the
    /// origin, snapshot).
    pub progress: Vec<(f64, StatsSnapshot)>,
}

impl Samples {
    /// Messages per second over the whole sampling, and per second.
    pub fn rates(&self) -> BTreeMap<i64, f64> {
        let mut out = BTreeMap::new();
        let mut prev: Option<(i64, u64)> = None;
        for (&s, &m) in &self.stream_messages {
            if let Some((ps, pm)) = prev {
                let dt = (s - ps).max(1) as f64;
                out.insert(s, m.saturating_sub(pm) as f64 / dt);
            }
            prev = Some((s, m));
        }
        out
    }
}

fn read_all_stats(dir: &Path, t: f64, into: &mut Vec<(f64, StatsSnapshot)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.to_string_lossy().ends_with(".stats.json") {
            if let Some(s) = crate::stack::read_stats(&path) {
                into.push((t, s));
            }
        }
    }
}

/// Samples the run's event stream (each second) and the services' stats
/// files in `stats_dir` (four times a second) until `stop`; times are
/// seconds since `origin`.
pub fn spawn_sampler(
    nats_url: String,
    namespace: String,
    stats_dir: PathBuf,
    origin: Instant,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Samples> {
    tokio::spawn(async move {
        let mut samples = Samples::default();
        let Ok(client) = async_nats::connect(&nats_url).await else {
            return samples;
        };
        let js = async_nats::jetstream::new(client);
        let Ok(ns) = Namespace::new(&namespace) else {
            return samples;
        };
        let name = ns.evt_stream();
        let mut tick = 0u64;
        loop {
            if tick.is_multiple_of(4) {
                if let Ok(mut s) = js.get_stream(&name).await {
                    if let Ok(info) = s.info().await {
                        let at = origin.elapsed().as_secs_f64().round() as i64;
                        samples.stream_messages.insert(at, info.state.messages);
                    }
                }
            }
            tick += 1;
            read_all_stats(
                &stats_dir,
                origin.elapsed().as_secs_f64(),
                &mut samples.progress,
            );
            tokio::select! {
                _ = stop.cancelled() => return samples,
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        }
    })
}

/// Polls the gateway until `done(status)` holds, a service dies, `cancel`
/// fires or `timeout` passes, showing progress; returns the last status.
#[allow(clippy::too_many_arguments)]
pub async fn wait_until(
    client: &Client,
    stack: &mut crate::stack::Stack,
    bar: &ProgressBar,
    progress: impl Fn(&Status) -> u64,
    done: impl Fn(&Status) -> bool,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<Status> {
    let deadline = Instant::now() + timeout;
    let mut last = Status::default();
    loop {
        if let Ok(s) = client.status().await {
            bar.set_position(progress(&s));
            bar.set_message(format!(
                "waiting {}, bound/running {}, ended {}",
                s.waiting(),
                s.bound_or_later(),
                s.ended()
            ));
            let finished = done(&s);
            last = s;
            if finished {
                return Ok(last);
            }
        }
        if let Some(why) = stack.crashed() {
            bail!("{why}");
        }
        if cancel.is_cancelled() {
            bail!("interrupted");
        }
        if Instant::now() > deadline {
            bail!(
                "timed out after {:.0} s: {} jobs waiting, {} bound or later",
                timeout.as_secs_f64(),
                last.waiting(),
                last.bound_or_later()
            );
        }
        stack.sample_rss();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_rates_are_differences_per_second() {
        let s = Samples {
            stream_messages: [(0, 0), (1, 100), (3, 300)].into_iter().collect(),
            progress: Vec::new(),
        };
        let r: Vec<f64> = s.rates().into_values().collect();
        assert_eq!(r, vec![100.0, 100.0]);
    }

    #[test]
    fn status_groups_phases() {
        let s: Status = serde_json::from_str(
            r#"{"seq":9,"jobs":6,"phases":{"queued":1,"admitted":2,"running":2,"succeeded":1},"state_hash":"x","superseded":0}"#,
        )
        .unwrap_or_default();
        assert_eq!((s.waiting(), s.bound_or_later(), s.ended()), (3, 3, 1));
    }
}
