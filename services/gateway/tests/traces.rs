//! One job's way from `POST /v1/jobs` to its binding is one OpenTelemetry
//! trace across the services: the gateway's writer and the admission,
//! quota and placement stages run in this process (an in-memory span
//! exporter sees every span) over the real Postgres (a `TestDb`) and NATS
//! JetStream on 127.0.0.1:4222 (`NATS_URL` overrides), each test in a
//! namespace of its own whose streams are deleted when it ends (also on
//! panic). And a malformed `gpusched-job-traces` header is ignored.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use gpusched_bus::async_nats::{self, jetstream};
use gpusched_bus::{encode, msg_id, BatchV1, Envelope, Namespace, JOB_TRACES};
use gpusched_core::{CycleConfig, Phase};
use gpusched_events::Event;
use gpusched_gateway::{router, start, Gateway, Principal, Tokens};
use gpusched_model::{FlavorQuota, JobId, JobSpec, NodeId, NodeSpec, TenantSpec, Timestamp};
use gpusched_runtime::{
    read_view, run_service, Bus, Decider, Leader, LeaseSpec, Log, ServiceConfig, ServiceStats,
};
use gpusched_store::testing::TestDb;
use gpusched_store::NewEvent;
use http_body_util::BodyExt;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

const ADMIN: &str = "admin-secret";
const FLAVOR: &str = "h100";

/// The exporter every span of this process ends in (one subscriber for
/// the whole process: the stages' tasks run on any thread). Spans of the
/// gpusched crates only.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = PROVIDER.get_or_init(|| {
            SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build()
        });
        let ours = tracing_subscriber::filter::Targets::new()
            .with_target("gpusched_runtime", tracing::Level::INFO)
            .with_target("gpusched_gateway", tracing::Level::INFO);
        let subscriber = tracing_subscriber::registry().with(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("test"))
                .with_filter(ours),
        );
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        exporter
    })
}

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_string())
}

/// A fresh namespace; deletes its streams when dropped.
struct Streams(Namespace);

impl Streams {
    fn new() -> Streams {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let root = format!(
            "gpusched_test_traces_{}_{}_{}",
            std::process::id(),
            nanos % 1_000_000_000,
            N.fetch_add(1, Ordering::Relaxed)
        );
        Streams(Namespace::new(&root).unwrap())
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        let streams = [self.0.evt_stream(), self.0.cmd_stream()];
        // The test's runtime is blocked here (or unwinding): delete over a
        // fresh connection on a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(client) = async_nats::connect(nats_url()).await {
                    let js = jetstream::new(client);
                    for s in streams {
                        let _ = js.delete_stream(&s).await;
                    }
                }
            });
        })
        .join();
    }
}

/// The gateway and some stages over a test database and namespace.
struct Stack {
    log: Log,
    bus: Bus,
    gw: Gateway,
    router: Router,
    stats: Vec<Arc<ServiceStats>>,
    shutdown: CancellationToken,
    ns: Namespace,
    // Dropped after the tasks were told to stop: streams, then database.
    _streams: Streams,
    _db: TestDb,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// How the stages run here: a tick (and so a read of the log's tail while
/// the bus is quiet) only every 5 s, so that they take what they decide on
/// from the bus, with its trace context, not from the log first.
fn config(service: &str) -> ServiceConfig {
    let mut cfg = ServiceConfig::new(service, "test");
    cfg.tick = Duration::from_secs(5);
    cfg.lease_ttl = Duration::from_secs(30);
    cfg
}

fn spawn<D: Decider + 'static>(s: &mut Stack, name: &str, make: impl Fn() -> D + Send + 'static) {
    let stats = Arc::new(ServiceStats::default());
    s.stats.push(stats.clone());
    let (log, bus, shutdown, cfg) = (
        s.log.clone(),
        s.bus.clone(),
        s.shutdown.clone(),
        config(name),
    );
    tokio::spawn(async move {
        let _ = run_service(log, bus, cfg, make, shutdown, stats).await;
    });
}

fn tenant() -> TenantSpec {
    TenantSpec {
        priority_preemption: false,
        ..TenantSpec::new("vision", vec![FlavorQuota::new(FLAVOR, 8)])
    }
}

fn spec() -> JobSpec {
    JobSpec {
        tenant: "vision".into(),
        priority: 0,
        workers: 1,
        gpus_per_worker: 2,
        flavors: vec![],
        topology: "node".into(),
        preemptible: true,
        checkpoint: None,
        max_runtime_s: Some(600),
        command: vec![],
        env: Default::default(),
        working_dir: None,
        checkpoint_signal: None,
        array: None,
        after_ok: Vec::new(),
        after: Vec::new(),
    }
}

