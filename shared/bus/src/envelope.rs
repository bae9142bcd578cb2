//! The versioned wire format of a committed event batch.
//!
//! Owns: [`Envelope`], [`encode`], [`decode`] and the idempotency key
//! [`msg_id`]. Must never: reorder or remove variants of the wire enum
//! (postcard encodes variants by position), or panic on malformed input.
//!
//! # How the events travel
//!
//! The envelope header (producer, epoch, sequence range, correlation id)
//! and the events are one postcard message. `Event` is an internally
//! tagged serde enum (`#[serde(tag = "type")]`, the JSON form the log
//! stores), which postcard cannot read back (see the test
//! `postcard_rejects_internally_tagged_event`); the events travel in
//! their binary form, `gpusched_events::binary`: each event's variant
//! index and fields by position, checked against `Event` by the compiler.
//! Every follower decodes every batch, so the bus form is the one that is
//! cheap to read (docs/loadtest.md, "Encoding: measured").
//!
//! Two wire forms decode; one is written:
//!
//! - **`0`: JSON events** (written before the binary form existed): the
//!   header, then the events as one JSON array (`Vec<Event>` as
//!   `serde_json` writes it), a length-prefixed byte string. Still read,
//!   so a stream written by an older build replays.
//! - **`1`: binary events** (written now): the writer's binary form
//!   number (`gpusched_events::binary::FORM`), the header, then the event
//!   count and each event's binary form. A reader of another form number
//!   refuses the message ([`BusError::UnknownBinaryForm`]) before reading
//!   any event.
//!
//! A reader that predates the binary form cannot decode it and treats the
//! message as malformed: it reads those events from the log instead
//! (`gpusched-runtime`), so services of both builds may run side by side
//! during an upgrade.
//!
//! Wire layout (postcard): form index (varint), in form `1` the binary
//! form number (varint), `producer` (varint
//! length, then UTF-8), `epoch`, `first_seq`, `last_seq` (varints),
//! `correlation_id` (`0` = none, `1` then the string), then the events
//! (form `0`: varint length, then JSON bytes; form `1`: varint count, then
//! the events).

use gpusched_events::{binary, Event};
use serde::{Deserialize, Serialize};

use crate::BusError;

/// One committed batch of events from one producer, version 1.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchV1 {
    /// The producer (stage) that committed the batch; also the last subject
    /// token of `<root>.evt.<producer>`.
    pub producer: String,
    /// The producer's epoch (fencing generation).
    pub epoch: u64,
    /// Sequence number of the first event in the batch.
    pub first_seq: u64,
    /// Sequence number of the last event in the batch.
    pub last_seq: u64,
    /// Correlates the batch with the command or request that caused it.
    pub correlation_id: Option<String>,
    /// The events, in order.
    pub events: Vec<Event>,
}

impl BatchV1 {
    /// The batch of `events` a producer committed at `first_seq` onwards
    /// (consecutive sequences), with no correlation id: the one way a
    /// batch for the bus is made.
    pub fn new(
        producer: impl Into<String>,
        epoch: u64,
        first_seq: u64,
        events: Vec<Event>,
    ) -> Self {
        BatchV1 {
            producer: producer.into(),
            epoch,
            first_seq,
            last_seq: first_seq + (events.len() as u64).saturating_sub(1),
            correlation_id: None,
            events,
        }
    }
}

/// A message on the bus. Variants are only appended, never reordered.
#[derive(Clone, Debug, PartialEq)]
pub enum Envelope {
    /// Version 1: a committed event batch.
    V1(BatchV1),
}

impl Envelope {
    /// The producer that wrote the batch.
    pub fn producer(&self) -> &str {
        match self {
            Envelope::V1(b) => &b.producer,
        }
    }
}

/// The postcard form. Variant order is the wire format: only append.
#[derive(Serialize, Deserialize)]
enum WireEnvelope {
    /// A batch with its events as JSON (read, no longer written).
    V1Json(WireBatchV1Json),
    /// A batch with its events in their binary form.
    V1Binary(WireBatchV1Binary),
}

#[derive(Serialize, Deserialize)]
struct WireBatchV1Json {
    producer: String,
    epoch: u64,
    first_seq: u64,
    last_seq: u64,
    correlation_id: Option<String>,
    events_json: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct WireBatchV1Binary {
    /// `gpusched_events::binary::FORM` of the writer (checked by
    /// [`decode`] before anything else is read).
    form: u16,
    producer: String,
    epoch: u64,
    first_seq: u64,
    last_seq: u64,
    correlation_id: Option<String>,
    #[serde(with = "gpusched_events::binary::events")]
    events: Vec<Event>,
}

/// The wire index of [`WireEnvelope::V1Binary`] (postcard writes a
/// variant's index as a varint `u32`), which [`decode`] peeks at to check
/// the binary form before reading events.
const BINARY_FORM_INDEX: u32 = 1;

/// What [`encode`] writes: the same layout as [`WireEnvelope`], borrowed
/// (no copy of the events).
#[derive(Serialize)]
enum WireEnvelopeOut<'a> {
    /// Not written any more; declared to keep the next variant's index.
    #[allow(dead_code)]
    V1Json(()),
    V1Binary(WireBatchV1BinaryOut<'a>),
}

#[derive(Serialize)]
struct WireBatchV1BinaryOut<'a> {
    form: u16,
    producer: &'a str,
    epoch: u64,
    first_seq: u64,
    last_seq: u64,
    correlation_id: Option<&'a str>,
    #[serde(with = "gpusched_events::binary::events")]
    events: &'a [Event],
}

