//! An old log always replays: the checked-in logs of
//! `shared/events/fixtures/` (one per event schema version, every kind in
//! it, the oldest and newest shape of each optional field) decode and fold
//! with today's code into the state they always gave.
//!
//! A fixture is never edited once released: a change to `Event` that
//! breaks one is a change to the stored schema (docs/extending.md).

use gpusched_core::State;
use gpusched_events::{Event, KINDS};
use std::collections::BTreeSet;

/// The fixtures, with the state hash each folds to. A new schema version
/// adds a line here and a file there; none is ever removed.
const FIXTURES: [(&str, &str); 5] = [
    ("log-v1.jsonl", "41086ba72b0c59b5ee90b9a21de9be55"),
    ("log-v2.jsonl", "3b5c4941e5875f11a28b4b8ae27f359e"),
    ("log-v3.jsonl", "9e3f47b5eae3de49351d08cf28935300"),
    ("log-v4.jsonl", "61badc6777fcd5be4ad2978aa7905cb6"),
    ("log-v5.jsonl", "2450b2776a9c96c3dad713a494b1e984"),
];

fn read(name: &str) -> Vec<Event> {
    let path = format!("{}/../events/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}:{}: {e}", i + 1))
        })
        .collect()
}

fn fold(name: &str, events: &[Event]) -> State {
    let mut state = State::new();
    for (i, e) in events.iter().enumerate() {
        if let Err(err) = state.apply(e) {
            panic!("{name}:{}: {} refused: {err}", i + 1, e.kind());
        }
    }
    state
}

#[test]
fn every_fixture_folds_to_the_state_it_always_gave() {
    for (name, hash) in FIXTURES {
        let events = read(name);
        assert_eq!(fold(name, &events).state_hash(), hash, "{name}");
    }
}

#[test]
fn the_fixtures_hold_every_kind() {
    let seen: BTreeSet<&str> = FIXTURES
        .iter()
        .flat_map(|(name, _)| read(name))
        .map(|e| e.kind())
        .collect();
    let missing: Vec<&str> = KINDS
        .iter()
        .copied()
        .filter(|k| !seen.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "no fixture holds {missing:?}: add them to a new fixture"
    );
}

#[test]
fn a_fixture_reads_back_as_the_json_it_is() {
    // Decoding and writing again gives an equal event (no field is lost
    // on the way through today's types).
    for (name, _) in FIXTURES {
        for e in read(name) {
            let again: Event = serde_json::from_str(&serde_json::to_string(&e).unwrap_or_default())
                .unwrap_or_else(|err| panic!("{name}: {} does not read back: {err}", e.kind()));
            assert_eq!(again, e);
        }
    }
}

#[test]
fn every_event_of_every_fixture_reads_as_a_line_of_incident_review() {
    // `log_line` sorts each kind into a group of its own; a kind sorted
    // into the wrong group would read as an empty line.
    for (name, _) in FIXTURES {
        let mut state = State::new();
        for (i, e) in read(name).iter().enumerate() {
            let line = gpusched_core::explain::log_line(&state, e);
            assert!(
                !line.trim().is_empty(),
                "{name}:{}: {} reads as an empty line",
                i + 1,
                e.kind()
            );
            if let Err(err) = state.apply(e) {
                panic!("{name}:{}: {} refused: {err}", i + 1, e.kind());
            }
        }
    }
}

#[test]
fn an_older_releases_quota_past_the_bound_replays_and_the_pool_sums_it_saturating() {
    // Releases before the 1,000,000-GPU bound took any u32. Such a lender
    // fills its cohort's pool to the brim; lowered later, the pool holds
    // exactly what its members lend again.
    let configured = |name: &str, nominal: u32| Event::TenantConfigured {
        spec: gpusched_model::TenantSpec {
            cohort: Some("c".into()),
            ..gpusched_model::TenantSpec::new(
                name,
                vec![gpusched_model::FlavorQuota::new("h100", nominal)],
            )
        },
    };
    let mut state = State::new();
    for e in [configured("a", u32::MAX), configured("b", 8)] {
        state.apply(&e).expect("an older log's quota still applies");
    }
    let (c, f) = (
        state.cohort_idx("c").expect("cohort c"),
        state.flavor("h100").expect("flavor h100"),
    );
    assert_eq!(state.cohort(c).capacity(f), u32::MAX);
    state.apply(&configured("a", 100)).expect("lowered");
    assert_eq!(state.cohort(c).capacity(f), 108);
    state.check_invariants().expect("the invariants hold");
}
