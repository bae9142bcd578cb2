//! Snapshots: the state folded up to a sequence of the log, in a versioned
//! binary encoding, so that a start folds only the log after it.
//!
//! Layout: the magic `GPSS`, the format version (u16, little-endian), the
//! sequence (u64), the state hash (32 ASCII hex digits), the blake3 digest
//! of the body (32 bytes), then the body: the whole state (every index
//! included) in postcard. Hash maps are written sorted
//! by key, so one state always encodes to the same bytes: a snapshot taken
//! at a cut of the log and folded forward is byte-for-byte the snapshot of
//! a replay from zero (the property tests check exactly this).
//!
//! [`FORMAT`] changes whenever the encoding of `State` does; a test pins
//! the bytes of a known state, so a layout change without a new format
//! number fails the build's tests.
//!
//! Owns: the encoding and its checks. Must never: hand out a state that
//! failed a check. An unknown format, a body whose digest differs, bytes
//! that do not decode, or a state whose recomputed hash differs from the
//! stored one are errors, so a bad snapshot (a flipped bit anywhere, a cut-off write, an encoder bug) can
//! only cost a longer replay, never change a decision. The
//! log, not the snapshot, is the truth.

use crate::State;

/// The encoding's version. Bump it when `State` or anything inside it
/// changes shape, and update the pinned digest in this module's tests.
pub const FORMAT: u16 = 7;

const MAGIC: &[u8; 4] = b"GPSS";
const HASH_LEN: usize = 32;
const DIGEST_LEN: usize = 32;
const HEADER_LEN: usize = 4 + 2 + 8 + HASH_LEN + DIGEST_LEN;

/// Why a snapshot was not used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes do not start with a snapshot header.
    #[error("not a gpusched snapshot (no GPSS header)")]
    NotASnapshot,
    /// Written by another version of the encoding.
    #[error("snapshot format {found}, this build reads format {FORMAT}")]
    UnknownFormat {
        /// The format in the header.
        found: u16,
    },
    /// The body is not the body that was written (damaged or cut off).
    #[error("snapshot body is damaged: its digest differs from the header's")]
    Damaged,
    /// The body does not decode.
    #[error("snapshot body does not decode: {0}")]
    Malformed(String),
    /// The decoded state is not the state that was written.
    #[error("snapshot state hash {computed} differs from the stored {stored}")]
    HashMismatch {
        /// The hash in the header.
        stored: String,
        /// The hash of the decoded state.
        computed: String,
    },
}

/// What a snapshot's header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The encoding's version.
    pub format: u16,
    /// The sequence of the last event folded into it.
    pub seq: u64,
    /// The state hash it was written with.
    pub state_hash: String,
}

/// A checked snapshot: the state folded up to `seq`.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The sequence of the last event folded.
    pub seq: u64,
    /// The state at `seq`.
    pub state: State,
}

/// Encodes `state`, folded up to `seq`.
pub fn encode(state: &State, seq: u64) -> Vec<u8> {
    let hash = state.state_hash();
    let mut out = Vec::with_capacity(HEADER_LEN + 256 * state.job_count() + 4096);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(hash.as_bytes());
    out.extend_from_slice(&[0; DIGEST_LEN]);
    // Every type inside `State` encodes to postcard (no skipped fields, no
    // internally tagged enums outside the `json` fields below): encoding
    // into a vector cannot fail.
    let mut out = match postcard::to_extend(state, out) {
        Ok(out) => out,
        Err(e) => unreachable!("a state always encodes: {e}"),
    };
    let digest = blake3::hash(&out[HEADER_LEN..]);
    out[HEADER_LEN - DIGEST_LEN..HEADER_LEN].copy_from_slice(digest.as_bytes());
    out
}

/// Reads a snapshot's header without decoding its body.
pub fn header(bytes: &[u8]) -> Result<Header, SnapshotError> {
    if bytes.len() < HEADER_LEN || &bytes[..4] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    let format = u16::from_le_bytes([bytes[4], bytes[5]]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&bytes[6..14]);
    let state_hash = std::str::from_utf8(&bytes[14..14 + HASH_LEN])
        .map_err(|_| SnapshotError::NotASnapshot)?
        .to_string();
    Ok(Header {
        format,
        seq: u64::from_le_bytes(seq),
        state_hash,
    })
}

