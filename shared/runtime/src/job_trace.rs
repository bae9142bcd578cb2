//! One job's way through the services as one trace.
//!
//! A message on the bus carries, beside its events, the trace context of
//! the jobs they concern (the `gpusched-job-traces` header:
//! [`JobTraces`]). A stage remembers the newest context of each job it
//! learned ([`JobContexts`], bounded). When its decider emits events for a
//! job it knows, the stage opens one span for that job ([`JobSpans`]),
//! named after what the service did (`admit`, `charge quota`, `bind`, …),
//! parented on that context and covering the append; the span's own
//! context goes out with the batch, so the next service's span is its
//! child. The gateway's `submit` span starts the trace; it ends when the
//! job is bound, or ends before that (the entry is dropped then).
//!
//! Owns: [`JobContexts`], [`JobSpans`] and the span names ([`action`]).
//!
//! Must never: hold more than its bound of jobs however deep the queue
//! (the oldest learned go first), reach the decider or change what it
//! decides (this is the shell's; the core never sees a trace), fail a
//! cycle or a message over a missing or malformed context (it is ignored),
//! or cost anything but a map lookup per job event while no job has a
//! context (OpenTelemetry off upstream).

use std::collections::VecDeque;

use gpusched_bus::{BatchV1, JobTraces};
use gpusched_events::Event;
use gpusched_model::JobId;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use rustc_hash::FxHashMap;
use tracing::{field, info_span, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::telemetry::{parent_context, traceparent_of};

/// Most jobs whose trace context one stage keeps.
pub(crate) const MAX_JOB_CONTEXTS: usize = 65_536;

/// Whether `event` ends its job's trace: the job is bound, or it ended
/// (rejected, cancelled, finished) before that.
pub(crate) fn ends_trace(event: &Event) -> bool {
    matches!(event, Event::JobBound { .. }) || event.ends_job()
}

/// The name of the span for a job whose (last) event this cycle is
/// `event`: what the service did.
pub(crate) fn action(event: &Event) -> &'static str {
    match event {
        Event::JobSubmitted { .. } => "submit",
        Event::JobAccepted { .. } => "admit",
        Event::JobRejected { .. } => "reject",
        Event::JobAdmitted { .. } => "charge quota",
        Event::JobPending { .. } => "keep pending",
        Event::JobBound { .. } => "bind",
        Event::ReservationMade { .. } => "reserve",
        Event::PreemptionPlanned { .. } => "plan preemption",
        Event::JobPreempted { .. } => "preempt",
        Event::JobRequeued { .. } => "requeue",
        Event::JobStarted { .. } => "start",
        Event::JobCheckpointed { .. } => "checkpoint",
        Event::JobFinished { .. } => "finish",
        Event::JobCancelled { .. } => "cancel",
        Event::JobCancelRequested { .. } => "request cancel",
        other => other.kind(),
    }
}

struct Entry {
    cx: SpanContext,
    /// The log sequence of the event it was learned with: an older one
    /// never replaces it.
    seq: u64,
    /// Which insertion this is (the eviction order's entry for it).
    generation: u64,
}

/// The trace context of each job a stage knows one for, at most `cap`
/// jobs (the oldest learned are dropped first).
pub(crate) struct JobContexts {
    cap: usize,
    map: FxHashMap<JobId, Entry>,
    /// Insertion order; entries of jobs forgotten since are skipped.
    order: VecDeque<(JobId, u64)>,
    next_generation: u64,
}

impl JobContexts {
    /// Empty, keeping at most `cap` jobs (at least 1).
    pub(crate) fn new(cap: usize) -> Self {
        JobContexts {
            cap: cap.max(1),
            map: FxHashMap::default(),
            order: VecDeque::new(),
            next_generation: 0,
        }
    }

    /// Jobs known.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The context known for `job`.
    pub(crate) fn get(&self, job: JobId) -> Option<&SpanContext> {
        self.map.get(&job).map(|e| &e.cx)
    }

    /// Learns what a delivered batch says of its jobs' traces: a pair
    /// counts only for a job with an event in the batch, when that
    /// `traceparent` is valid; a batch that ends a job's trace forgets it.
    pub(crate) fn learn(&mut self, batch: &BatchV1, jobs: &JobTraces) {
        if jobs.is_empty() {
            return;
        }
        // Each job's last event in the batch, and whether the batch ends
        // its trace.
        let mut in_batch: FxHashMap<JobId, (u64, bool)> = FxHashMap::default();
        for (i, e) in batch.events.iter().enumerate() {
            if let Some(job) = e.job() {
                let at = in_batch.entry(job).or_insert((0, false));
                at.0 = batch.first_seq.saturating_add(i as u64);
                at.1 |= ends_trace(e);
            }
        }
        for (job, tp) in jobs.iter() {
            let Some(&(seq, ends)) = in_batch.get(&job) else {
                continue;
            };
            if ends {
                self.forget(job);
                continue;
            }
            let sc = parent_context(tp).span().span_context().clone();
            if sc.is_valid() {
                self.remember(job, sc, seq);
            }
        }
    }

