//! The versioned wire format of a committed event batch.
//!
//! Owns: [`Envelope`], [`encode`], [`decode`] and the idempotency key
//! [`msg_id`]. Must never: reorder or remove variants of the wire enum
//! (postcard encodes variants by position), or panic on malformed input.
//!
//! # Why the events travel as JSON inside postcard
//!
//! `Event` (and the reasons it carries) is an internally tagged serde enum
//! (`#[serde(tag = "type")]`). Deserializing such enums needs
//! `deserialize_any`, which postcard, a non-self-describing format, does not
//! support: encoding succeeds but decoding fails (see the test
//! `postcard_rejects_internally_tagged_event`). A postcard-safe mirror of
//! every event type would duplicate the whole `gpusched-events` crate and
//! must be kept in step with it by hand. So the envelope header (producer,
//! epoch, sequence range, correlation id) is postcard, and the events are
//! one JSON array (`Vec<Event>` as `serde_json` writes it) carried as a
//! byte string in the last field. JSON is the encoding `Event` is designed
//! for, is self-describing (new event variants do not shift old ones), and
//! the golden-bytes tests pin both layers.
//!
//! Wire layout of V1 (postcard): variant index `0` (varint), `producer`
//! (varint length + UTF-8), `epoch`, `first_seq`, `last_seq` (varints),
//! `correlation_id` (`0` = none, `1` + string), events JSON (varint length
//! + bytes).

use gpusched_events::Event;
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
    V1(WireBatchV1),
}

#[derive(Serialize, Deserialize)]
struct WireBatchV1 {
    producer: String,
    epoch: u64,
    first_seq: u64,
    last_seq: u64,
    correlation_id: Option<String>,
    events_json: Vec<u8>,
}

/// Encodes an envelope to its wire bytes.
pub fn encode(envelope: &Envelope) -> Result<Vec<u8>, BusError> {
    let wire = match envelope {
        Envelope::V1(b) => WireEnvelope::V1(WireBatchV1 {
            producer: b.producer.clone(),
            epoch: b.epoch,
            first_seq: b.first_seq,
            last_seq: b.last_seq,
            correlation_id: b.correlation_id.clone(),
            events_json: serde_json::to_vec(&b.events)
                .map_err(|e| BusError::Encode(format!("events: {e}")))?,
        }),
    };
    postcard::to_allocvec(&wire).map_err(|e| BusError::Encode(format!("envelope: {e}")))
}

/// Decodes wire bytes; malformed input gives an error, never a panic.
/// Trailing bytes after the envelope are an error.
pub fn decode(bytes: &[u8]) -> Result<Envelope, BusError> {
    let (wire, rest): (WireEnvelope, &[u8]) =
        postcard::take_from_bytes(bytes).map_err(BusError::Envelope)?;
    if !rest.is_empty() {
        return Err(BusError::TrailingBytes(rest.len()));
    }
    match wire {
        WireEnvelope::V1(w) => {
            let events: Vec<Event> =
                serde_json::from_slice(&w.events_json).map_err(BusError::Events)?;
            Ok(Envelope::V1(BatchV1 {
                producer: w.producer,
                epoch: w.epoch,
                first_seq: w.first_seq,
                last_seq: w.last_seq,
                correlation_id: w.correlation_id,
                events,
            }))
        }
    }
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

    /// Checked in: these bytes must keep decoding to `sample()` forever.
    const GOLDEN_V1: &[u8] = &[
        0x00, // variant V1
        0x05, b'a', b'd', b'm', b'i', b't', // producer
        0x03, // epoch
        0xac, 0x02, // first_seq 300
        0xad, 0x02, // last_seq 301
        0x01, 0x02, b'c', b'1', // correlation_id Some("c1")
        0x5d, // 93 bytes of JSON
    ];
    const GOLDEN_V1_JSON: &[u8] = br#"[{"type":"topology_configured","levels":["rack"]},{"type":"topology_configured","levels":[]}]"#;

    fn golden() -> Vec<u8> {
        let mut v = GOLDEN_V1.to_vec();
        v.extend_from_slice(GOLDEN_V1_JSON);
        v
    }

    #[test]
    fn golden_bytes_encode() {
        assert_eq!(GOLDEN_V1_JSON.len(), 0x5d);
        assert_eq!(encode(&sample()).unwrap(), golden());
    }

    #[test]
    fn golden_bytes_decode() {
        assert_eq!(decode(&golden()).unwrap(), sample());
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
        let bytes: &[u8] = &[0x00, 0x01, b'p', 0x00, 0x01, 0x01, 0x00, 0x02, b'[', b']'];
        assert_eq!(encode(&env).unwrap(), bytes);
        assert_eq!(decode(bytes).unwrap(), env);
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
        let mut trailing = golden();
        trailing.push(0);
        assert!(matches!(decode(&trailing), Err(BusError::TrailingBytes(1))));
        let bad_json: &[u8] = &[0x00, 0x01, b'p', 0, 1, 1, 0, 0x02, b'{', b'}'];
        assert!(matches!(decode(bad_json), Err(BusError::Events(_))));
        // Every truncation of a valid message is an error, never a panic.
        let g = golden();
        for n in 0..g.len() {
            assert!(decode(&g[..n]).is_err(), "prefix of {n} bytes decoded");
        }
    }

    #[test]
    fn postcard_rejects_internally_tagged_event() {
        // Why events travel as JSON: postcard cannot decode `#[serde(tag)]`.
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