/// Decodes and checks a snapshot: its format, its body, and the hash of
/// the decoded state against the stored one.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    let h = header(bytes)?;
    if h.format != FORMAT {
        return Err(SnapshotError::UnknownFormat { found: h.format });
    }
    let body = &bytes[HEADER_LEN..];
    if blake3::hash(body).as_bytes()[..] != bytes[HEADER_LEN - DIGEST_LEN..HEADER_LEN] {
        return Err(SnapshotError::Damaged);
    }
    let state: State =
        postcard::from_bytes(body).map_err(|e| SnapshotError::Malformed(e.to_string()))?;
    let computed = state.state_hash();
    if computed != h.state_hash {
        return Err(SnapshotError::HashMismatch {
            stored: h.state_hash,
            computed,
        });
    }
    Ok(Snapshot { seq: h.seq, state })
}

/// Hash maps as sequences of pairs sorted by key: the same map always
/// encodes to the same bytes, whatever order it was built in.
pub(crate) mod sorted_map {
    use rustc_hash::FxHashMap;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::hash::Hash;

    pub fn serialize<K, V, S>(map: &FxHashMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        K: Ord + Serialize,
        V: Serialize,
        S: Serializer,
    {
        let mut pairs: Vec<(&K, &V)> = map.iter().collect();
        pairs.sort_unstable_by(|a, b| a.0.cmp(b.0));
        s.collect_seq(pairs)
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<FxHashMap<K, V>, D::Error>
    where
        K: Eq + Hash + Deserialize<'de>,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        let pairs: Vec<(K, V)> = Vec::deserialize(d)?;
        Ok(pairs.into_iter().collect())
    }
}

/// Internally tagged enums (reasons), which postcard cannot read back, as
/// their JSON text.
pub(crate) mod json {
    use serde::de::{DeserializeOwned, Error};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        let text = match v {
            Some(v) => Some(serde_json::to_string(v).map_err(serde::ser::Error::custom)?),
            None => None,
        };
        text.serialize(s)
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(D::Error::custom),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{run_cycle, CycleConfig, ScanMemo};
    use gpusched_events::Event;
    use gpusched_model::{
        ArrayTask, CohortSpec, FlavorQuota, JobId, JobSpec, NodeId, NodeSpec, TenantSpec, Timestamp,
    };

    /// Two nodes, one tenant, five jobs: two run, three wait with reasons.
    fn known_state() -> State {
        let mut s = State::new();
        let mut events = vec![Event::TenantConfigured {
            spec: TenantSpec {
                cohort: Some("c".into()),
                ..TenantSpec::new(
                    "ml",
                    vec![FlavorQuota {
                        budget: Some(gpusched_model::Budget {
                            gpu_hours: 1_000,
                            period: gpusched_model::BudgetPeriod::Month,
                            when_spent: gpusched_model::WhenSpent::Wait,
                        }),
                        ..FlavorQuota::new("h100", 16)
                    }],
                )
            },
        }];
        for n in 0..2u32 {
            events.push(Event::NodeAdded {
                node: NodeId(n),
                spec: NodeSpec::new(format!("n{n}"), "h100", 8, &["r0", &format!("b{n}")]),
                at: Timestamp(1_000),
            });
        }
        for j in 1..=6u64 {
            events.push(Event::JobSubmitted {
                job: JobId(j),
                spec: JobSpec {
                    tenant: "ml".into(),
                    priority: j as i32 % 2,
                    workers: 1,
                    gpus_per_worker: 8,
                    flavors: vec![],
                    topology: "node".into(),
                    preemptible: true,
                    checkpoint: None,
                    max_runtime_s: Some(60),
                    command: vec!["train".into(), format!("--job={j}")],
                    env: [("SEED".to_string(), j.to_string())].into(),
                    working_dir: None,
                    checkpoint_signal: Some("SIGUSR2".into()),
                    // Tasks 2 and 4 of an array limited to one at once; 5
                    // waits for 1 to succeed, 3 for it to end; 6 waits
                    // for room.
                    array: (j == 2 || j == 4).then_some(ArrayTask {
                        array: 10,
                        index: j as u32,
                        max_running: Some(1),
                    }),
                    after_ok: if j == 5 { vec![JobId(1)] } else { vec![] },
                    after: if j == 3 { vec![JobId(1)] } else { vec![] },
                },
                at: Timestamp(2_000 + j),
            });
        }
        // Its cohort keeps use with a one-hour half-life.
        events.push(Event::CohortConfigured {
            spec: CohortSpec {
                name: "c".into(),
                usage_half_life_s: 3_600,
            },
            at: Timestamp(2_500),
        });
        for e in &events {
            s.apply(e).expect("known events apply");
        }
        let mut memo = ScanMemo::default();
        for k in 0..4 {
            run_cycle(
                &mut s,
                &mut memo,
                &CycleConfig::default(),
                Timestamp(3_000 + k * 60_000),
            )
            .expect("a cycle's decisions apply");
        }
        // The cohort's half-life set again later: members' use is rolled
        // up to then.
        s.apply(&Event::CohortConfigured {
            spec: CohortSpec {
                name: "c".into(),
                usage_half_life_s: 3_600,
            },
            at: Timestamp(600_000),
        })
        .expect("a cohort may be configured again");
        s
    }