    /// Notes `cx` as `job`'s context as of log sequence `seq`, unless one
    /// of a later event is known.
    pub(crate) fn remember(&mut self, job: JobId, cx: SpanContext, seq: u64) {
        if let Some(e) = self.map.get_mut(&job) {
            if seq >= e.seq {
                e.cx = cx;
                e.seq = seq;
            }
            return;
        }
        while self.map.len() >= self.cap {
            self.drop_oldest();
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        self.map.insert(
            job,
            Entry {
                cx,
                seq,
                generation,
            },
        );
        self.order.push_back((job, generation));
        if self.order.len() > 2 * self.cap {
            // Forgotten jobs' places: at least `cap` of them go at once.
            let map = &self.map;
            self.order
                .retain(|(j, g)| map.get(j).is_some_and(|e| e.generation == *g));
        }
    }

    fn drop_oldest(&mut self) {
        while let Some((job, generation)) = self.order.pop_front() {
            if self
                .map
                .get(&job)
                .is_some_and(|e| e.generation == generation)
            {
                self.map.remove(&job);
                return;
            }
        }
        // Unreachable with a consistent order; never loop forever.
        self.map.clear();
    }

    /// Forgets `job`'s context.
    pub(crate) fn forget(&mut self, job: JobId) {
        self.map.remove(&job);
    }

    /// Sees an event folded: one that ends its job's trace forgets it.
    pub(crate) fn observe(&mut self, event: &Event) {
        if !self.map.is_empty() && ends_trace(event) {
            if let Some(job) = event.job() {
                self.forget(job);
            }
        }
    }

    /// Opens a span for each job of `events` with a known context, parented
    /// on it (before the append: the spans cover it).
    pub(crate) fn open_spans(&self, service: &str, events: &[Event]) -> JobSpans {
        if self.map.is_empty() {
            return JobSpans::default();
        }
        // Each job with a context: its last event here, and how many.
        let mut jobs: Vec<(JobId, usize, usize)> = Vec::new();
        let mut at: FxHashMap<JobId, usize> = FxHashMap::default();
        for (i, e) in events.iter().enumerate() {
            let Some(job) = e.job() else { continue };
            if !self.map.contains_key(&job) {
                continue;
            }
            match at.get(&job) {
                Some(&k) => {
                    jobs[k].1 = i;
                    jobs[k].2 += 1;
                }
                None => {
                    at.insert(job, jobs.len());
                    jobs.push((job, i, 1));
                }
            }
        }
        let spans = jobs
            .into_iter()
            .filter_map(|(job, index, n)| {
                let sc = self.get(job)?.clone();
                let event = &events[index];
                let span = info_span!(
                    parent: None,
                    "job",
                    otel.name = action(event),
                    service,
                    job_id = job.0,
                    event_kind = event.kind(),
                    events = n,
                    seq = field::Empty,
                );
                let _ = span.set_parent(Context::new().with_remote_span_context(sc));
                Some(JobSpan { job, index, span })
            })
            .collect();
        JobSpans { spans }
    }
}

struct JobSpan {
    job: JobId,
    /// The job's last event in the batch.
    index: usize,
    span: Span,
}

/// The spans one cycle opened, one per job with a known trace context.
/// Dropping them ends them.
#[derive(Default)]
pub(crate) struct JobSpans {
    spans: Vec<JobSpan>,
}

impl JobSpans {
    /// After the append committed at `first_seq`: records each span's log
    /// sequence, notes its context as its job's newest in `contexts`, ends
    /// it, and returns the contexts as pairs for the outgoing message.
    pub(crate) fn close(self, first_seq: u64, contexts: &mut JobContexts) -> JobTraces {
        let mut out = JobTraces::new();
        for s in self.spans {
            let seq = first_seq.saturating_add(s.index as u64);
            s.span.record("seq", seq);
            let cx = s.span.context();
            let sc = cx.span().span_context().clone();
            if !sc.is_valid() {
                continue;
            }
            if let Some(tp) = traceparent_of(&cx) {
                out.insert(s.job, &tp);
            }
            contexts.remember(s.job, sc, seq);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::Timestamp;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const TP2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn sc(tp: &str) -> SpanContext {
        parent_context(tp).span().span_context().clone()
    }

    fn batch(first_seq: u64, events: Vec<Event>) -> BatchV1 {
        BatchV1::new("gateway", 1, first_seq, events)
    }

    fn traces(pairs: &[(u64, &str)]) -> JobTraces {
        let mut t = JobTraces::new();
        for (j, tp) in pairs {
            t.insert(JobId(*j), tp);
        }
        t
    }

    #[test]
    fn at_most_the_bound_is_kept_and_the_oldest_goes_first() {
        let mut c = JobContexts::new(3);
        for j in 1..=5 {
            c.remember(JobId(j), sc(TP), j);
        }
        assert_eq!(c.len(), 3);
        assert!(c.get(JobId(1)).is_none() && c.get(JobId(2)).is_none());
        assert!(c.get(JobId(5)).is_some());
        // Forgetting and learning many keeps the order bounded too.
        for j in 10..10_000 {
            c.remember(JobId(j), sc(TP), j);
            c.forget(JobId(j - 1));
        }
        assert!(c.len() <= 3);
        assert!(c.order.len() <= 2 * 3 + 1, "{}", c.order.len());
        assert!(c.get(JobId(9_999)).is_some());
    }

    #[test]
    fn learns_only_valid_pairs_of_the_batchs_own_jobs() {
        let mut c = JobContexts::new(100);
        let b = batch(
            10,
            vec![
                Event::JobAccepted { job: JobId(1) },
                Event::JobAccepted { job: JobId(2) },
            ],
        );
        let mut t = traces(&[(1, TP), (3, TP)]);
        t.insert(JobId(2), "garbage");
        c.learn(&b, &t);
        assert_eq!(c.get(JobId(1)), Some(&sc(TP)));
        assert!(c.get(JobId(2)).is_none(), "malformed");
        assert!(c.get(JobId(3)).is_none(), "not in the batch");
        // An older event's context never replaces a newer one.
        c.learn(
            &batch(5, vec![Event::JobAccepted { job: JobId(1) }]),
            &traces(&[(1, TP2)]),
        );
        assert_eq!(c.get(JobId(1)), Some(&sc(TP)));
        c.learn(
            &batch(20, vec![Event::JobAccepted { job: JobId(1) }]),
            &traces(&[(1, TP2)]),
        );
        assert_eq!(c.get(JobId(1)), Some(&sc(TP2)));
    }

    #[test]
    fn binding_or_ending_forgets_the_job() {
        let mut c = JobContexts::new(100);
        for j in 1..=4 {
            c.remember(JobId(j), sc(TP), 1);
        }
        c.observe(&Event::JobBound {
            job: JobId(1),
            assignments: vec![],
            backfill_for: None,
            at: Timestamp(1),
        });
        c.observe(&Event::JobCancelled {
            job: JobId(2),
            at: Timestamp(1),
        });
        c.observe(&Event::JobAccepted { job: JobId(3) });
        assert!(c.get(JobId(1)).is_none() && c.get(JobId(2)).is_none());
        assert!(c.get(JobId(3)).is_some());
        // A batch that ends a job's trace forgets it, whatever it carries.
        c.learn(
            &batch(
                9,
                vec![Event::JobRejected {
                    job: JobId(4),
                    reason: gpusched_events::RejectReason::UnknownTenant { tenant: "x".into() },
                }],
            ),
            &traces(&[(4, TP2)]),
        );
        assert!(c.get(JobId(4)).is_none());
    }

    #[test]
    fn a_known_jobs_span_is_a_child_of_its_context_and_passes_its_own_on() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let mut c = JobContexts::new(100);
            c.remember(JobId(7), sc(TP), 1);
            let events = vec![
                Event::JobAccepted { job: JobId(7) },
                Event::JobAccepted { job: JobId(8) },
            ];
            let spans = c.open_spans("admission", &events);
            assert_eq!(spans.spans.len(), 1, "only the job with a context");
            let out = spans.close(41, &mut c);
            assert_eq!(out.len(), 1);
            let tp = out.get(JobId(7)).expect("job 7's new context");
            assert!(
                tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
                "{tp}"
            );
            assert!(!tp.contains("00f067aa0ba902b7"), "a span of its own: {tp}");
            let next = c.get(JobId(7)).expect("still known").span_id();
            assert_eq!(next, sc(tp).span_id(), "the next span continues it");
        });
        // Without an OpenTelemetry layer: no span contexts, nothing passed on.
        let mut c = JobContexts::new(100);
        c.remember(JobId(7), sc(TP), 1);
        let spans = c.open_spans("admission", &[Event::JobAccepted { job: JobId(7) }]);
        assert!(spans.close(1, &mut c).is_empty());
    }
}
