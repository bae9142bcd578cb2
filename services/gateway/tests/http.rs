//! The HTTP API, route by route, against the gateway's real writer and
//! view over the embedded log: validation, auth, pagination, cancellation,
//! admin changes, the event stream, the OpenAPI document, and a property
//! test that no request, however malformed, gets a 5xx.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use gpusched_events::Event;
use gpusched_gateway::{router, start, Gateway, Principal, Tokens};
use gpusched_model::{FlavorQuota, NodeId, NodeSpec, TenantSpec, Timestamp};
use gpusched_runtime::{Bus, Log, MemLog};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const ADMIN: &str = "admin-secret";
const VISION: &str = "vision-secret";
const SPEECH: &str = "speech-secret";
const H100: &str = "h100-80g";

struct Api {
    router: Router,
    gw: Gateway,
    shutdown: CancellationToken,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn tenant(name: &str, nominal: u32) -> TenantSpec {
    TenantSpec {
        cohort: Some("research".into()),
        ..TenantSpec::new(name, vec![FlavorQuota::new(H100, nominal)])
    }
}

/// Two tenants; 4 nodes × 8 GPUs in one rack, two blocks of two.
async fn api() -> Api {
    let log = Log::Memory(MemLog::new());
    let tokens = Tokens::none()
        .with_token(ADMIN, Principal::Admin)
        .with_token(VISION, Principal::Tenant("vision".into()))
        .with_token(SPEECH, Principal::Tenant("speech".into()));
    let shutdown = CancellationToken::new();
    let (gw, _tasks) = start(log, Bus::memory(), "test", tokens, shutdown.clone());
    let mut events = vec![
        Event::TopologyConfigured {
            levels: vec!["rack".into(), "block".into()],
        },
        Event::TenantConfigured {
            spec: tenant("vision", 16),
        },
        Event::TenantConfigured {
            spec: tenant("speech", 16),
        },
    ];
    for i in 0..4u32 {
        events.push(Event::NodeAdded {
            node: NodeId(i),
            spec: NodeSpec::new(
                format!("n{i}"),
                H100,
                8,
                &["rack-0", &format!("block-{}", i / 2)],
            ),
            at: Timestamp(1),
        });
    }
    let w = gw.submitter.write(events, None).await.unwrap();
    assert!(gw.caught_up(w.seq).await);
    Api {
        router: router(gw.clone()),
        gw,
        shutdown,
    }
}

impl Api {
    async fn raw(&self, req: Request<Body>) -> (StatusCode, Value) {
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, v)
    }

    async fn call(
        &self,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let req = match body {
            Some(v) => b
                .header("content-type", "application/json")
                .body(Body::from(v.to_string())),
            None => b.body(Body::empty()),
        };
        self.raw(req.unwrap()).await
    }

    async fn submit(&self, token: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", "/v1/jobs", Some(token), Some(body)).await
    }

    async fn submit_ok(&self, token: &str, body: Value) -> u64 {
        let (s, v) = self.submit(token, body).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["id"].as_u64().unwrap()
    }

    /// Waits until the view holds `seq`.
    async fn sync(&self, seq: u64) {
        assert!(self.gw.caught_up(seq).await);
    }
}

fn job(tenant: &str, workers: u32, gpus: u32) -> Value {
    json!({"tenant": tenant, "workers": workers, "gpus_per_worker": gpus})
}

fn field(v: &Value) -> &str {
    v["error"]["field"].as_str().unwrap_or("")
}

#[tokio::test]
async fn submit_validates_every_field_and_names_it() {
    let api = api().await;
    let cases: Vec<(Value, &str, &str)> = vec![
        (job("vision", 1, 0), "gpus_per_worker", "at least 1"),
        (job("vision", 0, 1), "workers", "at least 1"),
        (
            json!({"tenant": "vision", "workers": -1, "gpus_per_worker": 1}),
            "workers",
            "invalid value",
        ),
        (
            json!({"tenant": "vision", "workers": 3, "gpus_per_worker": 8, "topology": "block"}),
            "workers",
            "fits in no block",
        ),
        (
            json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "flavors": ["tpu"]}),
            "flavors",
            "unknown flavor",
        ),
        (
            json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "topology": "pod"}),
            "topology",
            "unknown level",
        ),
        (job("nobody", 1, 1), "tenant", "unknown tenant"),
        (
            json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "colour": "red"}),
            "colour",
            "unknown field",
        ),
        (
            json!({"workers": 1, "gpus_per_worker": 1}),
            "tenant",
            "missing field",
        ),
        (
            json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "max_runtime_s": 0}),
            "max_runtime_s",
            "at least 1",
        ),
    ];
    for (body, want_field, want_rule) in cases {
        let (s, v) = api.submit(ADMIN, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body} -> {v}");
        assert_eq!(field(&v), want_field, "{body} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want_rule), "{body} -> {msg}");
    }
    // Bad JSON, wrong content type, too large: nothing written.
    let req = Request::post("/v1/jobs")
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("content-type", "application/json")
        .body(Body::from("{\"tenant\": "))
        .unwrap();
    let (s, v) = api.raw(req).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "bad_json");
    let req = Request::post("/v1/jobs")
        .header("authorization", format!("Bearer {ADMIN}"))
        .body(Body::from(job("vision", 1, 1).to_string()))
        .unwrap();
    assert_eq!(api.raw(req).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let big = json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1,
        "flavors": vec!["x".repeat(1000); 400]});
    assert_eq!(
        api.submit(ADMIN, big).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let (_, st) = api.call("GET", "/v1/status", Some(ADMIN), None).await;
    assert_eq!(st["jobs"], 0, "a refused submission wrote nothing: {st}");
}

