//! Job arrays: many jobs submitted as one, alike but for an index.
//!
//! Owns: the index set a user writes (`0-999`, `1,3,5-9`, `0-98:2`, and
//! `0-999%50` for at most 50 tasks running at once), its reading with
//! errors that say what is wrong, and a task's place in its array
//! ([`ArrayTask`]). Must never: give an array more than
//! [`MAX_ARRAY_TASKS`] tasks, or the same index twice.

use serde::{Deserialize, Serialize};

/// Most tasks one array may hold.
pub const MAX_ARRAY_TASKS: usize = 1000;

/// Largest index a task may have.
pub const MAX_ARRAY_INDEX: u32 = 999_999;

/// A job's place in a job array. Set by the gateway when it writes the
/// array's tasks; a submission that sets it is refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArrayTask {
    /// The array's id: the job id of its first task.
    pub array: u64,
    /// This task's index (what `GPUSCHED_ARRAY_INDEX` holds while it runs).
    pub index: u32,
    /// At most this many of the array's tasks are queued for quota or
    /// hold it at once (`%N`); the rest wait their turn. `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
}

/// An array's index set and its limit, as `0-999%50` writes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArraySet {
    /// The indices, in the order written.
    pub indices: Vec<u32>,
    /// At most this many tasks at once (`%N`), if given.
    pub max_running: Option<u32>,
}

/// Why an index set was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArrayIndicesError {
    /// Nothing was given.
    #[error("must list at least one index, e.g. 0-999 or 1,3,5-9")]
    Empty,
    /// A part is not `N`, `A-B` or `A-B:STEP`.
    #[error("{part:?} is not N, A-B or A-B:STEP (e.g. 0-999, 1,3,5-9, 0-98:2)")]
    Malformed {
        /// The part, as written.
        part: String,
    },
    /// A range that runs backwards, or a step of 0.
    #[error("{part:?}: a range runs from low to high with a step of at least 1")]
    BadRange {
        /// The part, as written.
        part: String,
    },
    /// An index above [`MAX_ARRAY_INDEX`].
    #[error("{part:?}: indices run from 0 to {MAX_ARRAY_INDEX}")]
    TooLarge {
        /// The part, as written.
        part: String,
    },
    /// An index listed twice.
    #[error("index {index} is listed twice")]
    Repeated {
        /// The index.
        index: u32,
    },
    /// A `%N` limit that is not a whole number of at least 1.
    #[error("%{limit}: the limit after % is a whole number of at least 1 (e.g. 0-999%50)")]
    BadLimit {
        /// The limit, as written.
        limit: String,
    },
    /// More than [`MAX_ARRAY_TASKS`] indices.
    #[error("holds {count} tasks; an array holds at most {MAX_ARRAY_TASKS}")]
    TooMany {
        /// How many the set names (at least).
        count: usize,
    },
}

/// Reads an index set with an optional limit on the tasks running at
/// once: `INDICES%N` (`0-999%50`), where `N` is at least 1.
pub fn parse_array_set(raw: &str) -> Result<ArraySet, ArrayIndicesError> {
    let (set, limit) = match raw.rsplit_once('%') {
        Some((set, limit)) => (set, Some(limit.trim())),
        None => (raw, None),
    };
    let max_running = match limit {
        None => None,
        Some(raw) => match raw.parse::<u32>() {
            Ok(n) if n >= 1 && raw.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(ArrayIndicesError::BadLimit { limit: raw.into() }),
        },
    };
    Ok(ArraySet {
        indices: parse_array_indices(set)?,
        max_running,
    })
}

/// Reads an index set: comma-separated parts, each `N`, `A-B` (both ends
/// included) or `A-B:STEP`. The indices come back in the order written.
pub fn parse_array_indices(raw: &str) -> Result<Vec<u32>, ArrayIndicesError> {
    let mut out: Vec<u32> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for part in raw.split(',').map(str::trim) {
        if part.is_empty() {
            if raw.trim().is_empty() {
                return Err(ArrayIndicesError::Empty);
            }
            return Err(ArrayIndicesError::Malformed { part: part.into() });
        }
        let (lo, hi, step) = parse_part(part)?;
        let count = ((hi - lo) / step) as usize + 1;
        if out.len() + count > MAX_ARRAY_TASKS {
            return Err(ArrayIndicesError::TooMany {
                count: out.len() + count,
            });
        }
        for index in (lo..=hi).step_by(step as usize) {
            if !seen.insert(index) {
                return Err(ArrayIndicesError::Repeated { index });
            }
            out.push(index);
        }
    }
    Ok(out)
}

