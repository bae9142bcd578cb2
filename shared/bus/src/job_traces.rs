//! Per-job trace context on the bus: the `gpusched-job-traces` header.
//!
//! A message's `traceparent` header names one span (the publisher's
//! cycle); one message carries many jobs' events, each job with a trace of
//! its own. This header lists, for the jobs of the message that have a
//! trace context, `job_id=traceparent` pairs separated by commas:
//!
//! ```text
//! gpusched-job-traces: 17=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01,18=00-…
//! ```
//!
//! Owns: [`JobTraces`] (the pairs), their header form ([`JobTraces::to_header`])
//! and reading it back ([`JobTraces::parse`]), and the W3C syntax check of
//! a `traceparent` ([`is_traceparent`]).
//!
//! Must never: fail, refuse or delay a message because of this header (a
//! missing header is no pairs; a malformed pair is skipped, the others
//! kept), read more than [`MAX_JOB_TRACES`] pairs from one header, or let
//! a pair affect anything but tracing.

use std::collections::HashSet;

use gpusched_events::Event;
use gpusched_model::JobId;

/// The NATS header that carries the pairs.
pub const JOB_TRACES: &str = "gpusched-job-traces";

/// The most pairs read from one header (a message holds at most 1,024
/// events; more pairs than that are junk), and kept in one [`JobTraces`].
pub const MAX_JOB_TRACES: usize = 4096;

/// Longest header value read (4,096 pairs of a 20-digit id and a 55-byte
/// `traceparent`, with separators); a longer one is ignored whole.
const MAX_HEADER_LEN: usize = MAX_JOB_TRACES * 80;

/// Which jobs of a message carry which W3C `traceparent`, in order, only
/// well-formed ones; a job given twice has the last pair given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobTraces {
    pairs: Vec<(JobId, String)>,
}

impl JobTraces {
    /// No pairs.
    pub fn new() -> Self {
        JobTraces::default()
    }

    /// Adds `job`'s pair (a later one for the same job wins); refused
    /// (`false`) when `traceparent` is not well formed or
    /// [`MAX_JOB_TRACES`] are held.
    pub fn insert(&mut self, job: JobId, traceparent: &str) -> bool {
        if !is_traceparent(traceparent) || self.pairs.len() >= MAX_JOB_TRACES {
            return false;
        }
        self.pairs.push((job, traceparent.to_string()));
        true
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// How many pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// `job`'s `traceparent`, if it has one here (the last given).
    pub fn get(&self, job: JobId) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(j, _)| *j == job)
            .map(|(_, tp)| tp.as_str())
    }

    /// The pairs, in order (a job given twice: both, the one that counts
    /// last).
    pub fn iter(&self) -> impl Iterator<Item = (JobId, &str)> {
        self.pairs.iter().map(|(j, tp)| (*j, tp.as_str()))
    }

    /// The pairs of the jobs that `events` name (for one part of a batch
    /// split over several messages).
    pub fn for_events(&self, events: &[Event]) -> JobTraces {
        if self.pairs.is_empty() {
            return JobTraces::default();
        }
        let jobs: HashSet<JobId> = events.iter().filter_map(Event::job).collect();
        JobTraces {
            pairs: self
                .pairs
                .iter()
                .filter(|(j, _)| jobs.contains(j))
                .cloned()
                .collect(),
        }
    }

    /// The header value, or `None` with no pairs (send no header).
    pub fn to_header(&self) -> Option<String> {
        if self.pairs.is_empty() {
            return None;
        }
        let mut out = String::with_capacity(self.pairs.len() * 64);
        for (i, (job, tp)) in self.pairs.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&job.0.to_string());
            out.push('=');
            out.push_str(tp);
        }
        Some(out)
    }

    /// Reads a header value: pairs that are not `<decimal job id>=<W3C
    /// traceparent>` (spaces around either allowed) are skipped, never an
    /// error; at most [`MAX_JOB_TRACES`] are kept, and a value longer than
    /// a full header could be is ignored whole.
    pub fn parse(header: &str) -> JobTraces {
        let mut out = JobTraces::default();
        if header.len() > MAX_HEADER_LEN {
            return out;
        }
        for pair in header.split(',').take(MAX_JOB_TRACES) {
            let Some((job, tp)) = pair.split_once('=') else {
                continue;
            };
            let Ok(job) = job.trim().parse::<u64>() else {
                continue;
            };
            out.insert(JobId(job), tp.trim());
        }
        out
    }
}

