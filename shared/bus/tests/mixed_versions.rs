//! Services of two builds side by side: batches written in the older JSON
//! form and in today's binary form decode to the same events, and a log
//! carried in both, interleaved, folds into the state the log itself
//! gives. The binary form of every kind is pinned by a checked-in message.

use gpusched_bus::{decode, encode, encode_json_form, BatchV1, Envelope};
use gpusched_core::State;
use gpusched_events::Event;

fn fixture_path(name: &str) -> String {
    format!("{}/../events/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A log fixture: `shared/events/fixtures/log-v1.jsonl` (every kind of
/// binary form 1), `log-v2.jsonl` to `log-v5.jsonl` (the kinds forms 2
/// to 5 added).
fn log(name: &str) -> Vec<Event> {
    let path = fixture_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("{path}:{}: {e}", i + 1)))
        .collect()
}

fn batch(first_seq: u64, events: &[Event]) -> BatchV1 {
    BatchV1::new("fixture", 1, first_seq, events.to_vec())
}

fn fold(events: &[Event]) -> State {
    let mut s = State::new();
    for (i, e) in events.iter().enumerate() {
        s.apply(e)
            .unwrap_or_else(|err| panic!("event {}: {err}", i + 1));
    }
    s
}

/// Every fixture, one after the other (a batch, not a log to fold).
fn every_kind() -> Vec<Event> {
    let mut events = log("log-v1.jsonl");
    events.extend(log("log-v2.jsonl"));
    events.extend(log("log-v3.jsonl"));
    events.extend(log("log-v4.jsonl"));
    events.extend(log("log-v5.jsonl"));
    events
}

#[test]
fn the_binary_form_of_every_kind_is_the_checked_in_message() {
    let path = fixture_path("log-v5.bus");
    let events = every_kind();
    let b = batch(1, &events);
    let frozen = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(
        decode(&frozen).expect("the checked-in message decodes"),
        Envelope::V1(b.clone())
    );
    assert_eq!(
        encode(&Envelope::V1(b)).expect("encodes"),
        frozen,
        "the binary form changed: bump gpusched_events::binary::FORM, keep this message as one that is refused, and check in log-vN.bus of the new form beside it"
    );
}

#[test]
fn a_message_of_a_previous_binary_form_is_refused_before_any_event_is_read() {
    // log-vN.bus is what a release of form N carried: a reader of today's
    // form refuses it, and reads those events from the log instead.
    for form in [1u16, 2, 3, 4] {
        let path = fixture_path(&format!("log-v{form}.bus"));
        let old = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            matches!(
                decode(&old),
                Err(gpusched_bus::BusError::UnknownBinaryForm { found }) if found == form
            ),
            "{path}"
        );
    }
}

#[test]
fn a_log_carried_in_both_forms_interleaved_folds_as_the_log_does() {
    for name in [
        "log-v1.jsonl",
        "log-v2.jsonl",
        "log-v3.jsonl",
        "log-v4.jsonl",
        "log-v5.jsonl",
    ] {
        carried_in_both_forms(&log(name));
    }
}

fn carried_in_both_forms(events: &[Event]) {
    let events = events.to_vec();
    let mut carried = Vec::new();
    let mut seq = 1;
    for (i, part) in events.chunks(4).enumerate() {
        let b = batch(seq, part);
        seq = b.last_seq + 1;
        let bytes = if i % 2 == 0 {
            encode_json_form(&Envelope::V1(b.clone())).expect("encodes")
        } else {
            encode(&Envelope::V1(b.clone())).expect("encodes")
        };
        let Envelope::V1(back) = decode(&bytes).expect("either form decodes");
        assert_eq!(back, b, "batch {i}");
        carried.extend(back.events);
    }
    assert_eq!(carried, events);
    assert_eq!(fold(&carried).state_hash(), fold(&events).state_hash());
}