/// One part: (low, high, step).
fn parse_part(part: &str) -> Result<(u32, u32, u32), ArrayIndicesError> {
    let malformed = || ArrayIndicesError::Malformed { part: part.into() };
    let number = |s: &str| -> Result<u32, ArrayIndicesError> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed());
        }
        match s.parse::<u32>() {
            Ok(n) if n <= MAX_ARRAY_INDEX => Ok(n),
            _ => Err(ArrayIndicesError::TooLarge { part: part.into() }),
        }
    };
    let (range, step) = match part.split_once(':') {
        Some((r, s)) => (r, Some(s)),
        None => (part, None),
    };
    let (lo, hi) = match range.split_once('-') {
        Some((a, b)) => (number(a)?, number(b)?),
        None if step.is_none() => {
            let n = number(range)?;
            (n, n)
        }
        None => return Err(malformed()),
    };
    let step = step.map(number).transpose()?.unwrap_or(1);
    if lo > hi || step == 0 {
        return Err(ArrayIndicesError::BadRange { part: part.into() });
    }
    Ok((lo, hi, step))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_lists_and_steps_read_in_the_order_written() {
        assert_eq!(parse_array_indices("0-3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(parse_array_indices("7").unwrap(), vec![7]);
        assert_eq!(
            parse_array_indices("9, 1,3-5").unwrap(),
            vec![9, 1, 3, 4, 5]
        );
        assert_eq!(parse_array_indices("0-9:4").unwrap(), vec![0, 4, 8]);
        assert_eq!(parse_array_indices("0-999").unwrap().len(), 1000);
    }

    #[test]
    fn bad_sets_say_what_is_wrong() {
        use ArrayIndicesError as E;
        assert_eq!(parse_array_indices(" "), Err(E::Empty));
        assert!(matches!(
            parse_array_indices("1,,2"),
            Err(E::Malformed { .. })
        ));
        assert!(matches!(
            parse_array_indices("a-3"),
            Err(E::Malformed { .. })
        ));
        assert!(matches!(
            parse_array_indices("-3"),
            Err(E::Malformed { .. })
        ));
        assert!(matches!(
            parse_array_indices("+3"),
            Err(E::Malformed { .. })
        ));
        assert!(matches!(
            parse_array_indices("3:2"),
            Err(E::Malformed { .. })
        ));
        assert!(matches!(
            parse_array_indices("5-1"),
            Err(E::BadRange { .. })
        ));
        assert!(matches!(
            parse_array_indices("1-5:0"),
            Err(E::BadRange { .. })
        ));
        assert!(matches!(
            parse_array_indices("0-99999999999"),
            Err(E::TooLarge { .. })
        ));
        assert_eq!(parse_array_indices("1-3,2"), Err(E::Repeated { index: 2 }));
        assert_eq!(
            parse_array_indices("0-1000"),
            Err(E::TooMany { count: 1001 })
        );
        assert_eq!(
            parse_array_indices("0-500,501-1000"),
            Err(E::TooMany { count: 1001 })
        );
        let msg = parse_array_indices("0-x").unwrap_err().to_string();
        assert!(msg.contains("\"0-x\""), "{msg}");
    }

    #[test]
    fn a_limit_follows_the_set_after_a_percent_sign() {
        let set = parse_array_set("0-999%50").unwrap();
        assert_eq!((set.indices.len(), set.max_running), (1000, Some(50)));
        let set = parse_array_set("1,3").unwrap();
        assert_eq!((set.indices, set.max_running), (vec![1, 3], None));
        for bad in ["0-9%0", "0-9%", "0-9%x", "0-9%+2", "0-9%99999999999"] {
            assert!(
                matches!(
                    parse_array_set(bad),
                    Err(ArrayIndicesError::BadLimit { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_array_set("%5"),
            Err(ArrayIndicesError::Empty)
        ));
    }
}