/// Whether `s` is a W3C `traceparent` as this system writes and reads it:
/// `version-traceid-spanid-flags`, lowercase hex of 2, 32, 16 and 2
/// digits, a version other than `ff`, and neither id all zeros.
pub fn is_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let hex = |p: &str, n: usize| {
        p.len() == n && p.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let zero = |p: &str| p.bytes().all(|b| b == b'0');
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && !zero(parts[1])
        && hex(parts[2], 16)
        && !zero(parts[2])
        && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::Timestamp;

    const A: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const B: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn pairs_round_trip_through_the_header() {
        let mut t = JobTraces::new();
        assert_eq!(t.to_header(), None, "no pairs, no header");
        assert!(t.insert(JobId(17), A));
        assert!(t.insert(JobId(18), B));
        let h = t.to_header().expect("a header");
        assert_eq!(h, format!("17={A},18={B}"));
        assert_eq!(JobTraces::parse(&h), t);
        assert_eq!(t.get(JobId(18)), Some(B));
        assert_eq!(t.get(JobId(19)), None);
        // The last pair given for a job wins.
        assert!(t.insert(JobId(17), B));
        assert_eq!(t.get(JobId(17)), Some(B));
        assert_eq!(
            JobTraces::parse(&t.to_header().expect("a header")).get(JobId(17)),
            Some(B)
        );
    }

    #[test]
    fn malformed_pairs_are_skipped_and_the_rest_kept() {
        let h = format!(
            "garbage,=,x={A}, 5 = {A} ,6=00-zz,7={},8={},9={},-1={A},,10={B}=,11=,{B},12={}",
            A.to_uppercase(),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            &A[..54],
        );
        let t = JobTraces::parse(&h);
        let got: Vec<(u64, &str)> = t.iter().map(|(j, tp)| (j.0, tp)).collect();
        assert_eq!(got, vec![(5, A)]);
        assert!(JobTraces::parse("").is_empty());
        assert!(JobTraces::parse("\u{1F4A5}=\u{1F4A5}").is_empty());
        assert!(JobTraces::parse(&"1=".repeat(MAX_HEADER_LEN)).is_empty());
    }

    #[test]
    fn at_most_the_bound_is_read() {
        let h: Vec<String> = (0..MAX_JOB_TRACES as u64 + 10)
            .map(|j| format!("{j}={A}"))
            .collect();
        let t = JobTraces::parse(&h.join(","));
        assert_eq!(t.len(), MAX_JOB_TRACES);
        let mut full = t.clone();
        assert!(!full.insert(JobId(u64::MAX), A), "full");
    }

    #[test]
    fn a_part_keeps_only_its_jobs_pairs() {
        let mut t = JobTraces::new();
        t.insert(JobId(1), A);
        t.insert(JobId(2), B);
        let events = vec![
            Event::JobAccepted { job: JobId(2) },
            Event::JobStarted {
                job: JobId(3),
                at: Timestamp(1),
            },
        ];
        let part = t.for_events(&events);
        assert_eq!(part.len(), 1);
        assert_eq!(part.get(JobId(2)), Some(B));
        assert!(JobTraces::new().for_events(&events).is_empty());
    }

    #[test]
    fn traceparents_are_checked() {
        assert!(is_traceparent(A));
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert!(!is_traceparent(bad), "{bad:?}");
        }
    }
}
