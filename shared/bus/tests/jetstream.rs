//! Integration tests against the real NATS JetStream on 127.0.0.1:4222
//! (`NATS_URL` overrides). Each test uses its own namespace and stream,
//! deleted when the test ends (also on panic, by a drop guard).
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpusched_bus::async_nats::{self, jetstream};
use gpusched_bus::{
    encode, ensure_stream, msg_id, BatchV1, BusError, Envelope, JobTraces, Namespace, Publisher,
    Subscriber, JOB_TRACES,
};
use gpusched_events::Event;
use gpusched_model::{JobId, NodeId};

const WAIT: Duration = Duration::from_secs(2);

/// A test namespace with its stream; deletes the stream on drop.
struct TestBus {
    js: jetstream::Context,
    ns: Namespace,
    stream: String,
}

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_string())
}

impl Drop for TestBus {
    fn drop(&mut self) {
        let stream = self.stream.clone();
        // The test's own client is driven by the test's runtime, which is
        // blocked while this runs: delete over a fresh connection on a
        // fresh runtime on its own thread (also works during a panic).
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                if let Ok(client) = async_nats::connect(nats_url()).await {
                    let _ = jetstream::new(client).delete_stream(&stream).await;
                }
            });
        })
        .join();
    }
}

async fn setup() -> TestBus {
    static N: AtomicU64 = AtomicU64::new(0);
    let url = nats_url();
    let client = match async_nats::connect(&url).await {
        Ok(c) => c,
        Err(e) => panic!("NATS with JetStream must run at {url} (set NATS_URL to override): {e}"),
    };
    let js = jetstream::new(client);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let root = format!(
        "gpusched_test_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    );
    let ns = Namespace::new(&root).unwrap();
    let stream = ns.evt_stream();
    // Setup, not under test: nats-server 2.9 has been seen to answer 10049
    // "error creating store for stream" to one of the streams created at
    // once by tests running side by side; a second try takes. (The
    // services' own set-up retries too: a subscriber starts again.)
    let mut tries = 0;
    while let Err(e) = ensure_stream(&js, &stream, vec![ns.evt_wildcard()]).await {
        tries += 1;
        assert!(
            tries < 5,
            "create test stream (is JetStream enabled on the server?): {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Idempotent.
    ensure_stream(&js, &stream, vec![ns.evt_wildcard()])
        .await
        .unwrap();
    TestBus { js, ns, stream }
}

fn batch(producer: &str, epoch: u64, first_seq: u64, n: u64) -> Envelope {
    Envelope::V1(BatchV1 {
        producer: producer.to_string(),
        epoch,
        first_seq,
        last_seq: first_seq + n - 1,
        correlation_id: Some(format!("corr-{first_seq}")),
        events: (first_seq..first_seq + n)
            .map(|i| {
                if i % 2 == 0 {
                    Event::JobAccepted { job: JobId(i) }
                } else {
                    Event::NodeCordoned {
                        node: NodeId(i as u32),
                    }
                }
            })
            .collect(),
    })
}

/// Consumes until `want` deliveries arrived or a wait comes back empty;
/// acks each one.
async fn drain(sub: &Subscriber, want: usize) -> Vec<Result<Envelope, String>> {
    let mut got = Vec::new();
    while got.len() < want {
        let deliveries = sub.next_batch(want - got.len(), WAIT).await.unwrap();
        if deliveries.is_empty() {
            break;
        }
        for d in deliveries {
            d.ack().await.unwrap();
            got.push(d.envelope.map_err(|e| e.to_string()));
        }
    }
    got
}

#[tokio::test]
async fn publish_batches_consume_in_order() {
    let bus = setup().await;
    let publisher = Publisher::new(bus.js.clone(), bus.ns.clone()).with_max_in_flight(16);
    let envelopes: Vec<Envelope> = (0..50).map(|i| batch("admit", 1, i * 3 + 1, 3)).collect();
    let outcomes = publisher
        .publish_all(
            &envelopes,
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        )
        .await
        .unwrap();
    assert_eq!(outcomes.len(), 50);
    assert!(outcomes.iter().all(|o| !o.duplicate));
    let seqs: Vec<u64> = outcomes.iter().map(|o| o.stream_seq).collect();
    assert_eq!(seqs, (1..=50).collect::<Vec<u64>>());

    let sub = Subscriber::durable(
        &bus.js,
        &bus.stream,
        "reader",
        &bus.ns.evt_subject("admit").unwrap(),
    )
    .await
    .unwrap();
    let got = drain(&sub, 60).await;
    let got: Vec<Envelope> = got.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(got, envelopes);
    // Nothing more.
    assert!(sub
        .next_batch(10, Duration::from_millis(200))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn delivery_carries_metadata() {
    let bus = setup().await;
    let publisher = Publisher::new(bus.js.clone(), bus.ns.clone());
    let env = batch("bind", 7, 10, 2);
    publisher.publish(&env, None).await.unwrap();
    let sub = Subscriber::durable(&bus.js, &bus.stream, "meta", &bus.ns.evt_wildcard())
        .await
        .unwrap();
    let ds = sub.next_batch(5, WAIT).await.unwrap();
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0].stream_seq, 1);
    assert_eq!(ds[0].subject, bus.ns.evt_subject("bind").unwrap());
    assert_eq!(ds[0].msg_id.as_deref(), Some("bind-7-11"));
    assert_eq!(ds[0].msg_id.as_deref(), Some(msg_id(&env).as_str()));
    assert_eq!(ds[0].pending, 0, "nothing waits behind the only message");
    ds[0].ack().await.unwrap();
}

#[tokio::test]
async fn job_traces_ride_in_their_header_and_malformed_ones_are_dropped() {
    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let bus = setup().await;
    let publisher = Publisher::new(bus.js.clone(), bus.ns.clone());
    let traced = batch("admit", 1, 2, 2); // job 2 and node 3
    let mut jobs = JobTraces::new();
    assert!(jobs.insert(JobId(2), TP));
    publisher
        .publish_with(&traced, Some(TP), &jobs)
        .await
        .unwrap();
    // Published by hand: a header of junk around one good pair.
    let raw = batch("admit", 1, 4, 1); // job 4
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(JOB_TRACES, format!("4=nope,,x={TP},4 ={TP},9").as_str());
    headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id(&raw).as_str());
    bus.js
        .publish_with_headers(
            bus.ns.evt_subject("admit").unwrap(),
            headers,
            encode(&raw).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    // All junk: no pairs, the message all the same.
    let junk = batch("admit", 1, 6, 1);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(JOB_TRACES, "\u{1F4A5}=\u{1F4A5},6=00-zz");
    bus.js
        .publish_with_headers(
            bus.ns.evt_subject("admit").unwrap(),
            headers,
            encode(&junk).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    // None at all: no header.
    let plain = batch("admit", 1, 8, 1);
    publisher.publish(&plain, None).await.unwrap();

    let sub = Subscriber::durable(&bus.js, &bus.stream, "traces", &bus.ns.evt_wildcard())
        .await
        .unwrap();
    let ds = sub.next_batch(10, WAIT).await.unwrap();
    assert_eq!(ds.len(), 4);
    let envelopes: Vec<Envelope> = ds
        .iter()
        .map(|d| d.envelope.as_ref().unwrap().clone())
        .collect();
    assert_eq!(envelopes, vec![traced, raw, junk, plain]);
    assert_eq!(ds[0].job_traces, jobs);
    assert_eq!(ds[0].traceparent.as_deref(), Some(TP));
    assert_eq!(ds[1].job_traces.get(JobId(4)), Some(TP));
    assert_eq!(ds[1].job_traces.len(), 1);
    assert!(ds[2].job_traces.is_empty());
    assert!(ds[3].job_traces.is_empty());
    assert!(ds[3].traceparent.is_none());
    for d in &ds {
        d.ack().await.unwrap();
    }
}

#[tokio::test]
async fn a_delivery_counts_the_messages_still_waiting_behind_it() {
    let bus = setup().await;
    let publisher = Publisher::new(bus.js.clone(), bus.ns.clone());
    for i in 0..5 {
        publisher
            .publish(&batch("bind", 1, i * 2 + 1, 2), None)
            .await
            .unwrap();
    }
    let sub = Subscriber::durable(&bus.js, &bus.stream, "backlog", &bus.ns.evt_wildcard())
        .await
        .unwrap();
    let ds = sub.next_batch(2, WAIT).await.unwrap();
    let pending: Vec<u64> = ds.iter().map(|d| d.pending).collect();
    assert_eq!(pending, vec![4, 3]);
}

#[tokio::test]
async fn duplicate_msg_id_is_dropped() {
    let bus = setup().await;
    let publisher = Publisher::new(bus.js.clone(), bus.ns.clone());
    let env = batch("admit", 2, 1, 4);
    let first = publisher.publish(&env, None).await.unwrap();
    let second = publisher
        .publish_all(&[env.clone(), env.clone()], None)
        .await
        .unwrap();
    assert!(!first.duplicate);
    assert!(second
        .iter()
        .all(|o| o.duplicate && o.stream_seq == first.stream_seq));
    let next = batch("admit", 2, 5, 1);
    publisher.publish(&next, None).await.unwrap();

    let sub = Subscriber::durable(&bus.js, &bus.stream, "dedup", &bus.ns.evt_wildcard())
        .await
        .unwrap();
    let got = drain(&sub, 10).await;
    let got: Vec<Envelope> = got.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(got, vec![env, next]);
}

#[tokio::test]
async fn malformed_message_is_skipped() {
    let bus = setup().await;
    let publisher = Publisher::new(bus.js.clone(), bus.ns.clone());
    let subject = bus.ns.evt_subject("admit").unwrap();
    let a = batch("admit", 1, 1, 1);
    let b = batch("admit", 1, 2, 1);
    publisher.publish(&a, None).await.unwrap();
    bus.js
        .publish(subject.clone(), "garbage \u{1F4A5}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    publisher.publish(&b, None).await.unwrap();

    // The consumer redelivers what is not acked after 1 s: a malformed
    // message the subscriber failed to terminate would come back below.
    let ack_wait = Duration::from_secs(1);
    let stream = bus.js.get_stream(&bus.stream).await.unwrap();
    stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("skip".into()),
            filter_subject: subject.clone(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await
        .unwrap();
    let sub = Subscriber::durable(&bus.js, &bus.stream, "skip", &subject)
        .await
        .unwrap();
    // Only the well-formed ones are acked by the test.
    let mut got = Vec::new();
    while got.len() < 3 {
        let ds = sub.next_batch(3 - got.len(), WAIT).await.unwrap();
        assert!(!ds.is_empty(), "only {} of 3 came", got.len());
        for d in ds {
            if d.envelope.is_ok() {
                d.ack().await.unwrap();
            }
            got.push(d.envelope.map_err(|e| e.to_string()));
        }
    }
    assert_eq!(got[0].as_ref().unwrap(), &a);
    assert!(got[1].is_err(), "malformed message reported: {:?}", got[1]);
    assert_eq!(got[2].as_ref().unwrap(), &b);
    // The malformed one was terminated by the subscriber: past the ack
    // wait, it has not come back.
    assert!(sub.next_batch(10, ack_wait * 3).await.unwrap().is_empty());

    // Also directly: the decode error is typed.
    let err = gpusched_bus::decode(b"garbage").unwrap_err();
    assert!(matches!(
        err,
        BusError::Envelope(_) | BusError::TrailingBytes(_) | BusError::Events(_)
    ));
}

#[tokio::test]
async fn second_instance_resumes_after_acked() {
    let bus = setup().await;
    let publisher = Publisher::new(bus.js.clone(), bus.ns.clone());
    let envelopes: Vec<Envelope> = (0..10).map(|i| batch("admit", 1, i + 1, 1)).collect();
    publisher.publish_all(&envelopes, None).await.unwrap();
    let subject = bus.ns.evt_subject("admit").unwrap();

    let first = Subscriber::durable(&bus.js, &bus.stream, "resume", &subject)
        .await
        .unwrap();
    let got = drain(&first, 4).await;
    assert_eq!(
        got.into_iter().map(|r| r.unwrap()).collect::<Vec<_>>(),
        envelopes[..4]
    );
    drop(first);

    let second = Subscriber::durable(&bus.js, &bus.stream, "resume", &subject)
        .await
        .unwrap();
    let got = drain(&second, 20).await;
    assert_eq!(
        got.into_iter().map(|r| r.unwrap()).collect::<Vec<_>>(),
        envelopes[4..]
    );
}

/// Not a timed test: prints the pipelined publish rate for the report.
#[tokio::test]
async fn pipelined_publish_of_1000() {
    let bus = setup().await;
    let publisher = Publisher::new(bus.js.clone(), bus.ns.clone());
    let envelopes: Vec<Envelope> = (0..1000).map(|i| batch("admit", 1, i + 1, 1)).collect();
    let t = Instant::now();
    let outcomes = publisher.publish_all(&envelopes, None).await.unwrap();
    let dt = t.elapsed();
    assert_eq!(outcomes.len(), 1000);
    assert_eq!(outcomes.last().unwrap().stream_seq, 1000);
    eprintln!(
        "pipelined publish: 1000 envelopes ({} B each) in {:?} = {:.0}/s",
        gpusched_bus::encode(&envelopes[0]).unwrap().len(),
        dt,
        1000.0 / dt.as_secs_f64()
    );
}