/// Encodes an envelope to its wire bytes (form `1`: binary events).
pub fn encode(envelope: &Envelope) -> Result<Vec<u8>, BusError> {
    let Envelope::V1(b) = envelope;
    let wire = WireEnvelopeOut::V1Binary(WireBatchV1BinaryOut {
        form: binary::FORM,
        producer: &b.producer,
        epoch: b.epoch,
        first_seq: b.first_seq,
        last_seq: b.last_seq,
        correlation_id: b.correlation_id.as_deref(),
        events: &b.events,
    });
    postcard::to_allocvec(&wire).map_err(|e| BusError::Encode(format!("envelope: {e}")))
}

/// Encodes an envelope as builds before the binary form did (form `0`:
/// the events as JSON): for tests and benchmarks of mixed versions. No
/// service writes it.
pub fn encode_json_form(envelope: &Envelope) -> Result<Vec<u8>, BusError> {
    let Envelope::V1(b) = envelope;
    let wire = WireEnvelope::V1Json(WireBatchV1Json {
        producer: b.producer.clone(),
        epoch: b.epoch,
        first_seq: b.first_seq,
        last_seq: b.last_seq,
        correlation_id: b.correlation_id.clone(),
        events_json: serde_json::to_vec(&b.events)
            .map_err(|e| BusError::Encode(format!("events: {e}")))?,
    });
    postcard::to_allocvec(&wire).map_err(|e| BusError::Encode(format!("envelope: {e}")))
}

/// Decodes wire bytes of either form; malformed input gives an error,
/// never a panic. Trailing bytes after the envelope are an error.
pub fn decode(bytes: &[u8]) -> Result<Envelope, BusError> {
    // Form 1 starts with the writer's binary form: a build reads only its
    // own (a positional layout read as another would misread events).
    if let Ok(((BINARY_FORM_INDEX, form), _)) = postcard::take_from_bytes::<(u32, u16)>(bytes) {
        if form != binary::FORM {
            return Err(BusError::UnknownBinaryForm { found: form });
        }
    }
    let (wire, rest): (WireEnvelope, &[u8]) =
        postcard::take_from_bytes(bytes).map_err(BusError::Envelope)?;
    if !rest.is_empty() {
        return Err(BusError::TrailingBytes(rest.len()));
    }
    Ok(Envelope::V1(match wire {
        WireEnvelope::V1Json(w) => BatchV1 {
            events: serde_json::from_slice(&w.events_json).map_err(BusError::Events)?,
            producer: w.producer,
            epoch: w.epoch,
            first_seq: w.first_seq,
            last_seq: w.last_seq,
            correlation_id: w.correlation_id,
        },
        WireEnvelope::V1Binary(w) => BatchV1 {
            producer: w.producer,
            epoch: w.epoch,
            first_seq: w.first_seq,
            last_seq: w.last_seq,
            correlation_id: w.correlation_id,
            events: w.events,
        },
    }))
}

