//! A service's view of the scheduler: the core `State` folded from the log
//! in sequence order.
//!
//! Owns: the fold position, batches that arrived ahead of a gap, and the
//! count of superseded events. Batches come from the bus in any order (or
//! not at all); the projection applies only the next sequence, keeps later
//! batches until the gap closes, and reads the log to close a gap the bus
//! does not.
//!
//! Must never: apply an event twice or out of order, or decide anything.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use gpusched_bus::BatchV1;
use gpusched_core::{LogTally, State};
use gpusched_events::Event;
use gpusched_store::{Result, SEQ_MAX};

use crate::log::Log;

/// Rows read per round trip when rebuilding or filling a gap.
const PAGE: usize = 10_000;

/// Called for every event folded: the state after the fold, the event's
/// sequence, the event, and whether `apply` took it (false: superseded).
pub type Observer<'a> = dyn FnMut(&State, u64, &Event, bool) + Send + 'a;

/// The state folded from the log (module docs).
#[derive(Debug, Default)]
pub struct Projection {
    state: State,
    seq: u64,
    ahead: BTreeMap<u64, Arc<BatchV1>>,
    gap_since: Option<Instant>,
    superseded: u64,
    /// What the folded events did, counted (`counting`); `None` in the
    /// deciding services, which do not export it.
    tally: Option<Box<LogTally>>,
}

impl Projection {
    /// An empty projection at sequence 0.
    pub fn new() -> Self {
        Projection {
            state: State::new(),
            ..Default::default()
        }
    }

    /// A projection at `seq` with `state`, the log folded up to it (a
    /// checked snapshot).
    pub fn at(state: State, seq: u64) -> Self {
        Projection {
            state,
            seq,
            ..Default::default()
        }
    }

    /// This projection, counting what the events it folds from now on do
    /// (`tally`).
    pub fn counting(mut self) -> Self {
        self.tally.get_or_insert_with(Box::default);
        self
    }

    /// What the events folded since counting began did, if counting.
    pub fn tally(&self) -> Option<&LogTally> {
        self.tally.as_deref()
    }

    /// Moves to a checked snapshot: `state` is the log folded up to `seq`.
    /// A tally keeps counting from there (the events the snapshot covers
    /// are not counted).
    pub fn restart_at(&mut self, state: State, seq: u64) {
        let tally = self.tally.take();
        *self = Projection::at(state, seq);
        self.tally = tally;
    }

    /// Folds the whole log as it stands.
    pub async fn rebuild(log: &Log, observe: &mut Observer<'_>) -> Result<Self> {
        let mut p = Projection::new();
        p.catch_up(log, SEQ_MAX, observe).await?;
        Ok(p)
    }

    /// The state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Sequence of the last event folded.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Events `apply` refused so far (decisions made void by an earlier
    /// event of another writer).
    pub fn superseded(&self) -> u64 {
        self.superseded
    }

    /// Whether batches are waiting behind a gap, and since when.
    pub fn gap_since(&self) -> Option<Instant> {
        self.gap_since
    }

    /// The last sequence missing before the first waiting batch, when
    /// batches wait behind a gap: reading the log up to it closes the gap.
    pub fn gap_end(&self) -> Option<u64> {
        self.ahead
            .first_key_value()
            .map(|(&first, _)| first.saturating_sub(1))
    }

    /// The highest sequence known to exist (folded or waiting).
    pub fn known_seq(&self) -> u64 {
        self.ahead
            .values()
            .map(|b| b.last_seq)
            .max()
            .unwrap_or(0)
            .max(self.seq)
    }

    /// Folds one event read from the log; it must be the next one.
    pub fn fold_one(&mut self, seq: u64, ev: &Event, observe: &mut Observer<'_>) {
        if seq == self.seq + 1 {
            self.fold(seq, ev, observe);
        }
    }

    /// After folds from the log: drops waiting batches now behind and folds
    /// those that became contiguous. Returns the events folded.
    pub fn settle(&mut self, observe: &mut Observer<'_>) -> usize {
        let seq = self.seq;
        self.ahead.retain(|_, b| b.last_seq > seq);
        self.drain(observe)
    }

    fn fold(&mut self, seq: u64, ev: &Event, observe: &mut Observer<'_>) {
        let ok = self.state.apply(ev).is_ok();
        if !ok {
            self.superseded += 1;
        }
        self.seq = seq;
        if let Some(t) = self.tally.as_mut() {
            t.observe(&self.state, ev, ok);
        }
        observe(&self.state, seq, ev, ok);
    }