#[tokio::test]
async fn unknown_tenant_names_the_field_and_lists_the_tenants_the_token_may_use() {
    let api = api().await;
    // The admin token may use every tenant: all are listed, by name.
    let (s, v) = api.submit(ADMIN, job("nobody", 1, 1)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(field(&v), "tenant", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("unknown tenant \"nobody\""), "{msg}");
    assert!(msg.ends_with("known tenants: speech, vision"), "{msg}");
    // A tenant token may use its own tenant only: only that one is listed.
    let (s, v) = api.submit(VISION, job("nobody", 1, 1)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(field(&v), "tenant", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("unknown tenant \"nobody\""), "{msg}");
    assert!(msg.ends_with("known tenants: vision"), "{msg}");
    assert!(!msg.contains("speech"), "{msg}");
    // Another tenant that exists is still forbidden to it.
    let (s, v) = api.submit(VISION, job("speech", 1, 1)).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(field(&v), "tenant", "{v}");
}

#[tokio::test]
async fn numbers_above_what_the_log_holds_are_refused_naming_the_field() {
    let api = api().await;
    let over = (i64::MAX as u64 + 1).to_string();
    for (uri, f) in [
        (format!("/v1/jobs/{over}"), "id"),
        (format!("/v1/jobs/{over}/events"), "id"),
        (format!("/v1/jobs?cursor={over}"), "cursor"),
        (format!("/v1/events?from={over}"), "from"),
        ("/v1/events?limit=0".to_string(), "limit"),
        ("/v1/events?limit=10001".to_string(), "limit"),
        ("/v1/jobs?limit=1001".to_string(), "limit"),
        ("/v1/jobs?state=queued,%20running".to_string(), "state"),
    ] {
        let (s, v) = api.call("GET", &uri, Some(ADMIN), None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}: {v}");
        assert_eq!(field(&v), f, "{uri}: {v}");
    }
    let req = Request::get("/v1/events")
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("last-event-id", over.as_str())
        .body(Body::empty())
        .unwrap();
    let (s, v) = api.raw(req).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(field(&v), "Last-Event-ID", "{v}");
    // The largest allowed values are taken.
    let max = i64::MAX.to_string();
    for uri in [
        format!("/v1/events?from={max}&limit=10000"),
        format!("/v1/jobs?cursor={max}&limit=1000"),
    ] {
        let (s, v) = api.call("GET", &uri, Some(ADMIN), None).await;
        assert_eq!(s, StatusCode::OK, "{uri}: {v}");
    }
}

#[tokio::test]
async fn idempotency_key_gives_the_same_job_and_refuses_a_different_body() {
    let api = api().await;
    let post = |body: Value, key: &str| {
        Request::post("/v1/jobs")
            .header("authorization", format!("Bearer {VISION}"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (s1, v1) = api.raw(post(job("vision", 1, 2), "k1")).await;
    assert_eq!(s1, StatusCode::CREATED, "{v1}");
    let (s2, v2) = api.raw(post(job("vision", 1, 2), "k1")).await;
    assert_eq!(s2, StatusCode::OK, "{v2}");
    assert_eq!(v1["id"], v2["id"]);
    let (s3, v3) = api.raw(post(job("vision", 1, 4), "k1")).await;
    assert_eq!(s3, StatusCode::CONFLICT, "{v3}");
    assert_eq!(field(&v3), "Idempotency-Key");
    let (s4, v4) = api.raw(post(job("vision", 1, 2), "")).await;
    assert_eq!(s4, StatusCode::BAD_REQUEST, "{v4}");
    assert_eq!(field(&v4), "Idempotency-Key");
}

async fn batch(api: &Api, token: Option<&str>, body: Value) -> (StatusCode, Value) {
    api.call("POST", "/v1/jobs:batch", token, Some(body)).await
}

#[tokio::test]
async fn a_batch_checks_each_job_on_its_own_and_writes_the_valid_ones() {
    let api = api().await;
    let items = json!({"jobs": [
        {"spec": job("vision", 1, 1), "idempotency_key": "b-0"},
        {"spec": job("nobody", 1, 1)},
        {"spec": {"tenant": "vision", "workers": "two", "gpus_per_worker": 1}},
        {"spec": job("speech", 1, 1)},
        {"spec": job("vision", 1, 1), "idempotency_key": ""},
        {"spec": job("vision", 2, 8), "idempotency_key": "b-5"},
        {"nonsense": 1},
        {"spec": job("vision", 1, 1), "idempotency_key": "b-0"},
        {"spec": job("vision", 1, 64)},
    ]});
    let (s, v) = batch(&api, Some(VISION), items.clone()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let r = v["results"].as_array().unwrap();
    let statuses: Vec<u64> = r.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(
        statuses,
        [201, 400, 400, 403, 400, 201, 400, 200, 400],
        "{v}"
    );
    assert_eq!(
        (
            v["created"].as_u64(),
            v["existing"].as_u64(),
            v["failed"].as_u64()
        ),
        (Some(2), Some(1), Some(6))
    );
    let item_field = |i: usize| r[i]["error"]["field"].as_str().unwrap_or("").to_string();
    assert_eq!(item_field(1), "jobs[1].spec.tenant");
    assert_eq!(item_field(2), "jobs[2].spec.workers");
    assert_eq!(item_field(3), "jobs[3].spec.tenant");
    assert_eq!(item_field(4), "jobs[4].idempotency_key");
    assert!(item_field(6).starts_with("jobs[6]"), "{}", r[6]);
    assert!(
        r[1]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("jobs[1].spec.tenant: unknown tenant"),
        "{}",
        r[1]
    );
    assert!(item_field(8).starts_with("jobs[8].spec."), "{}", r[8]);
    // The same key twice in one batch: one job.
    assert_eq!(r[7]["id"], r[0]["id"], "{v}");
    // Exactly the two valid jobs were written.
    api.sync(r[5]["seq"].as_u64().unwrap()).await;
    let (_, listed) = api.call("GET", "/v1/jobs", Some(VISION), None).await;
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 2, "{listed}");

    // Sent again: the keyed jobs are the same ones, nothing new is written.
    let (_, again) = batch(&api, Some(VISION), items).await;
    let r2 = again["results"].as_array().unwrap();
    assert_eq!(
        (r2[0]["status"].as_u64(), r2[5]["status"].as_u64()),
        (Some(200), Some(200))
    );
    assert_eq!((&r2[0]["id"], &r2[5]["id"]), (&r[0]["id"], &r[5]["id"]));
    assert_eq!(again["created"], 0, "{again}");
}

async fn post_array(api: &Api, token: &str, body: Value, key: &str) -> (StatusCode, Value) {
    let req = Request::post("/v1/arrays")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.to_string()))
        .unwrap();
    api.raw(req).await
}

#[tokio::test]
async fn a_job_array_is_written_whole_read_by_index_and_cancelled_as_one() {
    let api = api().await;
    let body = json!({"spec": job("vision", 1, 1), "indices": "0-4,10"});
    let (s, a) = post_array(&api, VISION, body.clone(), "arr-1").await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    assert_eq!(a["tasks"], 6);
    let id = a["id"].as_u64().unwrap();
    // The same request again is the same array; the key with another
    // request is refused.
    let (s, again) = post_array(&api, VISION, body, "arr-1").await;
    assert_eq!((s, &again["id"]), (StatusCode::OK, &a["id"]), "{again}");
    for indices in ["0-5", "0-4,10-12", "0-4,11", "1-4,10"] {
        let other = json!({"spec": job("vision", 1, 1), "indices": indices});
        let (s, v) = post_array(&api, VISION, other, "arr-1").await;
        assert_eq!(s, StatusCode::CONFLICT, "{indices}: {v}");
    }

    api.sync(a["seq"].as_u64().unwrap()).await;
    let path = format!("/v1/arrays/{id}");
    let (s, arr) = api.call("GET", &path, Some(VISION), None).await;
    assert_eq!(s, StatusCode::OK, "{arr}");
    let tasks = arr["tasks"].as_array().unwrap();
    let indices: Vec<u64> = tasks.iter().map(|t| t["index"].as_u64().unwrap()).collect();
    assert_eq!(indices, [0, 1, 2, 3, 4, 10]);
    assert_eq!(tasks[0]["id"], id, "the first task names the array");
    assert_eq!(arr["states"], json!({"submitted": 6}));
    let last = tasks[5]["id"].as_u64().unwrap();
    let (_, j) = api
        .call("GET", &format!("/v1/jobs/{last}"), Some(VISION), None)
        .await;
    assert_eq!(j["spec"]["array"], json!({"array": id, "index": 10}), "{j}");
    // Another tenant sees no such array.
    for m in ["GET", "DELETE"] {
        let (s, _) = api.call(m, &path, Some(SPEECH), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{m}");
    }

    // One task cancelled on its own, then the array: the rest go at once.
    let first = tasks[0]["id"].as_u64().unwrap();
    let (s, _) = api
        .call("DELETE", &format!("/v1/jobs/{first}"), Some(VISION), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, c) = api.call("DELETE", &path, Some(VISION), None).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(
        (&c["cancelled"], &c["cancelling"], &c["ended"]),
        (&json!(5), &json!(0), &json!(1)),
        "{c}"
    );
    let (_, arr) = api.call("GET", &path, Some(VISION), None).await;
    assert_eq!(arr["states"], json!({"cancelled": 6}), "read-your-writes");
    // The refused repeats wrote nothing: these six are all the jobs.
    let (_, listed) = api.call("GET", "/v1/jobs", Some(ADMIN), None).await;
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 6, "{listed}");
    let (_, c) = api.call("DELETE", &path, Some(VISION), None).await;
    assert_eq!(
        (&c["cancelled"], &c["ended"]),
        (&json!(0), &json!(6)),
        "{c}"
    );
    let (s, _) = api.call("GET", "/v1/arrays/999", Some(VISION), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_bad_array_is_refused_whole_naming_the_field() {
    let api = api().await;
    let cases = [
        (
            json!({"spec": job("vision", 1, 1), "indices": "5-1"}),
            "indices",
        ),
        (
            json!({"spec": job("vision", 1, 1), "indices": "0-1000"}),
            "indices",
        ),
        (
            json!({"spec": job("vision", 1, 1), "indices": "1,1"}),
            "indices",
        ),
        (
            json!({"spec": job("vision", 1, 1), "indices": ""}),
            "indices",
        ),
        (
            json!({"spec": job("nobody", 1, 1), "indices": "0-3"}),
            "spec.tenant",
        ),
        (
            json!({"spec": job("vision", 1, 64), "indices": "0-3"}),
            "spec.workers",
        ),
        (json!({"spec": job("vision", 1, 1)}), ""),
        (
            json!({"spec": job("vision", 1, 1), "indices": "0", "x": 1}),
            "",
        ),
    ];
    for (i, (body, want)) in cases.into_iter().enumerate() {
        let (s, v) = post_array(&api, VISION, body, &format!("bad-{i}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "case {i}: {v}");
        if !want.is_empty() {
            assert_eq!(field(&v), want, "case {i}: {v}");
        }
    }
    let (s, v) = post_array(
        &api,
        SPEECH,
        json!({"spec": job("vision", 1, 1), "indices": "0"}),
        "k",
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    // A job's place in an array is the gateway's to set, on either path.
    let mut spec = job("vision", 1, 1);
    spec["array"] = json!({"array": 1, "index": 0});
    let (s, v) = api.submit(VISION, spec.clone()).await;
    assert_eq!((s, field(&v)), (StatusCode::BAD_REQUEST, "array"), "{v}");
    let (_, v) = batch(&api, Some(VISION), json!({"jobs": [{"spec": spec}]})).await;
    assert_eq!(
        v["results"][0]["error"]["field"], "jobs[0].spec.array",
        "{v}"
    );
    // Nothing was written by any of them: a job written after them is
    // the only one.
    let (_, ok) = api.submit(VISION, job("vision", 1, 1)).await;
    api.sync(ok["seq"].as_u64().unwrap()).await;
    let (_, listed) = api.call("GET", "/v1/jobs", Some(ADMIN), None).await;
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 1, "{listed}");
}

#[tokio::test]
async fn a_batch_is_one_to_a_thousand_jobs_in_up_to_eight_mib() {
    let api = api().await;
    for (jobs, why) in [(0, "none"), (1001, "too many")] {
        let items: Vec<Value> = (0..jobs)
            .map(|_| json!({"spec": job("vision", 1, 1)}))
            .collect();
        let (s, v) = batch(&api, Some(VISION), json!({ "jobs": items })).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{why}: {v}");
        assert_eq!(field(&v), "jobs", "{why}: {v}");
    }
    let (s, v) = batch(&api, Some(VISION), json!({"items": []})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        batch(&api, None, json!({"jobs": [{"spec": job("vision", 1, 1)}]}))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    // A thousand jobs with commands: over the single-job body limit, all
    // written, in order.
    let long = "x".repeat(400);
    let items: Vec<Value> = (0..1000)
        .map(|i| {
            let mut spec = job("vision", 1, 1);
            spec["command"] = json!(["train.sh", long, i.to_string()]);
            json!({"spec": spec, "idempotency_key": format!("k-{i}")})
        })
        .collect();
    let body = json!({ "jobs": items });
    assert!(body.to_string().len() > gpusched_gateway::MAX_BODY_BYTES);
    let (s, v) = batch(&api, Some(VISION), body).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "{}",
        v.to_string().chars().take(400).collect::<String>()
    );
    assert_eq!(v["created"], 1000);
    let ids: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids in the order of the items"
    );
}

#[tokio::test]
async fn tokens_limit_who_sees_and_does_what() {
    let api = api().await;
    let v = api.submit_ok(VISION, job("vision", 1, 1)).await;
    let (_, st) = api.call("GET", "/v1/status", Some(ADMIN), None).await;
    api.sync(st["seq"].as_u64().unwrap()).await;

    // No token, a bad scheme, an unknown token: 401.
    for auth in [None, Some("Basic abc"), Some("Bearer nope")] {
        let mut b = Request::get(format!("/v1/jobs/{v}"));
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        let (s, body) = api.raw(b.body(Body::empty()).unwrap()).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{auth:?}: {body}");
    }
    // Another tenant's job is not there for it (404), nor its history.
    for path in [
        format!("/v1/jobs/{v}"),
        format!("/v1/jobs/{v}/events"),
        format!("/v1/jobs/{v}/explain"),
    ] {
        assert_eq!(
            api.call("GET", &path, Some(SPEECH), None).await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            api.call("GET", &path, Some(VISION), None).await.0,
            StatusCode::OK
        );
        assert_eq!(
            api.call("GET", &path, Some(ADMIN), None).await.0,
            StatusCode::OK
        );
    }
    assert_eq!(
        api.call("DELETE", &format!("/v1/jobs/{v}"), Some(SPEECH), None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    // Submitting or listing for another tenant: 403.
    let (s, body) = api.submit(SPEECH, job("vision", 1, 1)).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(field(&body), "tenant");
    assert_eq!(
        api.call("GET", "/v1/jobs?tenant=vision", Some(SPEECH), None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    let (_, own) = api.call("GET", "/v1/jobs", Some(SPEECH), None).await;
    assert_eq!(own["jobs"].as_array().unwrap().len(), 0, "{own}");
    // Admin routes: 403 for a tenant token.
    assert_eq!(
        api.call("PUT", "/v1/tenants/x", Some(VISION), Some(json!({})))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        api.call("POST", "/v1/nodes/n0/cordon", Some(VISION), None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    // A tenant token's event stream holds only its own jobs' events.
    api.submit_ok(SPEECH, job("speech", 1, 1)).await;
    let (_, page) = api
        .call("GET", "/v1/events?from=0", Some(VISION), None)
        .await;
    let evs = page["events"].as_array().unwrap();
    assert!(!evs.is_empty());
    assert!(evs.iter().all(|e| e["event"]["job"] == v), "{page}");
}

#[tokio::test]
async fn list_pages_with_a_cursor_and_filters() {
    let api = api().await;
    let mut ids = Vec::new();
    for i in 0..25 {
        let t = if i % 5 == 0 { "speech" } else { "vision" };
        ids.push(api.submit_ok(ADMIN, job(t, 1, 1)).await);
    }
    let (_, st) = api.call("GET", "/v1/status", Some(ADMIN), None).await;
    api.sync(st["seq"].as_u64().unwrap()).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let uri = match &cursor {
            None => "/v1/jobs?limit=7&tenant=vision".to_string(),
            Some(c) => format!("/v1/jobs?limit=7&tenant=vision&cursor={c}"),
        };
        let (s, v) = api.call("GET", &uri, Some(ADMIN), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        pages += 1;
        for j in v["jobs"].as_array().unwrap() {
            assert_eq!(j["tenant"], "vision");
            seen.push(j["id"].as_u64().unwrap());
        }
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let want: Vec<u64> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 5 != 0)
        .map(|(_, id)| *id)
        .collect();
    assert_eq!(seen, want, "every vision job once, ascending");
    assert_eq!(pages, 3);
    // Newest first, in pages, continues downwards from its cursor.
    let mut down = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let uri = match &cursor {
            None => "/v1/jobs?limit=7&tenant=vision&order=desc".to_string(),
            Some(c) => format!("/v1/jobs?limit=7&tenant=vision&order=desc&cursor={c}"),
        };
        let (s, v) = api.call("GET", &uri, Some(ADMIN), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        down.extend(
            v["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_u64().unwrap()),
        );
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut want_down = want.clone();
    want_down.reverse();
    assert_eq!(down, want_down, "every vision job once, descending");
    // State filter: nothing runs here (no services), everything is submitted.
    let (_, v) = api
        .call("GET", "/v1/jobs?state=running", Some(ADMIN), None)
        .await;
    assert!(v["jobs"].as_array().unwrap().is_empty());
    let (_, v) = api
        .call(
            "GET",
            "/v1/jobs?state=submitted,queued&limit=1000",
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(v["jobs"].as_array().unwrap().len(), 25);
    // Bad query values name their parameter.
    for (q, f) in [
        ("order=sideways", "order"),
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("state=sleeping", "state"),
        ("cursor=xyz", "cursor"),
        ("colour=red", "colour"),
    ] {
        let (s, v) = api
            .call("GET", &format!("/v1/jobs?{q}"), Some(ADMIN), None)
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
        assert_eq!(field(&v), f, "{q}: {v}");
    }
}

#[tokio::test]
async fn get_cancel_events_and_explain_a_job() {
    let api = api().await;
    let id = api.submit_ok(VISION, job("vision", 2, 8)).await;
    let (_, st) = api.call("GET", "/v1/status", Some(ADMIN), None).await;
    api.sync(st["seq"].as_u64().unwrap()).await;
    let (s, v) = api
        .call("GET", &format!("/v1/jobs/{id}"), Some(VISION), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["state"], "submitted");
    assert_eq!(v["gpus"], 16);
    assert_eq!(
        api.call("GET", "/v1/jobs/0", Some(ADMIN), None).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        api.call("GET", "/v1/jobs/x", Some(ADMIN), None).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        api.call("GET", "/v1/jobs/999", Some(ADMIN), None).await.0,
        StatusCode::NOT_FOUND
    );

    // In-process calls take microseconds: let its wait reach a few ms.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let (s, ex) = api
        .call("GET", &format!("/v1/jobs/{id}/explain"), Some(VISION), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{ex}");
    let history = ex["history"].as_array().unwrap();
    assert!(
        history[0]
            .as_str()
            .unwrap()
            .contains("submitted to vision: 2×8 GPUs"),
        "{ex}"
    );
    assert!(
        ex["guaranteed_start_ms"].is_null(),
        "no start time without a reservation"
    );
    // Its goodput account: nothing allocated yet, so no goodput; its 16
    // GPUs have waited since its submission (at least 5 ms), with no
    // reason given yet.
    let g = &ex["goodput"];
    assert_eq!(g["allocated_gpu_hours"], 0.0, "{ex}");
    assert!(g["goodput"].is_null(), "{ex}");
    assert!(
        g["wait_gpu_hours"]["queued"]
            .as_f64()
            .is_some_and(|h| h >= 16.0 * 5.0 / 3_600_000.0),
        "{ex}"
    );

    // Its timeline: one open pending bar since its submission; another
    // tenant's token finds no such job.
    let (s, tl) = api
        .call(
            "GET",
            &format!("/v1/jobs/{id}/timeline"),
            Some(VISION),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{tl}");
    let bars = tl["bars"].as_array().unwrap();
    assert_eq!(bars.len(), 1, "{tl}");
    assert_eq!(bars[0]["state"], "pending");
    assert!(bars[0]["to_ms"].is_null(), "still pending: {tl}");
    assert_eq!(
        api.call(
            "GET",
            &format!("/v1/jobs/{id}/timeline"),
            Some(SPEECH),
            None
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let (_, me) = api.call("GET", "/v1/whoami", Some(VISION), None).await;
    assert_eq!(me, serde_json::json!({"admin": false, "tenant": "vision"}));
    let (_, me) = api.call("GET", "/v1/whoami", Some(ADMIN), None).await;
    assert_eq!(me, serde_json::json!({"admin": true, "tenant": null}));

    let (s, c) = api
        .call("DELETE", &format!("/v1/jobs/{id}"), Some(VISION), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(c["state"], "cancelled");
    let (_, v) = api
        .call("GET", &format!("/v1/jobs/{id}"), Some(VISION), None)
        .await;
    assert_eq!(v["state"], "cancelled", "read-your-writes after cancel");
    let (s, again) = api
        .call("DELETE", &format!("/v1/jobs/{id}"), Some(VISION), None)
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{again}");

    let (s, evs) = api
        .call("GET", &format!("/v1/jobs/{id}/events"), Some(VISION), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let kinds: Vec<&str> = evs
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["job_submitted", "job_cancelled"]);
}

#[tokio::test]
async fn queues_nodes_and_admin_changes() {
    let api = api().await;
    let (s, all) = api.call("GET", "/v1/queues", Some(ADMIN), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(all["queues"].as_array().unwrap().len(), 2, "{all}");
    // A tenant token sees only its own rows.
    let (s, q) = api.call("GET", "/v1/queues", Some(VISION), None).await;
    assert_eq!(s, StatusCode::OK);
    let rows = q["queues"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{q}");
    assert_eq!(rows[0]["tenant"], "vision");
    assert_eq!(rows[0]["nominal"], 16);
    for k in ["used", "borrowed", "lent", "pending", "running"] {
        assert_eq!(rows[0][k], 0, "{k}: {q}");
    }
    let (s, n) = api.call("GET", "/v1/nodes", Some(VISION), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(n["nodes"].as_array().unwrap().len(), 4);
    assert_eq!(n["nodes"][1]["status"], "ready");

    // Tenants: create, replace, bad bodies.
    let body = json!({"cohort": "research", "quotas": [{"flavor": H100, "nominal": 8}]});
    let (s, v) = api
        .call("PUT", "/v1/tenants/audio", Some(ADMIN), Some(body.clone()))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, _) = api
        .call("PUT", "/v1/tenants/audio", Some(ADMIN), Some(body))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        api.submit_ok(ADMIN, job("audio", 1, 1)).await > 0,
        "the new tenant takes jobs"
    );
    for (b, f) in [
        (json!({"name": "other"}), "name"),
        (json!({"weight": 0}), "weight"),
        (json!({"quotas": [{"flavor": H100}]}), "nominal"),
        (json!({"colour": 1}), "colour"),
        (json!([1]), "body"),
    ] {
        let (s, v) = api
            .call("PUT", "/v1/tenants/audio", Some(ADMIN), Some(b.clone()))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{b}: {v}");
        assert!(field(&v).ends_with(f), "{b}: {v}");
    }

    // Nodes: cordon, drain, uncordon, by name or id; illegal moves are 409.
    let (s, v) = api
        .call("POST", "/v1/nodes/n1/cordon", Some(ADMIN), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["now"], "cordoned");
    assert_eq!(
        api.call("POST", "/v1/nodes/1/cordon", Some(ADMIN), None)
            .await
            .0,
        StatusCode::CONFLICT
    );
    let (s, v) = api
        .call("POST", "/v1/nodes/1/drain", Some(ADMIN), None)
        .await;
    assert_eq!((s, v["now"].as_str()), (StatusCode::OK, Some("drained")));
    let (s, v) = api
        .call("POST", "/v1/nodes/n1/uncordon", Some(ADMIN), None)
        .await;
    assert_eq!((s, v["now"].as_str()), (StatusCode::OK, Some("ready")));
    assert_eq!(
        api.call("POST", "/v1/nodes/n1/uncordon", Some(ADMIN), None)
            .await
            .0,
        StatusCode::CONFLICT
    );
    assert_eq!(
        api.call("POST", "/v1/nodes/n9/drain", Some(ADMIN), None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    // An action that is none of the four names itself and changes nothing.
    let (s, v) = api
        .call("POST", "/v1/nodes/n1/reboot", Some(ADMIN), None)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "invalid_path", "{v}");
    let (_, v) = api.call("GET", "/v1/nodes", Some(ADMIN), None).await;
    assert_eq!(v["nodes"][1]["status"], "ready", "{v}");
    // Unknown routes and methods answer JSON errors.
    let (s, v) = api.call("GET", "/v1/nope", Some(ADMIN), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "not_found");
    assert_eq!(
        api.call("PATCH", "/v1/jobs", Some(ADMIN), None).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn event_stream_follows_live_and_resumes_from_a_sequence_number() {
    let api = api().await;
    let (_, st) = api.call("GET", "/v1/status", Some(ADMIN), None).await;
    let start = st["seq"].as_u64().unwrap();
    let req = Request::get(format!("/v1/events?follow=true&from={start}"))
        .header("authorization", format!("Bearer {ADMIN}"))
        .body(Body::empty())
        .unwrap();
    let resp = api.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let a = api.submit_ok(ADMIN, job("vision", 1, 1)).await;
    let b = api.submit_ok(ADMIN, job("vision", 1, 2)).await;
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !text.contains(&format!("\"job\":{b}")) {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .unwrap();
        let frame = frame.unwrap().unwrap();
        if let Some(d) = frame.data_ref() {
            text.push_str(&String::from_utf8_lossy(d));
        }
    }
    assert!(text.contains(&format!("id: {}\n", start + 1)), "{text}");
    assert!(text.contains("event: job_submitted"), "{text}");
    assert!(text.contains(&format!("\"job\":{a}")), "{text}");
    // Resuming with Last-Event-ID skips what was seen.
    let req = Request::get("/v1/events?limit=10")
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("last-event-id", (start + 1).to_string())
        .body(Body::empty())
        .unwrap();
    let (_, page) = api.raw(req).await;
    let first = &page["events"][0];
    assert_eq!(first["seq"], start + 2, "{page}");
    assert_eq!(first["event"]["job"], b);
}

/// Every route the router serves, as (method, path template).
const SERVED: [(&str, &str); 27] = [
    ("post", "/v1/jobs"),
    ("post", "/v1/jobs:batch"),
    ("post", "/v1/arrays"),
    ("get", "/v1/arrays/{id}"),
    ("delete", "/v1/arrays/{id}"),
    ("get", "/v1/jobs"),
    ("get", "/v1/jobs/{id}"),
    ("delete", "/v1/jobs/{id}"),
    ("get", "/v1/jobs/{id}/events"),
    ("get", "/v1/jobs/{id}/explain"),
    ("get", "/v1/jobs/{id}/timeline"),
    ("get", "/v1/jobs/{id}/logs"),
    ("get", "/v1/queues"),
    ("get", "/v1/nodes"),
    ("put", "/v1/tenants/{name}"),
    ("put", "/v1/tenants/{name}/budgets/{flavor}"),
    ("delete", "/v1/tenants/{name}/budgets/{flavor}"),
    ("get", "/v1/cohorts"),
    ("put", "/v1/cohorts/{name}"),
    ("post", "/v1/nodes/{id}/{action}"),
    ("post", "/v1/queues/{tenant}/{action}"),
    ("get", "/v1/events"),
    ("get", "/v1/status"),
    ("get", "/v1/whoami"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
];

#[tokio::test]
async fn openapi_documents_exactly_the_served_routes() {
    let api = api().await;
    let (s, doc) = api.call("GET", "/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                documented.push((method.clone(), path.clone()));
            }
        }
    }
    for (m, p) in SERVED {
        assert!(
            documented.contains(&(m.to_string(), p.to_string())),
            "{m} {p} is served but not in /openapi.json"
        );
    }
    // And every documented route is really served: it never reaches the
    // router's fallback (404 `no such route` or 405).
    for (m, p) in &documented {
        let uri = p
            .replace("{id}", "1")
            .replace("{name}", "t")
            .replace("{tenant}", "t")
            .replace("{flavor}", "f")
            .replace("{action}", "hold");
        let (s, v) = api.call(&m.to_uppercase(), &uri, Some(ADMIN), None).await;
        assert_ne!(s, StatusCode::METHOD_NOT_ALLOWED, "{m} {p}");
        assert!(
            !(s == StatusCode::NOT_FOUND && v["error"]["message"] == "no such route"),
            "{m} {p} is documented but not served"
        );
    }
    assert_eq!(documented.len(), SERVED.len() + 1, "{documented:?}");
    assert!(doc["components"]["schemas"]["JobSpec"].is_object());
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}

/// The parameter `name` of `method path` in the document.
fn param<'a>(doc: &'a Value, method: &str, path: &str, name: &str) -> &'a Value {
    doc["paths"][path][method]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{method} {path}: no parameter {name}"))
}

#[tokio::test]
async fn openapi_carries_the_rules_the_handlers_enforce() {
    let api = api().await;
    let (_, doc) = api.call("GET", "/openapi.json", None, None).await;
    let max = i64::MAX;
    for path in [
        "/v1/jobs/{id}",
        "/v1/jobs/{id}/events",
        "/v1/jobs/{id}/explain",
    ] {
        let id = &param(&doc, "get", path, "id")["schema"];
        assert_eq!(id["minimum"], 1, "{path}: {id}");
        assert_eq!(id["maximum"], max, "{path}: {id}");
    }
    let limit = &param(&doc, "get", "/v1/jobs", "limit")["schema"];
    assert_eq!(
        (limit["minimum"].as_u64(), limit["maximum"].as_u64()),
        (Some(1), Some(1000))
    );
    let limit = &param(&doc, "get", "/v1/events", "limit")["schema"];
    assert_eq!(
        (limit["minimum"].as_u64(), limit["maximum"].as_u64()),
        (Some(1), Some(10000))
    );
    let last = &param(&doc, "get", "/v1/events", "Last-Event-ID")["schema"];
    assert_eq!(last["maximum"], max, "{last}");
    let spec = &doc["components"]["schemas"]["JobSpec"]["properties"];
    assert_eq!(spec["tenant"]["minLength"], 1, "{spec}");
    assert_eq!(spec["workers"]["minimum"], 1, "{spec}");
    assert_eq!(spec["gpus_per_worker"]["minimum"], 1, "{spec}");
    let update = &doc["components"]["schemas"]["TenantUpdate"];
    assert!(
        !update["required"]
            .as_array()
            .is_some_and(|r| r.contains(&json!("name"))),
        "the path names the tenant: {update}"
    );
    assert_eq!(update["properties"]["name"]["minLength"], 1, "{update}");
    // Every status a route answers is documented.
    let statuses = |m: &str, p: &str| -> Vec<String> {
        doc["paths"][p][m]["responses"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    for (m, p, want) in [
        (
            "put",
            "/v1/tenants/{name}",
            &[
                "200", "201", "400", "401", "403", "409", "413", "415", "429", "503",
            ][..],
        ),
        (
            "post",
            "/v1/jobs",
            &[
                "200", "201", "400", "401", "403", "409", "413", "415", "429", "503",
            ],
        ),
        (
            "delete",
            "/v1/jobs/{id}",
            &["200", "202", "400", "401", "404", "409", "429", "503"],
        ),
        (
            "post",
            "/v1/nodes/{id}/{action}",
            &["200", "400", "401", "403", "404", "409", "429", "503"],
        ),
    ] {
        let got = statuses(m, p);
        for s in want {
            assert!(
                got.contains(&s.to_string()),
                "{m} {p}: {s} not documented ({got:?})"
            );
        }
    }
    let read = doc["paths"]["/v1/jobs/{id}"]["get"]["description"]
        .as_str()
        .unwrap_or("");
    assert!(
        read.contains("cancelled"),
        "a cancelled job stays readable: {read}"
    );
    // 415 on PUT /v1/tenants/{name} is real.
    let req = Request::put("/v1/tenants/audio")
        .header("authorization", format!("Bearer {ADMIN}"))
        .body(Body::from("{}"))
        .unwrap();
    assert_eq!(api.raw(req).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

mod never_5xx {
    use super::*;
    use proptest::prelude::*;

    fn method() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("GET"),
            Just("POST"),
            Just("PUT"),
            Just("DELETE"),
            Just("PATCH")
        ]
    }

    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("1".to_string()),
            Just("2".to_string()),
            Just("0".to_string()),
            Just("18446744073709551616".to_string()),
            Just("-1".to_string()),
            Just("n0".to_string()),
            Just("vision".to_string()),
            "[a-zA-Z0-9%._~-]{0,12}",
        ]
    }

    /// Mostly the real routes with odd ids and queries; sometimes noise.
    fn path() -> impl Strategy<Value = String> {
        let template = prop::sample::select(vec![
            "/v1/jobs",
            "/v1/jobs/{}",
            "/v1/jobs/{}/events",
            "/v1/jobs/{}/explain",
            "/v1/queues",
            "/v1/nodes",
            "/v1/tenants/{}",
            "/v1/nodes/{}/cordon",
            "/v1/nodes/{}/drain",
            "/v1/nodes/{}/uncordon",
            "/v1/events",
            "/v1/status",
            "/healthz",
            "/openapi.json",
        ]);
        let query = prop::option::of(prop_oneof![
            "(limit|cursor|state|tenant|from|follow|x)=[a-z0-9,%-]{0,12}(&(limit|state|cursor|from)=[a-z0-9,-]{0,8})?",
            "[a-z=&0-9,%-]{0,30}",
        ]);
        let routed = (template, segment(), query).prop_map(|(t, seg, q)| {
            let mut p = t.replace("{}", &seg);
            if let Some(q) = q {
                // follow=true would stream forever: the stream is tested above.
                if !q.contains("follow=t") {
                    p.push('?');
                    p.push_str(&q);
                }
            }
            p
        });
        let noise =
            prop::collection::vec(segment(), 0..5).prop_map(|s| format!("/{}", s.join("/")));
        prop_oneof![4 => routed, 1 => noise]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u32>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[a-z0-9-]{0,10}".prop_map(Value::from),
            Just(Value::from("vision")),
            Just(Value::from(H100)),
            Just(Value::from("block")),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            let key = prop_oneof![
                Just("tenant".to_string()),
                Just("workers".to_string()),
                Just("gpus_per_worker".to_string()),
                Just("flavors".to_string()),
                Just("topology".to_string()),
                Just("priority".to_string()),
                Just("checkpoint".to_string()),
                Just("max_runtime_s".to_string()),
                Just("quotas".to_string()),
                Just("name".to_string()),
                Just("weight".to_string()),
                "[a-z_]{1,8}",
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(key, inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn body() -> impl Strategy<Value = Option<Vec<u8>>> {
        prop_oneof![
            Just(None),
            json_value().prop_map(|v| Some(v.to_string().into_bytes())),
            prop::collection::vec(any::<u8>(), 0..64).prop_map(Some),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]
        #[test]
        fn no_request_gets_a_5xx(
            m in method(),
            p in path(),
            b in body(),
            token in prop_oneof![Just(Some(ADMIN)), Just(Some(VISION)), Just(None), Just(Some("junk"))],
            json_type in any::<bool>(),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let api = api().await;
                let mut r = Request::builder().method(m).uri(p.as_str());
                if let Some(t) = token {
                    r = r.header("authorization", format!("Bearer {t}"));
                }
                if json_type {
                    r = r.header("content-type", "application/json");
                }
                // A path no HTTP client could send is not a request.
                let Ok(req) = r.body(b.clone().map_or_else(Body::empty, Body::from)) else {
                    return Ok(());
                };
                let (s, v) = api.raw(req).await;
                prop_assert!(s.as_u16() < 500, "{m} {p} {:?} -> {s} {v}", b.map(|b| String::from_utf8_lossy(&b).to_string()));
                if s.is_client_error() {
                    prop_assert!(v["error"]["code"].is_string(), "{m} {p} -> {s} {v}");
                }
                Ok(())
            })?;
        }
    }
}

#[tokio::test]
async fn a_jobs_command_env_workdir_and_signal_are_kept_and_checked() {
    let api = api().await;
    let spec = json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1,
        "command": ["sh", "-c", "echo hi"], "env": {"A": "1", "B": ""},
        "working_dir": "/tmp", "checkpoint_signal": "USR2"});
    let id = api.submit_ok(VISION, spec.clone()).await;
    let (_, st) = api.call("GET", "/v1/status", Some(ADMIN), None).await;
    api.sync(st["seq"].as_u64().unwrap()).await;
    let (s, v) = api
        .call("GET", &format!("/v1/jobs/{id}"), Some(VISION), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    for k in ["command", "env", "working_dir", "checkpoint_signal"] {
        assert_eq!(v["spec"][k], spec[k], "{k}: {v}");
    }
    // A job without them has none in its spec.
    let plain = api.submit_ok(VISION, job("vision", 1, 1)).await;
    let (_, st) = api.call("GET", "/v1/status", Some(ADMIN), None).await;
    api.sync(st["seq"].as_u64().unwrap()).await;
    let (_, v) = api
        .call("GET", &format!("/v1/jobs/{plain}"), Some(VISION), None)
        .await;
    assert!(v["spec"].get("command").is_none(), "{v}");
    assert!(v["spec"].get("env").is_none(), "{v}");

    let with = |k: &str, val: Value| {
        let mut b = job("vision", 1, 1);
        b[k] = val;
        b
    };
    let cases = [
        (with("command", json!("python")), "command", "invalid type"),
        (with("command", json!([""])), "command", "must not be empty"),
        (with("env", json!({"A=B": "1"})), "env", "names must be"),
        (with("env", json!({"A": 1})), "env.A", "invalid type"),
        (
            with("checkpoint_signal", json!("SIGKILL")),
            "checkpoint_signal",
            "SIGUSR1",
        ),
    ];
    for (body, want_field, want_rule) in cases {
        let (s, v) = api.submit(ADMIN, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body} -> {v}");
        assert_eq!(field(&v), want_field, "{body} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want_rule), "{body} -> {msg}");
    }
}

/// Until its view has read the log, the gateway cannot judge a request:
/// every /v1 route answers 503 with Retry-After (never "unknown tenant"
/// to a valid job), and /readyz says why; once caught up, both are fine.
#[tokio::test]
async fn a_view_that_has_not_read_the_log_refuses_nothing_for_good() {
    let api = api().await;
    let (s, ready) = api.call("GET", "/readyz", None, None).await;
    assert_eq!(s, StatusCode::OK, "{ready}");
    assert_eq!(ready["caught_up"], true);

    // The same gateway as it is just after a start: nothing folded yet.
    let mut fresh = api.gw.clone();
    fresh.follower = std::sync::Arc::new(gpusched_runtime::FollowerHealth::default());
    fresh.view = std::sync::Arc::new(std::sync::RwLock::new(gpusched_runtime::Projection::new()));
    let starting = router(fresh);
    let job = json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "flavors": [H100]});
    let req = Request::builder()
        .method("POST")
        .uri("/v1/jobs")
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("content-type", "application/json")
        .body(Body::from(job.to_string()))
        .unwrap();
    let resp = starting.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["error"]["code"], "not_ready", "{body}");
    let req = Request::builder()
        .uri("/readyz")
        .body(Body::empty())
        .unwrap();
    let resp = starting.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);

    // The caught-up gateway takes the same job.
    let (s, v) = api.call("POST", "/v1/jobs", Some(ADMIN), Some(job)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

#[tokio::test]
async fn queues_are_held_drained_stopped_and_released_and_nodes_evicted_by_the_admin() {
    let api = api().await;
    let post = |path: &'static str, token: &'static str| {
        let api = &api;
        async move { api.call("POST", path, Some(token), None).await }
    };
    // Hold: submissions still queue; the queue view says so.
    let (s, v) = post("/v1/queues/vision/hold", ADMIN).await;
    assert_eq!(
        (s, v["now"].as_str()),
        (StatusCode::OK, Some("held")),
        "{v}"
    );
    assert_eq!(
        post("/v1/queues/vision/hold", ADMIN).await.0,
        StatusCode::CONFLICT
    );
    let (_, q) = api.call("GET", "/v1/queues", Some(ADMIN), None).await;
    let state_of = |q: &Value, t: &str| {
        q["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["tenant"] == t)
            .map(|r| r["queue"].clone())
    };
    assert_eq!(state_of(&q, "vision"), Some(json!("held")));
    assert_eq!(state_of(&q, "speech"), Some(json!("open")));
    assert!(api.submit_ok(VISION, job("vision", 1, 8)).await > 0);
    // Drain: a submission is refused with 409, naming the tenant.
    let (s, v) = post("/v1/queues/vision/drain", ADMIN).await;
    assert_eq!((s, v["now"].as_str()), (StatusCode::OK, Some("draining")));
    let (s, v) = api.submit(VISION, job("vision", 1, 8)).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(field(&v), "tenant");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("draining"),
        "{v}"
    );
    // The request's own form is checked before the queue: a bad key is
    // still a 400 naming the header, for a job and for an array.
    for (path, body) in [
        ("/v1/jobs", job("vision", 1, 8)),
        (
            "/v1/arrays",
            json!({"indices": "0", "spec": job("vision", 1, 8)}),
        ),
    ] {
        let req = Request::post(path)
            .header("authorization", format!("Bearer {VISION}"))
            .header("content-type", "application/json")
            .header("idempotency-key", "")
            .body(Body::from(body.to_string()))
            .unwrap();
        let (s, v) = api.raw(req).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path}: {v}");
        assert_eq!(field(&v), "Idempotency-Key", "{path}: {v}");
    }
    // Stop, then release: submissions are taken again.
    let (s, v) = post("/v1/queues/vision/stop", ADMIN).await;
    assert_eq!((s, v["now"].as_str()), (StatusCode::OK, Some("stopped")));
    let (s, v) = post("/v1/queues/vision/release", ADMIN).await;
    assert_eq!((s, v["now"].as_str()), (StatusCode::OK, Some("open")));
    assert_eq!(
        post("/v1/queues/vision/release", ADMIN).await.0,
        StatusCode::CONFLICT
    );
    assert!(api.submit_ok(VISION, job("vision", 1, 8)).await > 0);
    // Only the admin; an unknown tenant is 404.
    assert_eq!(
        post("/v1/queues/vision/hold", VISION).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        post("/v1/queues/nobody/hold", ADMIN).await.0,
        StatusCode::NOT_FOUND
    );
    // Evict a node: out of service until uncordoned; twice is 409.
    let (s, v) = post("/v1/nodes/n2/evict", ADMIN).await;
    assert_eq!(
        (s, v["now"].as_str()),
        (StatusCode::OK, Some("evicted")),
        "{v}"
    );
    assert_eq!(
        post("/v1/nodes/n2/evict", ADMIN).await.0,
        StatusCode::CONFLICT
    );
    assert_eq!(
        post("/v1/nodes/n2/evict", VISION).await.0,
        StatusCode::FORBIDDEN
    );
    let (s, v) = post("/v1/nodes/n2/uncordon", ADMIN).await;
    assert_eq!((s, v["now"].as_str()), (StatusCode::OK, Some("ready")));
}

#[tokio::test]
async fn dependencies_and_an_array_limit_are_taken_and_bad_ones_refused_naming_the_field() {
    let api = api().await;
    // An array limited to two at once: the limit is kept on every task and
    // shown on the array; the same key with another limit is refused.
    let body = json!({"spec": job("vision", 1, 1), "indices": "0-4%2"});
    let (s, a) = post_array(&api, VISION, body, "lim-1").await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let id = a["id"].as_u64().unwrap();
    let other = json!({"spec": job("vision", 1, 1), "indices": "0-4%3"});
    assert_eq!(
        post_array(&api, VISION, other, "lim-1").await.0,
        StatusCode::CONFLICT
    );
    api.sync(a["seq"].as_u64().unwrap()).await;
    let (_, arr) = api
        .call("GET", &format!("/v1/arrays/{id}"), Some(VISION), None)
        .await;
    assert_eq!(arr["max_running"], 2, "{arr}");
    let (_, j) = api
        .call("GET", &format!("/v1/jobs/{id}"), Some(VISION), None)
        .await;
    assert_eq!(
        j["spec"]["array"],
        json!({"array": id, "index": 0, "max_running": 2}),
        "{j}"
    );
    let bad = json!({"spec": job("vision", 1, 1), "indices": "0-4%0"});
    let (s, v) = post_array(&api, VISION, bad, "lim-2").await;
    assert_eq!((s, field(&v)), (StatusCode::BAD_REQUEST, "indices"), "{v}");

    // A job after_ok an earlier one of its tenant is taken and shows it.
    let (s, dep) = api
        .submit(VISION, json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "after_ok": [id], "after": [id + 1]}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{dep}");
    let dep_id = dep["id"].as_u64().unwrap();
    api.sync(dep["seq"].as_u64().unwrap()).await;
    let (_, j) = api
        .call("GET", &format!("/v1/jobs/{dep_id}"), Some(VISION), None)
        .await;
    assert_eq!(
        (&j["spec"]["after_ok"], &j["spec"]["after"]),
        (&json!([id]), &json!([id + 1])),
        "{j}"
    );
    // Unknown, another tenant's, or named twice: 400 naming the field.
    let cases = [
        (
            json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "after_ok": [999]}),
            VISION,
            "after_ok",
            "not a job of tenant vision",
        ),
        (
            json!({"tenant": "speech", "workers": 1, "gpus_per_worker": 1, "after": [id]}),
            SPEECH,
            "after",
            "not a job of tenant speech",
        ),
        (
            json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "after_ok": [id], "after": [id]}),
            VISION,
            "after",
            "named twice",
        ),
        (
            json!({"tenant": "vision", "workers": 1, "gpus_per_worker": 1, "after_ok": [-1]}),
            VISION,
            "after_ok",
            "",
        ),
    ];
    for (body, token, want_field, want_rule) in cases {
        let (s, v) = api.submit(token, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body} -> {v}");
        assert!(field(&v).starts_with(want_field), "{body} -> {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want_rule), "{body} -> {msg}");
    }
}

#[tokio::test]
async fn a_cohorts_half_life_is_set_by_the_admin_and_its_borrowers_shown_in_the_order_served() {
    let api = api().await;
    // Two hours ago the cohort kept use with a one-hour half-life, and
    // vision took 16 GPUs (a job of 2 × 8) it still holds.
    let two_hours_ago = Timestamp(gpusched_runtime::wall_clock().0 - 7_200_000);
    let spec: gpusched_model::JobSpec =
        serde_json::from_value(job("vision", 2, 8)).expect("a job spec");
    let w = api
        .gw
        .submitter
        .write(
            vec![
                Event::CohortConfigured {
                    spec: gpusched_model::CohortSpec {
                        name: "research".into(),
                        usage_half_life_s: 3_600,
                    },
                    at: two_hours_ago,
                },
                Event::JobSubmitted {
                    job: gpusched_model::JobId(1),
                    spec,
                    at: two_hours_ago,
                },
                Event::JobAccepted {
                    job: gpusched_model::JobId(1),
                },
                Event::JobAdmitted {
                    job: gpusched_model::JobId(1),
                    flavor: H100.into(),
                    borrowed: 0,
                    at: two_hours_ago,
                },
            ],
            None,
        )
        .await
        .unwrap();
    api.sync(w.seq).await;
    let (s, v) = api.call("GET", "/v1/cohorts", Some(ADMIN), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let research = &v["cohorts"][0];
    assert_eq!(research["name"], "research");
    assert_eq!(research["usage_half_life_s"], 3_600);
    // speech has used nothing: it is served first.
    let members = research["members"].as_array().unwrap();
    let names: Vec<&str> = members
        .iter()
        .map(|m| m["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["speech", "vision"], "{v}");
    assert_eq!(members[1]["place"], 2);
    // 16 GPUs for two half-lives: a mean of 16 · (1 − ¼) = 12.
    let used = members[1]["decayed_gpus"][H100].as_f64().unwrap();
    assert!((used - 12.0).abs() < 0.1, "{v}");
    // The queue view and /metrics say the same of vision's use.
    let (_, q) = api.call("GET", "/v1/queues", Some(ADMIN), None).await;
    let row = q["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["tenant"] == "vision")
        .unwrap();
    assert!(
        (row["decayed_gpus"].as_f64().unwrap() - 12.0).abs() < 0.1,
        "{q}"
    );
    let (_, m) = api.call("GET", "/metrics", None, None).await;
    let m = m.as_str().unwrap_or_default().to_string();
    let line = m
        .lines()
        .find(|l| {
            l.starts_with("gpusched_quota_decayed_use_gpus{") && l.contains("tenant=\"vision\"")
        })
        .unwrap_or_else(|| panic!("{m}"));
    let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((value - 12.0).abs() < 0.1, "{line}");
    // A tenant token sees its own cohort, and only its own row.
    let (_, mine) = api.call("GET", "/v1/cohorts", Some(VISION), None).await;
    let rows = mine["cohorts"][0]["members"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{mine}");
    assert_eq!(
        (rows[0]["tenant"].as_str(), rows[0]["place"].as_u64()),
        (Some("vision"), Some(2))
    );

    // The admin changes it; a new cohort is created; bad bodies name the field.
    let put = |path: &'static str, token: &'static str, body: Value| {
        let api = &api;
        async move { api.call("PUT", path, Some(token), Some(body)).await }
    };
    let (s, v) = put(
        "/v1/cohorts/research",
        ADMIN,
        json!({"usage_half_life_s": 7_200}),
    )
    .await;
    assert_eq!(
        (s, v["now"].as_str()),
        (StatusCode::OK, Some("research")),
        "{v}"
    );
    let (s, _) = put("/v1/cohorts/ops", ADMIN, json!({})).await;
    assert_eq!(s, StatusCode::CREATED);
    for (body, want) in [
        (json!({"usage_half_life_s": -1}), "usage_half_life_s"),
        (
            json!({"usage_half_life_s": 316_224_001u64}),
            "usage_half_life_s",
        ),
        (json!({"name": "other"}), "name"),
        (json!({"half_life": 5}), "half_life"),
        (json!([1]), "body"),
    ] {
        let (s, v) = put("/v1/cohorts/research", ADMIN, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(field(&v), want, "{body}: {v}");
    }
    assert_eq!(
        put("/v1/cohorts/research", VISION, json!({})).await.0,
        StatusCode::FORBIDDEN
    );
    let (_, v) = api.call("GET", "/v1/cohorts", Some(ADMIN), None).await;
    let names: Vec<&str> = v["cohorts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ops", "research"]);
    assert_eq!(v["cohorts"][1]["usage_half_life_s"], 7_200);
    // What vision used (decayed GPU-hours) is kept across the change; as a
    // mean over the longer half-life it is half: 12 · 1 h / 2 h = 6.
    let used = v["cohorts"][1]["members"][1]["decayed_gpus"][H100]
        .as_f64()
        .unwrap();
    assert!((used - 6.0).abs() < 0.1, "{v}");
}

#[tokio::test]
async fn a_tenants_gpu_hour_budget_is_set_by_the_admin_and_shown_used_and_left() {
    let api = api().await;
    let budget = json!({"gpu_hours": 10, "period": "day", "when_spent": "wait"});
    let body = json!({"cohort": "research", "quotas": [{"flavor": H100, "nominal": 16, "budget": budget}]});
    let (s, v) = api
        .call("PUT", "/v1/tenants/vision", Some(ADMIN), Some(body))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let id = api.submit_ok(VISION, job("vision", 1, 8)).await;
    let now = gpusched_runtime::wall_clock();
    // What the quota stage writes: vision admitted, then (as if its day's
    // GPU-hours ran out) its budget marked spent.
    let w = api
        .gw
        .submitter
        .write(
            vec![
                Event::JobAccepted {
                    job: gpusched_model::JobId(id),
                },
                Event::JobAdmitted {
                    job: gpusched_model::JobId(id),
                    flavor: H100.into(),
                    borrowed: 0,
                    at: now,
                },
            ],
            None,
        )
        .await
        .unwrap();
    api.sync(w.seq).await;
    let row = |q: &Value| {
        q["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["tenant"] == "vision")
            .cloned()
            .unwrap()
    };
    let (_, q) = api.call("GET", "/v1/queues", Some(VISION), None).await;
    let b = &row(&q)["budget"];
    assert_eq!(
        (&b["gpu_hours"], &b["period"], &b["when_spent"], &b["spent"]),
        (&json!(10), &json!("day"), &json!("wait"), &json!(false)),
        "{q}"
    );
    let (used, left) = (
        b["used_gpu_hours"].as_f64().unwrap(),
        b["left_gpu_hours"].as_f64().unwrap(),
    );
    assert!(
        (0.0..1.0).contains(&used) && (used + left - 10.0).abs() < 1e-9,
        "{q}"
    );
    let day = 86_400_000;
    let renews = b["renews_at_ms"].as_u64().unwrap();
    assert_eq!(renews % day, 0, "renews at midnight UTC: {q}");
    assert!(renews > now.0 && renews <= now.0 + day, "{q}");
    assert_eq!(b["period_start_ms"].as_u64().unwrap(), renews - day);
    // A tenant without a budget has none.
    let (_, all) = api.call("GET", "/v1/queues", Some(ADMIN), None).await;
    let speech = all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["tenant"] == "speech")
        .unwrap();
    assert!(speech["budget"].is_null(), "{all}");

    let w = api
        .gw
        .submitter
        .write(
            vec![Event::BudgetSpent {
                tenant: "vision".into(),
                flavor: H100.into(),
                period_start: Timestamp(renews - day),
                at: gpusched_runtime::wall_clock(),
            }],
            None,
        )
        .await
        .unwrap();
    api.sync(w.seq).await;
    let (_, q) = api.call("GET", "/v1/queues", Some(VISION), None).await;
    assert_eq!(row(&q)["budget"]["spent"], true, "{q}");
    let (_, m) = api.call("GET", "/metrics", None, None).await;
    let m = m.as_str().unwrap_or_default().to_string();
    for (series, value) in [
        ("gpusched_quota_budget_gpu_hours{", "10.0"),
        ("gpusched_quota_budget_spent{", "1.0"),
    ] {
        let line = m
            .lines()
            .find(|l| l.starts_with(series) && l.contains("tenant=\"vision\""))
            .unwrap_or_else(|| panic!("{series}: {m}"));
        assert!(line.ends_with(value), "{line}");
    }
    assert!(m.contains("gpusched_quota_budget_used_gpu_hours{"), "{m}");

    // The budget route changes one flavor's budget and nothing else.
    let put = |path: &'static str, token: &'static str, body: Value| {
        let api = &api;
        async move { api.call("PUT", path, Some(token), Some(body)).await }
    };
    let monthly = json!({"gpu_hours": 500, "period": "month", "when_spent": "borrow-only"});
    let (s, v) = put(
        "/v1/tenants/vision/budgets/h100-80g",
        ADMIN,
        monthly.clone(),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, q) = api.call("GET", "/v1/queues", Some(VISION), None).await;
    let r = row(&q);
    assert_eq!(
        (
            &r["nominal"],
            &r["budget"]["gpu_hours"],
            &r["budget"]["when_spent"]
        ),
        (&json!(16), &json!(500), &json!("borrow-only")),
        "{q}"
    );
    assert_eq!(
        r["budget"]["spent"], false,
        "a new period: counted afresh: {q}"
    );
    for (path, token, body, want) in [
        (
            "/v1/tenants/vision/budgets/h100-80g",
            VISION,
            monthly.clone(),
            StatusCode::FORBIDDEN,
        ),
        (
            "/v1/tenants/nobody/budgets/h100-80g",
            ADMIN,
            monthly.clone(),
            StatusCode::NOT_FOUND,
        ),
        (
            "/v1/tenants/vision/budgets/a100",
            ADMIN,
            monthly.clone(),
            StatusCode::NOT_FOUND,
        ),
        (
            "/v1/tenants/vision/budgets/h100-80g",
            ADMIN,
            json!({"gpu_hours": 0, "period": "day"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/tenants/vision/budgets/h100-80g",
            ADMIN,
            json!({"gpu_hours": 5, "period": "fortnight"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/v1/tenants/vision/budgets/h100-80g",
            ADMIN,
            json!([5]),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (s, v) = put(path, token, body.clone()).await;
        assert_eq!(s, want, "{path} {body}: {v}");
        if want == StatusCode::BAD_REQUEST {
            assert!(["gpu_hours", "period", "body"].contains(&field(&v)), "{v}");
        }
    }
    let del = |path: &'static str| {
        let api = &api;
        async move { api.call("DELETE", path, Some(ADMIN), None).await.0 }
    };
    assert_eq!(
        del("/v1/tenants/vision/budgets/h100-80g").await,
        StatusCode::OK
    );
    assert_eq!(
        del("/v1/tenants/vision/budgets/h100-80g").await,
        StatusCode::NOT_FOUND
    );
    let (_, q) = api.call("GET", "/v1/queues", Some(VISION), None).await;
    assert!(row(&q)["budget"].is_null(), "{q}");
    let (s, _) = put("/v1/tenants/vision/budgets/h100-80g", ADMIN, monthly).await;
    assert_eq!(s, StatusCode::CREATED);

    // Bad budgets name their field; nothing is written.
    for (budget, want) in [
        (
            json!({"gpu_hours": 0, "period": "day"}),
            "quotas.budget.gpu_hours",
        ),
        (json!({"gpu_hours": 5, "period": "year"}), "period"),
        (json!({"gpu_hours": 5}), "period"),
        (
            json!({"gpu_hours": 5, "period": "day", "when_spent": "never"}),
            "when_spent",
        ),
    ] {
        let body = json!({"quotas": [{"flavor": H100, "nominal": 8, "budget": budget}]});
        let (s, v) = api
            .call("PUT", "/v1/tenants/vision", Some(ADMIN), Some(body.clone()))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(field(&v).ends_with(want), "{body}: {v}");
    }
    let (_, q) = api.call("GET", "/v1/queues", Some(VISION), None).await;
    assert_eq!(row(&q)["budget"]["gpu_hours"], 500, "unchanged: {q}");
}

/// A second gateway over the same log whose view hears of new events only
/// by reading the log every second (its bus is its own): as another replica
/// would be where the bus is slow.
async fn lagging_replica(api: &Api) -> Router {
    let view: gpusched_runtime::SharedView = std::sync::Arc::new(std::sync::RwLock::new(
        gpusched_runtime::Projection::new().counting(),
    ));
    let follower = std::sync::Arc::new(gpusched_runtime::FollowerHealth::default());
    tokio::spawn(gpusched_runtime::follow(
        api.gw.log.clone(),
        Bus::memory(),
        view.clone(),
        Duration::from_millis(1_000),
        follower.clone(),
        gpusched_runtime::SnapshotPolicy {
            every_events: 0,
            load: false,
            ..Default::default()
        },
        "replica".into(),
        api.shutdown.clone(),
    ));
    let replica = Gateway {
        view,
        follower,
        ..api.gw.clone()
    };
    assert!(replica.caught_up(api.gw.log.max_seq().await.unwrap()).await);
    router(replica)
}

#[tokio::test]
async fn a_job_just_submitted_is_found_through_a_replica_whose_view_lags() {
    let api = api().await;
    let replica = lagging_replica(&api).await;
    let get = |uri: String| {
        let replica = replica.clone();
        async move {
            let req = Request::builder()
                .uri(uri)
                .header("authorization", format!("Bearer {VISION}"))
                .body(Body::empty())
                .unwrap();
            let resp = replica.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&bytes).to_string())
        }
    };
    for path in ["", "/explain", "/events"] {
        let id = api.submit_ok(VISION, job("vision", 1, 8)).await;
        let (status, body) = get(format!("/v1/jobs/{id}{path}")).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    // An id no one submitted is still 404, once the view has read the log.
    let (status, body) = get("/v1/jobs/999999".into()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}