/// The idempotency key (`Nats-Msg-Id`) of an envelope:
/// `<producer>-<epoch>-<last_seq>`.
pub fn msg_id(envelope: &Envelope) -> String {
    match envelope {
        Envelope::V1(b) => format!("{}-{}-{}", b.producer, b.epoch, b.last_seq),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gpusched_events::Event;

    fn sample() -> Envelope {
        Envelope::V1(BatchV1 {
            producer: "admit".to_string(),
            epoch: 3,
            first_seq: 300,
            last_seq: 301,
            correlation_id: Some("c1".to_string()),
            events: vec![
                Event::TopologyConfigured {
                    levels: vec!["rack".to_string()],
                },
                Event::TopologyConfigured { levels: vec![] },
            ],
        })
    }

    /// Checked in: what `encode` writes for `sample()`, and must keep
    /// decoding forever.
    const GOLDEN_BINARY: &[u8] = &[
        0x01, // form 1: binary events
        0x05, // binary form 5
        0x05, b'a', b'd', b'm', b'i', b't', // producer
        0x03, // epoch
        0xac, 0x02, // first_seq 300
        0xad, 0x02, // last_seq 301
        0x01, 0x02, b'c', b'1', // correlation_id Some("c1")
        0x02, // two events
        0x00, 0x01, 0x04, b'r', b'a', b'c', b'k', // topology_configured ["rack"]
        0x00, 0x00, // topology_configured []
    ];

    /// Checked in: the JSON form an older build wrote for `sample()`; it
    /// must keep decoding forever.
    const GOLDEN_JSON_HEADER: &[u8] = &[
        0x00, // form 0: JSON events
        0x05, b'a', b'd', b'm', b'i', b't', // producer
        0x03, // epoch
        0xac, 0x02, // first_seq 300
        0xad, 0x02, // last_seq 301
        0x01, 0x02, b'c', b'1', // correlation_id Some("c1")
        0x5d, // 93 bytes of JSON
    ];
    const GOLDEN_JSON_EVENTS: &[u8] = br#"[{"type":"topology_configured","levels":["rack"]},{"type":"topology_configured","levels":[]}]"#;

    fn golden_json() -> Vec<u8> {
        let mut v = GOLDEN_JSON_HEADER.to_vec();
        v.extend_from_slice(GOLDEN_JSON_EVENTS);
        v
    }

    #[test]
    fn golden_bytes_encode() {
        assert_eq!(encode(&sample()).unwrap(), GOLDEN_BINARY);
    }

    #[test]
    fn golden_bytes_decode() {
        assert_eq!(decode(GOLDEN_BINARY).unwrap(), sample());
    }

    #[test]
    fn the_json_form_still_decodes() {
        assert_eq!(GOLDEN_JSON_EVENTS.len(), 0x5d);
        assert_eq!(decode(&golden_json()).unwrap(), sample());
        assert_eq!(encode_json_form(&sample()).unwrap(), golden_json());
    }

    #[test]
    fn golden_bytes_no_correlation_no_events() {
        let env = Envelope::V1(BatchV1 {
            producer: "p".to_string(),
            epoch: 0,
            first_seq: 1,
            last_seq: 1,
            correlation_id: None,
            events: vec![],
        });
        let binary: &[u8] = &[0x01, 0x05, 0x01, b'p', 0x00, 0x01, 0x01, 0x00, 0x00];
        assert_eq!(encode(&env).unwrap(), binary);
        assert_eq!(decode(binary).unwrap(), env);
        let json: &[u8] = &[0x00, 0x01, b'p', 0x00, 0x01, 0x01, 0x00, 0x02, b'[', b']'];
        assert_eq!(decode(json).unwrap(), env);
    }

    #[test]
    fn round_trip() {
        let env = sample();
        assert_eq!(decode(&encode(&env).unwrap()).unwrap(), env);
    }

    #[test]
    fn malformed_inputs_are_typed_errors() {
        assert!(matches!(decode(&[]), Err(BusError::Envelope(_))));
        assert!(matches!(
            decode(b"not postcard at all"),
            Err(BusError::Envelope(_))
        ));
        assert!(matches!(decode(&[0x07]), Err(BusError::Envelope(_))));
        let mut trailing = GOLDEN_BINARY.to_vec();
        trailing.push(0);
        assert!(matches!(decode(&trailing), Err(BusError::TrailingBytes(1))));
        let bad_json: &[u8] = &[0x00, 0x01, b'p', 0, 1, 1, 0, 0x02, b'{', b'}'];
        assert!(matches!(decode(bad_json), Err(BusError::Events(_))));
        // An event variant this build does not know.
        let unknown_event: &[u8] = &[0x01, 0x05, 0x01, b'p', 0, 1, 1, 0, 0x01, 0x7f];
        assert!(matches!(decode(unknown_event), Err(BusError::Envelope(_))));
        // Another release's binary form (an earlier one, or a later one)
        // is refused before any event is read.
        for found in [1, 2, 3, 4, 6] {
            let mut other_form = GOLDEN_BINARY.to_vec();
            other_form[1] = found;
            assert!(matches!(
                decode(&other_form),
                Err(BusError::UnknownBinaryForm { found: f }) if f == u16::from(found)
            ));
        }
        // Every truncation of a valid message is an error, never a panic.
        for g in [GOLDEN_BINARY.to_vec(), golden_json()] {
            for n in 0..g.len() {
                assert!(decode(&g[..n]).is_err(), "prefix of {n} bytes decoded");
            }
        }
    }

    #[test]
    fn postcard_rejects_internally_tagged_event() {
        // Why events need their binary form: postcard cannot decode
        // `#[serde(tag)]`.
        let ev = Event::TopologyConfigured {
            levels: vec!["rack".to_string()],
        };
        let bytes = postcard::to_allocvec(&ev).unwrap();
        assert!(postcard::from_bytes::<Event>(&bytes).is_err());
    }

    #[test]
    fn msg_id_is_producer_epoch_last_seq() {
        assert_eq!(msg_id(&sample()), "admit-3-301");
    }
}
