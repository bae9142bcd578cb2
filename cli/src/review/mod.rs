//! Incident review from the event log alone, with no service running: the
//! state at an instant (`replay --at --show`), what happened to a job, node
//! or tenant (`timeline`), what changed between two instants (`diff`), and
//! why a job was preempted (`why-preempted`).
//!
//! Owns: the walk (the log folded from its first event, each event shown to
//! a visitor with the state just before it; the Postgres log's, or a
//! simulated run's in memory, `walk_events`) and what an instant on the
//! command line means. The log's clock is the latest time its events have
//! carried so far: an event's time is its own `at`, or the time of the
//! events before it when it carries none or an earlier one (services'
//! clocks differ a little). Every event's time is therefore at or after the
//! one before it, and "the log at T" is every event whose time is ≤ T.
//!
//! Must never: write to the log, or show a state the log does not fold to.

mod diff;
mod preempted;
mod show;
mod timeline;

pub use diff::{diff, DiffArgs};
pub use preempted::{why_preempted, why_preempted_in_run, WhyPreemptedArgs};
pub use show::{show, ShowArgs};
pub use timeline::{timeline, TimelineArgs};

use std::str::FromStr;

use anyhow::{Context, Result};
use gpusched_core::State;
use gpusched_events::Event;
use gpusched_model::Timestamp;
use gpusched_store::{EventStore, REPLAY_PAGE};

/// A point in the log, as a flag gives it: a sequence number, or a time on
/// the log's clock (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instant {
    /// Just after the event with this sequence number.
    Seq(u64),
    /// Just after the last event whose time is at or before this one.
    Time(Timestamp),
}

impl FromStr for Instant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(n) = s.parse::<i64>() {
            return u64::try_from(n)
                .map(Instant::Seq)
                .map_err(|_| format!("{s}: a sequence number is 0 or more"));
        }
        let t = chrono::DateTime::parse_from_rfc3339(s).map_err(|_| {
            format!(
                "{s:?} is neither a sequence number nor an RFC 3339 time \
                 (such as 2026-12-02T03:12:00Z)"
            )
        })?;
        let ms = u64::try_from(t.timestamp_millis())
            .map_err(|_| format!("{s}: times before 1970 are not in any log"))?;
        Ok(Instant::Time(Timestamp(ms)))
    }
}

impl Instant {
    /// Whether the event at `seq`, at log time `time` (`None`: before any
    /// timed event), is at or before this instant.
    pub fn covers(self, seq: u64, time: Option<Timestamp>) -> bool {
        match self {
            Instant::Seq(n) => seq <= n,
            Instant::Time(t) => time.is_none_or(|x| x <= t),
        }
    }
}

/// A log time as printed: UTC, to the millisecond; `-` before the log's
/// first timed event.
pub fn time_text(t: impl Into<Option<Timestamp>>) -> String {
    let Some(t) = t.into() else {
        return "-".to_string();
    };
    i64::try_from(t.0)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || format!("{} ms", t.0),
            |d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        )
}

/// One event of the walk, with the state just before it.
pub struct Step<'a> {
    /// Its sequence number.
    pub seq: u64,
    /// Its time on the log's clock (module docs); `None` before the first
    /// event that carries one.
    pub time: Option<Timestamp>,
    /// The event.
    pub event: &'a Event,
    /// The state it meets.
    pub before: &'a State,
}

/// What a walk shows each event to.
pub trait Visitor {
    /// Before the event is folded.
    fn before(&mut self, step: &Step<'_>);
    /// After it: `applied` is false for a decision the state refused as
    /// superseded (it had no effect); `after` is the state it made.
    fn after(&mut self, _seq: u64, _event: &Event, _applied: bool, _after: &State) {}
}

/// A visitor that looks at nothing.
pub struct Quiet;

impl Visitor for Quiet {
    fn before(&mut self, _step: &Step<'_>) {}
}

/// Where a walk stopped.
pub struct Walked {
    /// The state after the last event folded.
    pub state: State,
    /// That event's sequence number (0: none).
    pub seq: u64,
    /// The log's clock there.
    pub time: Option<Timestamp>,
}

impl Walked {
    fn new() -> Walked {
        Walked {
            state: State::new(),
            seq: 0,
            time: None,
        }
    }

