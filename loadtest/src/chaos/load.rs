//! The chaos run's clients: open-loop submissions through the HTTP API,
//! each job under its own `Idempotency-Key`, retried with the same key on
//! a timeout, a 5xx, a 429 or a connection error, and a record of what
//! each job's client saw.
//!
//! Owns: the HTTP client of the chaos run (timeouts, retries, the
//! idempotency keys), the per-job records, and `GET /v1/status`.
//!
//! Must never: retry a job under a new key (that would make a duplicate
//! the run then blames on the services), retry a 4xx other than 429 (a
//! refusal is recorded as such), or read the log.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpusched_model::JobSpec;
use gpusched_runtime::wall_clock;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// How one job's submission ended, as its client saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// A 2xx: the job's id (201 created it, 200: an earlier try had).
    Accepted {
        /// Job id.
        id: u64,
        /// When the reply came, Unix ms.
        at_ms: u64,
        /// 201 (this try created it) rather than 200.
        created: bool,
    },
    /// A 4xx other than 429: refused for good.
    Refused {
        /// HTTP status.
        status: u16,
        /// Its body.
        body: String,
    },
    /// Retries ran out of time.
    GaveUp {
        /// The last failure.
        error: String,
    },
}

/// One job's submission.
#[derive(Clone, Debug, Serialize)]
pub struct JobRecord {
    /// Position in the run's submission order.
    pub index: usize,
    /// Its Idempotency-Key as sent.
    pub key: String,
    /// Its tenant (the gateway scopes keys by tenant).
    pub tenant: String,
    /// When it was first sent, Unix ms.
    pub sent_ms: u64,
    /// Requests sent.
    pub attempts: u32,
    /// Why requests were retried, by reason (`503`, `timeout`, `connect`, …).
    pub retries: BTreeMap<String, u32>,
    /// The end.
    pub outcome: Outcome,
}

impl JobRecord {
    /// The job id, when accepted.
    pub fn id(&self) -> Option<u64> {
        match self.outcome {
            Outcome::Accepted { id, .. } => Some(id),
            _ => None,
        }
    }

    /// The key as the log stores it (`submit:<tenant>:<key>`).
    pub fn log_key(&self) -> String {
        format!("submit:{}:{}", self.tenant, self.key)
    }
}

/// `GET /v1/status`, the parts the chaos run reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct LiveStatus {
    /// Sequence of the last event the gateway's view folded.
    pub seq: u64,
    /// State hash of that view.
    pub state_hash: String,
    /// Jobs known.
    pub jobs: usize,
}

/// The gateway, as a client with retries sees it.
#[derive(Clone, Debug)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    auth: String,
}

/// What one request gave.
enum Try {
    Done(Outcome),
    Retry(String),
    Busy,
}

impl ApiClient {
    /// A client for the gateway at `base` with bearer `token`; a request
    /// that takes over 5 s is abandoned (and retried).
    pub fn new(base: &str, token: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(1))
            .build()
            .context("building the HTTP client")?;
        Ok(ApiClient {
            http,
            base: base.to_string(),
            auth: format!("Bearer {token}"),
        })
    }

    async fn try_once(&self, spec: &JobSpec, key: &str) -> Try {
        #[derive(Deserialize)]
        struct Reply {
            id: u64,
        }
        let r = self
            .http
            .post(format!("{}/v1/jobs", self.base))
            .header("Authorization", &self.auth)
            .header("Idempotency-Key", key)
            .json(spec)
            .send()
            .await;
        let resp = match r {
            Ok(resp) => resp,
            Err(e) if e.is_timeout() => return Try::Retry("timeout".into()),
            Err(e) if e.is_connect() => return Try::Retry("connect".into()),
            Err(_) => return Try::Retry("request".into()),
        };
        let status = resp.status();
        if status.is_success() {
            return match resp.json::<Reply>().await {
                Ok(r) => Try::Done(Outcome::Accepted {
                    id: r.id,
                    at_ms: wall_clock().0,
                    created: status == reqwest::StatusCode::CREATED,
                }),
                // Cut off mid-body: the same key gives the same job.
                Err(_) => Try::Retry("reply cut".into()),
            };
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Try::Busy;
        }
        if status.is_client_error() {
            let body = resp.text().await.unwrap_or_default();
            return Try::Done(Outcome::Refused {
                status: status.as_u16(),
                body: body.chars().take(300).collect(),
            });
        }
        Try::Retry(status.as_u16().to_string())
    }

    /// Submits `spec` under `key` until a 2xx, a refusal, or `give_up`.
    pub async fn submit(
        &self,
        index: usize,
        spec: &JobSpec,
        key: String,
        give_up: Duration,
    ) -> JobRecord {
        let started = Instant::now();
        let mut rec = JobRecord {
            index,
            key,
            tenant: spec.tenant.clone(),
            sent_ms: wall_clock().0,
            attempts: 0,
            retries: BTreeMap::new(),
            outcome: Outcome::GaveUp {
                error: "never sent".into(),
            },
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            rec.attempts += 1;
            let why = match self.try_once(spec, &rec.key).await {
                Try::Done(o) => {
                    rec.outcome = o;
                    return rec;
                }
                Try::Busy => "429".to_string(),
                Try::Retry(why) => why,
            };
            *rec.retries.entry(why.clone()).or_default() += 1;
            if started.elapsed() >= give_up {
                rec.outcome = Outcome::GaveUp { error: why };
                return rec;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// The gateway's status.
    pub async fn status(&self) -> Result<LiveStatus> {
        crate::drive::get_json(&self.http, &self.base, &self.auth, "/v1/status?hash=true").await
    }
}

/// Records of the jobs whose submission has ended, shared while the load runs.
pub type Ledger = Arc<Mutex<Vec<JobRecord>>>;

/// A snapshot of the ledger.
pub fn snapshot(ledger: &Ledger) -> Vec<JobRecord> {
    ledger.lock().map(|l| l.clone()).unwrap_or_default()
}

/// An open-loop stream of submissions.
#[derive(Clone, Debug)]
pub struct Load {
    /// The client.
    pub client: ApiClient,
    /// Jobs, taken in turn (cycling).
    pub specs: Arc<Vec<JobSpec>>,
    /// Submissions per second.
    pub rate: f64,
    /// Keys are `<prefix><i>`.
    pub prefix: String,
    /// At most this many jobs (`None`: until stopped).
    pub limit: Option<usize>,
    /// Retries of one job stop after this long.
    pub give_up: Duration,
    /// Where each job's record goes when its submission ended.
    pub ledger: Ledger,
}

impl Load {
    /// Sends job `i` at `i / rate` seconds after the start until `stop`
    /// (or the limit); returns when every started submission has ended.
    pub async fn run(self, stop: CancellationToken) {
        if self.specs.is_empty() || !(self.rate.is_finite() && self.rate > 0.0) {
            return;
        }
        let start = tokio::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..self.limit.unwrap_or(usize::MAX) {
            let due = start + Duration::from_secs_f64(i as f64 / self.rate);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(due) => {}
            }
            let (client, specs, ledger) =
                (self.client.clone(), self.specs.clone(), self.ledger.clone());
            let key = format!("{}{i}", self.prefix);
            let give_up = self.give_up;
            tasks.spawn(async move {
                let spec = &specs[i % specs.len()];
                let rec = client.submit(i, spec, key, give_up).await;
                if let Ok(mut l) = ledger.lock() {
                    l.push(rec);
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }
}