    /// Takes a batch from the bus and folds everything now contiguous.
    /// Returns the events folded.
    pub fn offer(&mut self, batch: Arc<BatchV1>, observe: &mut Observer<'_>) -> usize {
        if batch.last_seq > self.seq && !batch.events.is_empty() {
            // The same range may come twice and cut differently (a service's
            // own batch, then the bus's parts of it): keep the longer, so a
            // part never hides the rest of what was known.
            match self.ahead.entry(batch.first_seq) {
                Entry::Occupied(mut held) if held.get().last_seq < batch.last_seq => {
                    held.insert(batch);
                }
                Entry::Occupied(_) => {}
                Entry::Vacant(slot) => {
                    slot.insert(batch);
                }
            }
        }
        self.drain(observe)
    }

    fn drain(&mut self, observe: &mut Observer<'_>) -> usize {
        let mut folded = 0;
        while let Some((&first, _)) = self.ahead.first_key_value() {
            if first > self.seq + 1 {
                break;
            }
            let Some((_, b)) = self.ahead.pop_first() else {
                break;
            };
            for (i, ev) in b.events.iter().enumerate() {
                let seq = b.first_seq + i as u64;
                if seq == self.seq + 1 {
                    self.fold(seq, ev, observe);
                    folded += 1;
                }
            }
        }
        self.gap_since = if self.ahead.is_empty() {
            None
        } else {
            self.gap_since.or_else(|| Some(Instant::now()))
        };
        folded
    }

    /// Reads the log from the fold position up to `upto` (`SEQ_MAX`: its
    /// end; a bound above it is `StoreError::OutOfRange` on Postgres) and
    /// folds it, then whatever waiting batches become contiguous. Returns
    /// the events folded.
    pub async fn catch_up(
        &mut self,
        log: &Log,
        upto: u64,
        observe: &mut Observer<'_>,
    ) -> Result<usize> {
        let mut folded = 0;
        let mut pages = log.pages(self.seq, upto, PAGE);
        while let Some(page) = pages.next().await {
            for le in page? {
                if le.seq == self.seq + 1 {
                    self.fold(le.seq, &le.event, observe);
                    folded += 1;
                }
            }
        }
        Ok(folded + self.settle(observe))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first: u64, n: u64) -> Arc<BatchV1> {
        Arc::new(BatchV1 {
            producer: "admin".into(),
            epoch: 1,
            first_seq: first,
            last_seq: first + n - 1,
            correlation_id: None,
            events: (0..n)
                .map(|_| Event::TopologyConfigured {
                    levels: vec!["rack".into()],
                })
                .collect(),
        })
    }

    #[test]
    fn a_gap_ends_just_before_the_first_waiting_batch() {
        let mut p = Projection::new();
        let mut obs = |_: &State, _: u64, _: &Event, _: bool| {};
        assert_eq!(p.offer(batch(1, 2), &mut obs), 2);
        assert_eq!(p.gap_end(), None);
        assert_eq!(p.offer(batch(7, 3), &mut obs), 0);
        assert_eq!(p.offer(batch(12, 1), &mut obs), 0);
        assert_eq!(p.gap_end(), Some(6));
        assert!(p.gap_since().is_some());
        assert_eq!(p.offer(batch(3, 4), &mut obs), 7);
        assert_eq!(p.gap_end(), Some(11));
    }

    #[test]
    fn a_part_of_a_waiting_batch_never_hides_the_rest_of_it() {
        // Given a service's own 2000-event batch waiting behind a gap,
        let mut p = Projection::new();
        let mut obs = |_: &State, _: u64, _: &Event, _: bool| {};
        assert_eq!(p.offer(batch(11, 2000), &mut obs), 0);
        // when the bus delivers its first part (same first sequence) and
        // then the gap closes,
        assert_eq!(p.offer(batch(11, 1024), &mut obs), 0);
        assert_eq!(p.offer(batch(1, 10), &mut obs), 2010);
        // then everything known is folded, none of it left out.
        assert_eq!(p.seq(), 2010);
        assert_eq!(p.gap_since(), None);
        // A longer batch with the same start still replaces a shorter one.
        assert_eq!(p.offer(batch(2101, 5), &mut obs), 0);
        assert_eq!(p.offer(batch(2101, 50), &mut obs), 0);
        assert_eq!(p.offer(batch(2011, 90), &mut obs), 140);
        assert_eq!(p.seq(), 2150);
    }
}