    #[test]
    fn a_snapshot_reads_back_as_the_same_state() {
        let s = known_state();
        let bytes = encode(&s, 42);
        let back = decode(&bytes).expect("decodes");
        assert_eq!(back.seq, 42);
        assert!(back.state == s, "every field and index read back");
        assert_eq!(encode(&back.state, 42), bytes);
        assert!(back.state.check_invariants().is_ok());
        assert!(s.jobs().any(|j| j.last_reason.is_some()), "reasons covered");
        assert!(
            s.jobs().any(|j| !j.waiting_on.is_empty()),
            "dependencies covered"
        );
        assert!(
            s.array_slots(10).is_some_and(|a| !a.waiting.is_empty()),
            "array slots covered"
        );
        assert!(
            s.tenants()[0].decayed.gpu_ms(0) > 0.0,
            "decayed use covered"
        );
        assert!(
            s.tenants()[0].budget(0).is_some_and(|b| b.used_gpu_ms > 0),
            "budget ledgers covered"
        );
    }

    /// The encoding of a known state, pinned: when this fails, the shape of
    /// `State` changed. Bump `FORMAT` (old snapshots are then skipped, not
    /// misread) and paste the new digest here.
    #[test]
    fn the_layout_is_pinned_to_its_format_number() {
        let digest = blake3::hash(&encode(&known_state(), 7))
            .to_hex()
            .to_string();
        assert_eq!(
            (FORMAT, &digest[..16]),
            (7, "7b6e4847a091cfed"),
            "the snapshot encoding changed: bump snapshot::FORMAT and update this digest"
        );
    }

    #[test]
    fn a_damaged_snapshot_is_refused_never_used() {
        let bytes = encode(&known_state(), 9);
        assert_eq!(
            decode(&bytes[..10]).err(),
            Some(SnapshotError::NotASnapshot)
        );
        assert_eq!(
            decode(&bytes[..bytes.len() - 5]).err(),
            Some(SnapshotError::Damaged)
        );
        let mut other = bytes.clone();
        other[4] = 99;
        assert_eq!(
            decode(&other).err(),
            Some(SnapshotError::UnknownFormat { found: 99 })
        );
        for i in (HEADER_LEN - DIGEST_LEN..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[i] ^= 0x5a;
            assert_eq!(decode(&bad).err(), Some(SnapshotError::Damaged), "byte {i}");
        }
        let mut wrong_hash = bytes.clone();
        wrong_hash[14] = if wrong_hash[14] == b'0' { b'1' } else { b'0' };
        assert!(matches!(
            decode(&wrong_hash),
            Err(SnapshotError::HashMismatch { .. })
        ));
    }
}