/// The gateway with a tenant and one 8-GPU node, then `stages` (names of
/// admission, quota, placement) leading.
async fn stack(stages: &[&str]) -> Stack {
    exporter();
    let db = TestDb::new().await;
    let streams = Streams::new();
    let ns = streams.0.clone();
    let log = Log::Postgres(db.store.clone());
    let bus = Bus::connect_nats(&nats_url(), ns.clone())
        .await
        .expect("NATS with JetStream must run (NATS_URL overrides 127.0.0.1:4222)");
    let shutdown = CancellationToken::new();
    let tokens = Tokens::none().with_token(ADMIN, Principal::Admin);
    let (gw, _) = start(log.clone(), bus.clone(), "test", tokens, shutdown.clone());
    let config = vec![
        Event::TopologyConfigured { levels: vec![] },
        Event::TenantConfigured { spec: tenant() },
        Event::NodeAdded {
            node: NodeId(0),
            spec: NodeSpec::new("n0", FLAVOR, 8, &[]),
            at: Timestamp(1),
        },
    ];
    let w = gw.submitter.write(config, None).await.unwrap();
    assert!(
        gw.caught_up(w.seq).await,
        "the view reads the configuration"
    );
    let mut s = Stack {
        router: router(gw.clone()),
        log,
        bus,
        gw,
        stats: Vec::new(),
        shutdown,
        ns,
        _streams: streams,
        _db: db,
    };
    let cycle = CycleConfig::default();
    for name in stages {
        match *name {
            gpusched_admission::SERVICE => spawn(&mut s, name, move || {
                gpusched_admission::AdmissionStage::new(cycle.max_validations)
            }),
            gpusched_quota::SERVICE => {
                spawn(&mut s, name, move || gpusched_quota::QuotaStage::new(cycle))
            }
            gpusched_placement::SERVICE => spawn(&mut s, name, move || {
                gpusched_placement::PlacementStage::new(cycle)
            }),
            other => panic!("no stage {other}"),
        }
    }
    wait_for("every stage leads", Duration::from_secs(30), || {
        s.stats
            .iter()
            .all(|st| st.leading_epoch.load(Ordering::Relaxed) > 0)
    })
    .await;
    // Their feeds bind on the first read; give them a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    s
}

async fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A random trace id and span id, as a W3C `traceparent`.
fn traceparent() -> (TraceId, SpanId, String) {
    static N: AtomicU64 = AtomicU64::new(1);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = u128::from(N.fetch_add(1, Ordering::Relaxed));
    let trace = TraceId::from(nanos ^ (u128::from(std::process::id()) << 64) ^ (n << 100));
    let span = SpanId::from((nanos as u64).rotate_left(17) | 1);
    (trace, span, format!("00-{trace}-{span}-01"))
}

fn attr(s: &SpanData, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

fn spans_of(trace: TraceId) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect()
}