    /// Shows the event at `seq` to `visit` and folds it; false, folding
    /// nothing, when it is past `until`.
    fn step(
        &mut self,
        seq: u64,
        event: &Event,
        until: Option<Instant>,
        visit: &mut dyn Visitor,
    ) -> bool {
        let time = match (event.at(), self.time) {
            (Some(t), Some(c)) => Some(t.max(c)),
            (t, c) => t.or(c),
        };
        if until.is_some_and(|u| !u.covers(seq, time)) {
            return false;
        }
        visit.before(&Step {
            seq,
            time,
            event,
            before: &self.state,
        });
        let applied = self.state.apply(event).is_ok();
        visit.after(seq, event, applied, &self.state);
        self.seq = seq;
        self.time = time;
        true
    }
}

/// Folds the log from its first event up to `until` (the whole log when
/// `None`), showing each event to `visit`.
pub async fn walk(
    store: &EventStore,
    until: Option<Instant>,
    visit: &mut dyn Visitor,
) -> Result<Walked> {
    let upto = match until {
        Some(Instant::Seq(n)) => n,
        _ => store.max_seq().await.context("reading the log's end")?,
    };
    let mut out = Walked::new();
    let mut pages = store.pages(0, upto, REPLAY_PAGE);
    while let Some(page) = pages.next().await {
        for entry in page.context("reading the log")? {
            if !out.step(entry.seq, &entry.event, until, visit) {
                return Ok(out);
            }
        }
    }
    Ok(out)
}

/// Folds a whole in-memory log (a simulated run's) as `walk` folds the
/// stored one: its events numbered from 1, as appending them to an empty
/// log would number them.
pub fn walk_events(events: &[Event], visit: &mut dyn Visitor) -> Walked {
    let mut out = Walked::new();
    for (seq, event) in (1u64..).zip(events) {
        out.step(seq, event, None, visit);
    }
    out
}

/// Connects to the log for a review.
pub async fn connect(url: &str) -> Result<EventStore> {
    EventStore::connect(url, 2)
        .await
        .with_context(|| format!("--database-url {url}: cannot connect"))
}

/// The `--from` / `--to` range of `timeline` and `diff`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct RangeArgs {
    /// From just after this instant: a sequence number or an RFC 3339 time
    /// on the log's clock [default: the log's start].
    #[arg(long, value_name = "SEQ|TIME")]
    pub from: Option<Instant>,
    /// Up to this instant, inclusive [default: the log's end].
    #[arg(long, value_name = "SEQ|TIME")]
    pub to: Option<Instant>,
}

impl RangeArgs {
    /// Whether an event is inside the range.
    pub fn contains(&self, seq: u64, time: Option<Timestamp>) -> bool {
        self.from.is_none_or(|f| !f.covers(seq, time))
            && self.to.is_none_or(|t| t.covers(seq, time))
    }
}

/// Runs a review on a small runtime of its own.
pub fn run<F: std::future::Future<Output = Result<()>>>(f: F) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_is_a_sequence_or_a_time() {
        assert_eq!("42".parse::<Instant>(), Ok(Instant::Seq(42)));
        assert_eq!(
            "1970-01-01T00:00:01.5Z".parse::<Instant>(),
            Ok(Instant::Time(Timestamp(1500)))
        );
        let e = "yesterday".parse::<Instant>().unwrap_err();
        assert!(e.contains("RFC 3339"), "{e}");
        assert!("-3".parse::<Instant>().is_err());
    }

    #[test]
    fn a_range_is_open_at_its_start_and_closed_at_its_end() {
        let r = RangeArgs {
            from: Some(Instant::Seq(10)),
            to: Some(Instant::Time(Timestamp(5000))),
        };
        assert!(!r.contains(10, Some(Timestamp(100))));
        assert!(r.contains(11, Some(Timestamp(5000))));
        assert!(!r.contains(12, Some(Timestamp(5001))));
        assert!(r.contains(11, None));
        assert_eq!(time_text(Timestamp(1500)), "1970-01-01T00:00:01.500Z");
        assert_eq!(time_text(None), "-");
    }
}
