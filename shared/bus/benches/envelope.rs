//! What a follower pays to read a batch off the bus: decoding the same
//! batch of 1,024 events in the older JSON form and in the binary form
//! that `encode` writes, in one run, with each form's size.
//!
//! The batch is a burst's mix: for each of about 205 jobs a
//! `job_submitted` (a synthetic spec), `job_accepted`, `job_admitted`,
//! `job_bound` and `job_started`.
//!
//! Run: `cargo bench -p gpusched-bus --bench envelope`.

use gpusched_bus::{decode, encode, encode_json_form, BatchV1, Envelope};
use gpusched_events::{Assignment, Event};
use gpusched_model::{JobId, JobSpec, NodeId, Timestamp};
use std::time::Instant;

fn spec(i: u64) -> JobSpec {
    JobSpec {
        topology: "node".into(),
        max_runtime_s: Some(3600),
        ..JobSpec::new(
            format!("team-{}", i % 8),
            1,
            [1, 1, 2, 4, 8][(i % 5) as usize],
        )
    }
}

fn burst_events(n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    let mut j = 0u64;
    while out.len() < n {
        let (job, at) = (JobId(j + 1), Timestamp(1_700_000_000_000 + j));
        out.push(Event::JobSubmitted {
            job,
            spec: spec(j),
            at,
        });
        out.push(Event::JobAccepted { job });
        out.push(Event::JobAdmitted {
            job,
            flavor: "h100".into(),
            borrowed: 0,
            at,
        });
        out.push(Event::JobBound {
            job,
            assignments: vec![Assignment {
                node: NodeId((j % 10_000) as u32),
                gpus: 1,
            }],
            backfill_for: None,
            at,
        });
        out.push(Event::JobStarted { job, at });
        j += 1;
    }
    out.truncate(n);
    out
}

fn best_of<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::MAX;
    let mut out = None;
    for _ in 0..n {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed().as_secs_f64() * 1e6);
        out = Some(v);
    }
    (best, out.expect("ran at least once"))
}

fn main() {
    let events = burst_events(1024);
    let batch = BatchV1::new("gateway", 3, 1, events.clone());
    let envelope = Envelope::V1(batch);
    let binary = encode(&envelope).expect("encodes");
    let json = encode_json_form(&envelope).expect("encodes");
    let (json_us, a) = best_of(50, || decode(&json).expect("decodes"));
    let (binary_us, b) = best_of(50, || decode(&binary).expect("decodes"));
    assert_eq!(a, b, "both forms hold the same batch");
    assert_eq!(a, envelope);
    let (json_enc_us, _) = best_of(50, || serde_json::to_vec(&events).expect("encodes"));
    let (bin_enc_us, _) = best_of(50, || encode(&a).expect("encodes"));
    println!("decode 1,024 events (best of 50):");
    println!(
        "  JSON form    {:>8.0} µs  {:>7} bytes",
        json_us,
        json.len()
    );
    println!(
        "  binary form  {:>8.0} µs  {:>7} bytes",
        binary_us,
        binary.len()
    );
    println!(
        "  binary ÷ JSON: time {:.2}, size {:.2}",
        binary_us / json_us,
        binary.len() as f64 / json.len() as f64
    );
    println!(
        "encode: the events as JSON {json_enc_us:.0} µs, the binary envelope {bin_enc_us:.0} µs"
    );
}