fn show(spans: &[SpanData]) -> String {
    spans
        .iter()
        .map(|s| {
            format!(
                "  {} id={} parent={} job={:?} service={:?}",
                s.name,
                s.span_context.span_id(),
                s.parent_span_id,
                attr(s, "job_id"),
                attr(s, "service"),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits (up to 10 s) until `trace` holds a span of each name in `names`
/// for `job`; returns them in that order.
async fn job_spans(trace: TraceId, job: u64, names: &[&str]) -> Vec<SpanData> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spans = spans_of(trace);
        let found: Vec<Option<&SpanData>> = names
            .iter()
            .map(|n| {
                spans
                    .iter()
                    .find(|s| s.name == *n && attr(s, "job_id") == Some(job.to_string()))
            })
            .collect();
        if found.iter().all(Option::is_some) {
            return found.into_iter().flatten().cloned().collect();
        }
        assert!(
            Instant::now() < deadline,
            "job {job}'s trace lacks some of {names:?}; it holds:\n{}",
            show(&spans)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_job_is_one_trace_from_submit_to_bind() {
    let s = stack(&[
        gpusched_admission::SERVICE,
        gpusched_quota::SERVICE,
        gpusched_placement::SERVICE,
    ])
    .await;
    let (trace, client_span, tp) = traceparent();
    let req = Request::builder()
        .method("POST")
        .uri("/v1/jobs")
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("content-type", "application/json")
        .header("traceparent", &tp)
        .body(Body::from(serde_json::to_vec(&spec()).unwrap()))
        .unwrap();
    let resp = s.router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let id = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"]
        .as_u64()
        .unwrap();
    let gw = s.gw.clone();
    wait_for("the job is bound", Duration::from_secs(30), || {
        read_view(&gw.view).state().job(JobId(id)).map(|j| j.phase) == Some(Phase::Bound)
    })
    .await;

    let spans = job_spans(trace, id, &["submit", "admit", "charge quota", "bind"]).await;
    let all = show(&spans_of(trace));
    let (submit, admit, quota, bind) = (&spans[0], &spans[1], &spans[2], &spans[3]);
    // The HTTP request's span is the submit span's parent, and each
    // service's span is the child of the one before.
    assert_eq!(
        submit.parent_span_id, client_span,
        "submit ← client:\n{all}"
    );
    assert_eq!(
        admit.parent_span_id,
        submit.span_context.span_id(),
        "admit ← submit:\n{all}"
    );
    assert_eq!(
        quota.parent_span_id,
        admit.span_context.span_id(),
        "charge quota ← admit:\n{all}"
    );
    assert_eq!(
        bind.parent_span_id,
        quota.span_context.span_id(),
        "bind ← charge quota:\n{all}"
    );
    let services: Vec<Option<String>> = spans.iter().map(|s| attr(s, "service")).collect();
    let want = ["gateway", "admission", "quota", "placement"].map(|s| Some(s.to_string()));
    assert_eq!(services, want);
    let kinds: Vec<Option<String>> = spans[1..].iter().map(|s| attr(s, "event_kind")).collect();
    let want = ["job_accepted", "job_admitted", "job_bound"].map(|s| Some(s.to_string()));
    assert_eq!(kinds, want);
    // Each stage's span names where its event is in the log.
    let events = s.log.job_events(JobId(id)).await.unwrap();
    for (span, kind) in spans[1..]
        .iter()
        .zip(["job_accepted", "job_admitted", "job_bound"])
    {
        let seq = events
            .iter()
            .find(|e| e.event.kind() == kind)
            .map(|e| e.seq);
        assert_eq!(attr(span, "seq"), seq.map(|q| q.to_string()), "{kind}");
    }
    // Nothing in the job's spans is another trace's: one trace, one job.
    for sp in &spans {
        assert_eq!(sp.span_context.trace_id(), trace);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_job_traces_header_is_ignored() {
    let s = stack(&[gpusched_admission::SERVICE]).await;
    let (trace, span, tp) = traceparent();
    // Ids no other test of this process gives out (they share the
    // exporter; each has a database of its own).
    let (junk, good) = (1_000_001, 1_000_002);
    // Written the way the gateway writes, under a lease of its own.
    let lease = LeaseSpec {
        service: "gateway".into(),
        partition: "raw".into(),
        holder: "test".into(),
        ttl: Duration::from_secs(30),
    };
    let w = Leader::try_take(&s.log, &lease).await.unwrap().unwrap();
    let events: Vec<Event> = [junk, good]
        .iter()
        .map(|&j| Event::JobSubmitted {
            job: JobId(j),
            spec: spec(),
            at: Timestamp(1),
        })
        .collect();
    let batch: Vec<NewEvent> = events.iter().cloned().map(NewEvent::new).collect();
    let out = s.log.append(&batch, &w.fence()).await.unwrap();
    let first = out.first_seq.unwrap();
    let env = Envelope::V1(BatchV1 {
        producer: "gateway".into(),
        epoch: w.epoch(),
        first_seq: first,
        last_seq: first + 1,
        correlation_id: None,
        events,
    });
    // Junk all around, and for `junk` nothing valid; for `good` one pair.
    let header = format!(
        "garbage,{junk}=00-zz-01,=,{junk},{junk}={},x={tp},{good}={tp},\u{1F4A5}",
        tp.to_uppercase()
    );
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(JOB_TRACES, header.as_str());
    headers.insert("traceparent", "also garbage");
    headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id(&env).as_str());
    let Bus::Nats(nats) = &s.bus else {
        panic!("a NATS bus")
    };
    nats.js
        .publish_with_headers(
            s.ns.evt_subject("gateway").unwrap(),
            headers,
            encode(&env).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    w.release().await;

    // Admission decides both, as if there were no header.
    let gw = s.gw.clone();
    wait_for("admission accepted both", Duration::from_secs(30), || {
        let v = read_view(&gw.view);
        [junk, good]
            .iter()
            .all(|&j| v.state().job(JobId(j)).map(|j| j.phase) == Some(Phase::Queued))
    })
    .await;
    assert_eq!(
        s.stats[0].malformed.load(Ordering::Relaxed),
        0,
        "the message was fine"
    );
    // The good pair still counts: its job's span continues the given trace.
    let admit = job_spans(trace, good, &["admit"]).await;
    assert_eq!(admit[0].parent_span_id, span);
    // The other job has no span of its own anywhere.
    let stray: Vec<SpanData> = exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|sp| sp.name == "admit" && attr(sp, "job_id") == Some(junk.to_string()))
        .collect();
    assert!(stray.is_empty(), "{}", show(&stray));
}
