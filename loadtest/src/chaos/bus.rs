//! The bus fault: on every event subject (`<root>.evt.<producer>`), copies
//! of real batches published again (duplicates), older real batches
//! published newest first (out of order), and malformed messages (random
//! bytes, nothing, a cut batch, an unknown envelope version, events that
//! are not JSON or not events, and a batch whose events are fewer than its
//! sequence range claims).
//!
//! Owns: choosing the messages (from the run's own event stream, drawn by
//! the seed) and publishing them.
//!
//! Must never: forge an event (every event it publishes is one a producer
//! committed; the only change to a real batch is to cut it), publish
//! outside the run's namespace, or set `Nats-Msg-Id` (JetStream would
//! drop the duplicates before any consumer saw them).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use gpusched_bus::{async_nats, Envelope, Namespace};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Every producer subject (`<root>.evt.<producer>`).
pub const PRODUCERS: [&str; 7] = [
    "gateway",
    "admission",
    "quota",
    "placement",
    "preemption",
    "agent",
    "admin",
];

/// Messages read back from the stream's tail to choose real batches from.
const SAMPLE: u64 = 400;

/// What was published.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Injected {
    /// Copies of a producer's latest batch.
    pub duplicates: u32,
    /// Older batches published newest first.
    pub reordered: u32,
    /// Messages that are not a valid batch.
    pub malformed: u32,
}

impl Injected {
    /// One line for the report.
    pub fn describe(&self) -> String {
        format!(
            "published {} duplicates, {} out-of-order copies, {} malformed",
            self.duplicates, self.reordered, self.malformed
        )
    }
}

/// Real batches of the stream's last `SAMPLE` messages, by subject, oldest first.
async fn sample_batches(
    stream: &async_nats::jetstream::stream::Stream,
    last: u64,
    first: u64,
) -> BTreeMap<String, Vec<Vec<u8>>> {
    let mut by: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    let from = last.saturating_sub(SAMPLE).max(first).max(1);
    for seq in from..=last {
        if let Ok(m) = stream.get_raw_message(seq).await {
            by.entry(m.subject.to_string())
                .or_default()
                .push(m.payload.to_vec());
        }
    }
    by
}

/// Malformed variants of `real` (any real batch) and of nothing.
fn malformed(real: Option<&[u8]>, rng: &mut ChaCha8Rng) -> Vec<Vec<u8>> {
    let random: Vec<u8> = (0..rng.gen_range(1..256)).map(|_| rng.gen()).collect();
    // Variant 1 does not exist (only V1 = 0); then a JSON array of
    // non-events, and bytes that are not JSON, behind a valid V1 header.
    let header = |json: &[u8]| {
        let mut v = vec![
            0x00, 0x05, b'a', b'g', b'e', b'n', b't', 0x01, 0x01, 0x01, 0x00,
        ];
        v.push(json.len() as u8);
        v.extend_from_slice(json);
        v
    };
    let mut out = vec![
        random,
        Vec::new(),
        vec![0x07, 0x01, b'x'],
        header(br#"[{"type":"no_such_event","job":1}]"#),
        header(b"{not json"),
        b"not an envelope".to_vec(),
    ];
    if let Some(real) = real {
        out.push(real[..real.len() / 2].to_vec());
        let mut trailing = real.to_vec();
        trailing.extend_from_slice(b"trailing");
        out.push(trailing);
        if let Ok(Envelope::V1(mut b)) = gpusched_bus::decode(real) {
            if b.events.len() > 1 {
                // The range still claims every event: a follower must
                // fold only what it got and read the rest from the log.
                b.events.truncate(1);
                if let Ok(bytes) = gpusched_bus::encode(&Envelope::V1(b)) {
                    out.push(bytes);
                }
            }
        }
    }
    out
}

async fn publish(
    js: &async_nats::jetstream::Context,
    subject: &str,
    payload: Vec<u8>,
) -> Result<()> {
    js.publish(subject.to_string(), payload.into())
        .await
        .with_context(|| format!("publishing on {subject}"))?
        .await
        .with_context(|| format!("publish ack on {subject}"))?;
    Ok(())
}

/// Publishes duplicates, out-of-order copies and malformed messages on
/// every event subject of `namespace`.
pub async fn inject(nats_url: &str, namespace: &str, rng: &mut ChaCha8Rng) -> Result<Injected> {
    let client = async_nats::connect(nats_url)
        .await
        .with_context(|| format!("connecting to {nats_url}"))?;
    let js = async_nats::jetstream::new(client);
    let ns = Namespace::new(namespace).context("namespace")?;
    let mut stream = js
        .get_stream(ns.evt_stream())
        .await
        .context("the run's event stream")?;
    let state = stream.info().await.context("stream info")?.state.clone();
    let sample = sample_batches(&stream, state.last_sequence, state.first_sequence).await;
    let mut done = Injected::default();
    let any_real = sample.values().flatten().next().cloned();
    for producer in PRODUCERS {
        let subject = ns.evt_subject(producer).context("subject")?;
        let real = sample.get(&subject).cloned().unwrap_or_default();
        if let Some(latest) = real.last() {
            for _ in 0..2 {
                publish(&js, &subject, latest.clone()).await?;
                done.duplicates += 1;
            }
        }
        let older = &real[..real.len().saturating_sub(1)];
        let k = older.len().min(rng.gen_range(2..6));
        for b in older[older.len() - k..].iter().rev() {
            publish(&js, &subject, b.clone()).await?;
            done.reordered += 1;
        }
        let base = real.last().or(any_real.as_ref()).map(Vec::as_slice);
        for m in malformed(base, rng) {
            publish(&js, &subject, m).await?;
            done.malformed += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gpusched_bus::BatchV1;
    use gpusched_events::Event;
    use rand::SeedableRng;

    #[test]
    fn every_malformed_message_fails_to_decode() {
        let real = gpusched_bus::encode(&Envelope::V1(BatchV1 {
            producer: "agent".into(),
            epoch: 1,
            first_seq: 10,
            last_seq: 11,
            correlation_id: None,
            events: vec![
                Event::TopologyConfigured { levels: vec![] },
                Event::TopologyConfigured { levels: vec![] },
            ],
        }))
        .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let msgs = malformed(Some(&real), &mut rng);
        assert!(msgs.len() >= 9);
        let mut cut_range = 0;
        for m in &msgs {
            match gpusched_bus::decode(m) {
                Err(_) => {}
                // The one decodable: fewer events than its range.
                Ok(Envelope::V1(b)) => {
                    assert!(b.events.len() < (b.last_seq - b.first_seq + 1) as usize);
                    cut_range += 1;
                }
            }
        }
        assert_eq!(cut_range, 1);
    }
}
