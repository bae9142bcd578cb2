//! Pull consumption of envelopes with explicit acks.
//!
//! Owns: [`ConsumerSpec`] (what a consumer binds to), [`Delivery`] (with
//! the trace headers it came with),
//! [`Subscriber`] (one pull request per call, bound once) and
//! [`StreamSubscriber`] (one long-lived pull stream, bound lazily and
//! re-bound after faults). Must never: stop consuming because a message is
//! malformed (it is terminated and reported), ack a message on the
//! caller's behalf when it decoded (the caller acks after it has acted on
//! it), or wait on the server without a bound.
//!
//! Why two: a [`Subscriber`] takes exactly what it asks for, so a second
//! instance of a durable consumer resumes right after what the first one
//! acked; a [`StreamSubscriber`] keeps a pull request open across calls
//! (messages arrive before they are asked for, no request per call, and
//! nats-server 2.9's habit of leaving short pull requests unanswered does
//! not matter), so what it buffered when dropped comes back to the durable
//! only after the ack wait. Followers that read the log anyway want the
//! latter.

use std::fmt;
use std::time::Duration;

use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, Consumer},
    AckKind,
};
use futures::{FutureExt, StreamExt};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};

use crate::{bounded, decode, ensure_stream, is_connected, naming, BusError, Envelope, JobTraces};

/// The shortest wait [`Subscriber::next_batch`] sends to the server as a
/// pull request's expiry; a shorter wait is a local sleep.
pub const MIN_PULL_EXPIRES: Duration = Duration::from_millis(20);

/// How much longer than its `timeout` [`Subscriber::next_batch`] waits for
/// the server's answers before it returns what it has.
const REPLY_GRACE: Duration = Duration::from_millis(100);

/// Messages a [`StreamSubscriber`] asks for in one pull request (it asks
/// again when half are delivered).
pub const PULL_BATCH: usize = 256;

/// Expiry of each pull request of a [`StreamSubscriber`] (the client sends
/// the next one as the last expires).
pub const PULL_EXPIRES: Duration = Duration::from_secs(5);

/// Idle heartbeat the server sends on a [`StreamSubscriber`]'s open pull
/// request; two missed ones (about 2 s of silence) mean the subscription is
/// dead and it re-binds.
pub const PULL_HEARTBEAT: Duration = Duration::from_secs(1);

/// Shortest time between two bind attempts of a [`StreamSubscriber`].
pub const REBIND_INTERVAL: Duration = Duration::from_millis(500);

/// The most one bind attempt (stream, consumer, pull stream) may take.
pub const BIND_TIMEOUT: Duration = Duration::from_secs(2);

/// How often an unbound [`StreamSubscriber`] looks for the connection.
const CONNECTION_POLL: Duration = Duration::from_millis(20);

/// What a consumer binds to: the stream (re-created with its subjects if
/// missing) and the consumer's configuration (a durable name, or an
/// ephemeral consumer the server removes when idle).
#[derive(Clone, Debug)]
pub struct ConsumerSpec {
    stream: String,
    subjects: Vec<String>,
    config: pull::Config,
}

impl ConsumerSpec {
    /// The durable consumer `durable` on `stream` (whose subjects are
    /// `subjects`), with explicit acks, receiving only `filter_subject`
    /// from the start of the stream.
    pub fn durable(
        stream: &str,
        subjects: Vec<String>,
        durable: &str,
        filter_subject: &str,
    ) -> Result<Self, BusError> {
        naming::check("durable", durable)?;
        Ok(ConsumerSpec {
            stream: stream.to_string(),
            subjects,
            config: durable_config(durable, filter_subject),
        })
    }

    /// An ephemeral consumer on `stream` (whose subjects are `subjects`)
    /// without acks, receiving only `filter_subject` published from its
    /// creation on; the server removes it `inactive` after its last pull.
    pub fn ephemeral(
        stream: &str,
        subjects: Vec<String>,
        filter_subject: &str,
        inactive: Duration,
    ) -> Self {
        ConsumerSpec {
            stream: stream.to_string(),
            subjects,
            config: ephemeral_config(filter_subject, inactive),
        }
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The durable name, or `ephemeral`.
    pub fn name(&self) -> &str {
        self.config.durable_name.as_deref().unwrap_or("ephemeral")
    }

    /// Whether its messages want acks.
    fn acks(&self) -> bool {
        self.config.ack_policy != AckPolicy::None
    }
}

fn durable_config(durable: &str, filter_subject: &str) -> pull::Config {
    pull::Config {
        durable_name: Some(durable.to_string()),
        filter_subject: filter_subject.to_string(),
        ack_policy: AckPolicy::Explicit,
        ..Default::default()
    }
}

fn ephemeral_config(filter_subject: &str, inactive: Duration) -> pull::Config {
    pull::Config {
        durable_name: None,
        filter_subject: filter_subject.to_string(),
        ack_policy: AckPolicy::None,
        deliver_policy: jetstream::consumer::DeliverPolicy::New,
        inactive_threshold: inactive,
        ..Default::default()
    }
}

/// One message taken from the stream.
#[derive(Debug)]
pub struct Delivery {
    /// Its sequence number in the stream.
    pub stream_seq: u64,
    /// The subject it was published on.
    pub subject: String,
    /// Its `Nats-Msg-Id`, if any.
    pub msg_id: Option<String>,
    /// Its W3C `traceparent` header, if the publisher sent one.
    pub traceparent: Option<String>,
    /// The well-formed pairs of its [`JOB_TRACES`](crate::JOB_TRACES)
    /// header (none without one; malformed pairs are skipped).
    pub job_traces: JobTraces,
    /// Messages still waiting for this consumer after this one (the
    /// consumer's backlog, as the server counted it when it delivered).
    pub pending: u64,
    /// The decoded envelope, or why it could not be decoded. A
    /// [`Subscriber`] has already terminated a malformed message (never
    /// redelivered); from a [`StreamSubscriber`] it is terminated by
    /// [`Delivery::ack`] or [`Delivery::ack_nowait`].
    pub envelope: Result<Envelope, BusError>,
    terminated: bool,
    message: jetstream::Message,
}

impl Delivery {
    /// Decodes `message`; `terminated` says it needs no ack.
    fn new(message: jetstream::Message, terminated: bool) -> Delivery {
        let (stream_seq, pending) = message
            .info()
            .map(|i| (i.stream_sequence, i.pending))
            .unwrap_or((0, 0));
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_string())
        };
        let msg_id = header(async_nats::header::NATS_MESSAGE_ID.as_ref());
        let traceparent = header(crate::publisher::TRACEPARENT);
        let job_traces = message
            .headers
            .as_ref()
            .and_then(|h| h.get(crate::JOB_TRACES))
            .map_or_else(JobTraces::default, |v| JobTraces::parse(v.as_str()));
        Delivery {
            stream_seq,
            pending,
            subject: message.subject.to_string(),
            msg_id,
            traceparent,
            job_traces,
            envelope: decode(&message.payload),
            terminated,
            message,
        }
    }

    /// The ack this message needs: none if already terminated or its
    /// consumer wants no acks, `Term` if malformed, else `Ack`.
    fn ack_kind(&self) -> Option<AckKind> {
        if self.terminated {
            None
        } else if self.envelope.is_ok() {
            Some(AckKind::Ack)
        } else {
            Some(AckKind::Term)
        }
    }

    /// Acknowledges the message (terminates a malformed one) and waits for
    /// the server to confirm, so a consumer started afterwards with the same
    /// durable name resumes after it. Bounded by the JetStream context's
    /// request timeout.
    pub async fn ack(&self) -> Result<(), BusError> {
        let Some(kind) = self.ack_kind() else {
            return Ok(());
        };
        self.message
            .double_ack_with(kind)
            .await
            .map_err(|e| BusError::nats("ack", e))
    }

    /// Acknowledges (terminates a malformed message) without waiting for
    /// the server's confirmation (one publish, no round trip): for
    /// followers that track their own position elsewhere and only need the
    /// consumer not to redeliver.
    pub async fn ack_nowait(&self) -> Result<(), BusError> {
        let Some(kind) = self.ack_kind() else {
            return Ok(());
        };
        self.message
            .ack_with(kind)
            .await
            .map_err(|e| BusError::nats("ack", e))
    }

    /// Asks for redelivery after `delay` (e.g. when acting on it failed).
    pub async fn nak(&self, delay: Option<Duration>) -> Result<(), BusError> {
        self.message
            .ack_with(AckKind::Nak(delay))
            .await
            .map_err(|e| BusError::nats("nak", e))
    }
}

/// A pull consumer on one stream and filter subject, bound when made, that
/// sends one pull request per [`Subscriber::next_batch`] and takes only
/// what it asked for. It does not re-bind: after a server restart that lost
/// the consumer, make a new one (or use a [`StreamSubscriber`]).
#[derive(Debug)]
pub struct Subscriber {
    consumer: Consumer<pull::Config>,
    client: async_nats::Client,
    /// Whether the consumer wants acks (an ephemeral follower's does not).
    acks: bool,
}

impl Subscriber {
    /// Binds to (or creates) the durable pull consumer `durable` on
    /// `stream`, with explicit acks, receiving only `filter_subject`.
    pub async fn durable(
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
        filter_subject: &str,
    ) -> Result<Self, BusError> {
        Self::bind(js, stream, durable_config(durable, filter_subject)).await
    }

    /// An ephemeral pull consumer on `stream` that receives only messages
    /// published from now on (for read-only followers that load everything
    /// older from the log); the server removes it `inactive` after its
    /// last fetch.
    pub async fn ephemeral(
        js: &jetstream::Context,
        stream: &str,
        filter_subject: &str,
        inactive: Duration,
    ) -> Result<Self, BusError> {
        Self::bind(js, stream, ephemeral_config(filter_subject, inactive)).await
    }

    /// Binds to the durable consumer `config` names (creating it if
    /// missing), or creates an ephemeral one; acks only if its policy wants.
    async fn bind(
        js: &jetstream::Context,
        stream: &str,
        config: pull::Config,
    ) -> Result<Self, BusError> {
        let stream = js
            .get_stream(stream)
            .await
            .map_err(|e| BusError::nats("get stream", e))?;
        let acks = config.ack_policy != AckPolicy::None;
        let consumer = match config.durable_name.clone() {
            Some(name) => stream.get_or_create_consumer(&name, config).await,
            None => stream.create_consumer(config).await,
        }
        .map_err(|e| BusError::nats("create consumer", e))?;
        Ok(Subscriber {
            consumer,
            client: js.client(),
            acks,
        })
    }

    /// Takes up to `max` messages. Returns at once with what is waiting; if
    /// nothing is, waits up to `timeout` for the first message and returns
    /// as soon as it comes, with whatever else is waiting by then. An empty
    /// vector means nothing came. Malformed messages are terminated here and
    /// returned with their decode error. A `timeout` under
    /// [`MIN_PULL_EXPIRES`] with nothing waiting is slept here, not asked
    /// of the server.
    ///
    /// Returns within about `timeout` + 100 ms whatever the server does:
    /// an answer that has not come by then is given up (what it would have
    /// carried is redelivered after the ack wait), and while the client is
    /// disconnected it waits out `timeout` and returns
    /// [`BusError::NotConnected`].
    pub async fn next_batch(
        &self,
        max: usize,
        timeout: Duration,
    ) -> Result<Vec<Delivery>, BusError> {
        let max = max.max(1);
        if !is_connected(&self.client) {
            tokio::time::sleep(timeout).await;
            return Err(BusError::NotConnected { op: "fetch" });
        }
        let deadline = Instant::now() + timeout + REPLY_GRACE;
        let mut out = self.fetch_waiting(max, deadline).await?;
        if out.is_empty() && timeout < MIN_PULL_EXPIRES {
            // nats-server 2.9 drops a pull request that expires before it
            // is served without answering it. Too short to ask: wait here.
            tokio::time::sleep(timeout).await;
        } else if out.is_empty() {
            out = self.wait_for_one(timeout, deadline).await?;
            if !out.is_empty() && max > 1 {
                // What came is kept even if this second look fails.
                out.extend(
                    self.fetch_waiting(max - 1, deadline)
                        .await
                        .unwrap_or_default(),
                );
            }
        }
        Ok(out)
    }

    /// Up to `max` messages already waiting, without waiting for more.
    async fn fetch_waiting(
        &self,
        max: usize,
        deadline: Instant,
    ) -> Result<Vec<Delivery>, BusError> {
        let request = self.consumer.fetch().max_messages(max).messages();
        let batch = timeout_at(deadline, request)
            .await
            .map_err(|_| BusError::TimedOut {
                op: "fetch",
                after: REPLY_GRACE,
            })?
            .map_err(|e| BusError::nats("fetch", e))?;
        self.collect(batch, deadline).await
    }

    /// One message if it comes within `timeout`: a pull request for one
    /// returns when it arrives, one for more would wait out `timeout`.
    async fn wait_for_one(
        &self,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Vec<Delivery>, BusError> {
        let request = self
            .consumer
            .batch()
            .max_messages(1)
            .expires(timeout)
            .messages();
        let batch = timeout_at(deadline, request)
            .await
            .map_err(|_| BusError::TimedOut {
                op: "fetch",
                after: timeout + REPLY_GRACE,
            })?
            .map_err(|e| BusError::nats("fetch", e))?;
        self.collect(batch, deadline).await
    }

    /// What `batch` delivers until it ends or `deadline` passes.
    async fn collect(
        &self,
        mut batch: pull::Batch,
        deadline: Instant,
    ) -> Result<Vec<Delivery>, BusError> {
        let mut out = Vec::new();
        while let Ok(Some(item)) = timeout_at(deadline, batch.next()).await {
            match item {
                Ok(message) => out.push(self.deliver(message, deadline).await),
                // Keep what arrived; report the error only if nothing did.
                Err(e) if out.is_empty() => return Err(BusError::nats("fetch", e)),
                Err(_) => break,
            }
        }
        Ok(out)
    }

    /// Decodes `message`, terminating it (within `deadline`) if malformed.
    async fn deliver(&self, message: jetstream::Message, deadline: Instant) -> Delivery {
        let mut delivery = Delivery::new(message, !self.acks);
        if !delivery.terminated && delivery.envelope.is_err() {
            let term = delivery.message.double_ack_with(AckKind::Term);
            delivery.terminated = matches!(timeout_at(deadline, term).await, Ok(Ok(())));
        }
        delivery
    }
}

/// A pull consumer read through one long-lived pull stream (a pull request
/// kept open with idle heartbeats, renewed by the client), bound lazily and
/// re-bound by itself.
///
/// Making one needs no server. [`StreamSubscriber::next_batch`] binds on
/// first use: it re-creates the stream if missing, binds to (or creates)
/// the consumer, and opens the pull stream. After a read error, two missed
/// heartbeats or a disconnect it drops the binding and binds again, at
/// most once per [`REBIND_INTERVAL`], each attempt bounded by
/// [`BIND_TIMEOUT`] and made only while the client is connected. An
/// ephemeral consumer that still exists is reused (a new one would start
/// at "new" and miss what was published in between). Messages buffered
/// when a binding is dropped, or sent by the server to the dropped pull
/// request before it expires ([`PULL_EXPIRES`]), are lost to this
/// subscriber (a durable consumer redelivers them after its ack wait).
pub struct StreamSubscriber {
    js: jetstream::Context,
    client: async_nats::Client,
    spec: ConsumerSpec,
    link: Link,
    /// When the last bind attempt started.
    last_attempt: Option<Instant>,
    /// Why it is not bound (last error), for [`BusError::Unbound`].
    reason: String,
    /// The server's name of the consumer last bound (reused if it exists).
    consumer_name: Option<String>,
}

/// Where a [`StreamSubscriber`] stands.
enum Link {
    Unbound,
    /// A bind attempt runs in its own task, so that it completes even when
    /// callers wait less than it takes.
    Binding(JoinHandle<Result<Bound, BusError>>),
    Bound(Box<Bound>),
}

struct Bound {
    consumer_name: String,
    messages: pull::Stream,
}

impl fmt::Debug for StreamSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let link = match &self.link {
            Link::Unbound => "unbound",
            Link::Binding(_) => "binding",
            Link::Bound(_) => "bound",
        };
        f.debug_struct("StreamSubscriber")
            .field("spec", &self.spec)
            .field("link", &link)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

impl Drop for StreamSubscriber {
    fn drop(&mut self) {
        if let Link::Binding(task) = &self.link {
            task.abort();
        }
    }
}

impl StreamSubscriber {
    /// A subscriber for `spec` over `js`, not bound yet (no I/O).
    pub fn new(js: jetstream::Context, spec: ConsumerSpec) -> Self {
        StreamSubscriber {
            client: js.client(),
            js,
            spec,
            link: Link::Unbound,
            last_attempt: None,
            reason: "not bound yet".to_string(),
            consumer_name: None,
        }
    }

    /// What it binds to.
    pub fn spec(&self) -> &ConsumerSpec {
        &self.spec
    }

    /// Whether it is bound to its consumer now.
    pub fn is_bound(&self) -> bool {
        matches!(self.link, Link::Bound(_))
    }

    /// Takes up to `max` messages: waits up to `timeout` for the first and
    /// returns as soon as it comes, with whatever else had arrived by then.
    /// An empty vector means nothing came. Malformed messages are returned
    /// with their decode error (not yet terminated).
    ///
    /// Returns within `timeout` (plus scheduling) whatever the server does.
    /// While it cannot bind (server down, disconnected, a bind failing) it
    /// waits out `timeout` — or less, if it binds meanwhile and reads — and
    /// returns [`BusError::Unbound`]; the caller reads the log meanwhile.
    /// Cancel-safe: dropping the future loses no message and no bind.
    pub async fn next_batch(
        &mut self,
        max: usize,
        timeout: Duration,
    ) -> Result<Vec<Delivery>, BusError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_bound() {
                if !is_connected(&self.client) {
                    self.unbind("disconnected from the server".to_string());
                    continue;
                }
                return self.read(max.max(1), deadline).await;
            }
            if !self.bind_until(deadline).await {
                return Err(self.unbound_error());
            }
        }
    }

    /// Reads what the bound pull stream has; drops the binding on an error
    /// or the end of the stream.
    async fn read(&mut self, max: usize, deadline: Instant) -> Result<Vec<Delivery>, BusError> {
        let terminated = !self.spec.acks();
        let Link::Bound(bound) = &mut self.link else {
            return Ok(Vec::new());
        };
        let Ok(first) = timeout_at(deadline, bound.messages.next()).await else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let mut next = Some(first);
        let mut failure = None;
        // After the first, only what has already arrived: no await, so a
        // cancelled call loses nothing.
        while let Some(item) = next.take() {
            match item {
                Some(Ok(message)) => out.push(Delivery::new(message, terminated)),
                Some(Err(e)) => failure = Some(format!("pull: {e}")),
                None => failure = Some("pull stream ended".to_string()),
            }
            if failure.is_none() && out.len() < max {
                next = bound.messages.next().now_or_never();
            }
        }
        if let Some(reason) = failure {
            self.unbind(reason);
            if out.is_empty() {
                return Err(self.unbound_error());
            }
        }
        Ok(out)
    }

    /// Drives binding until bound (`true`) or `deadline` (`false`).
    async fn bind_until(&mut self, deadline: Instant) -> bool {
        loop {
            match &mut self.link {
                Link::Bound(_) => return true,
                Link::Binding(task) => {
                    let Ok(joined) = timeout_at(deadline, task).await else {
                        return false;
                    };
                    match joined {
                        Ok(Ok(bound)) => {
                            self.consumer_name = Some(bound.consumer_name.clone());
                            self.link = Link::Bound(Box::new(bound));
                        }
                        Ok(Err(e)) => self.unbind(e.to_string()),
                        Err(e) => self.unbind(format!("bind task: {e}")),
                    }
                }
                Link::Unbound => {
                    if !self.wait_for_attempt(deadline).await {
                        return false;
                    }
                    self.start_bind();
                }
            }
        }
    }

    /// Waits until a bind attempt is due and the client is connected
    /// (`true`), or until `deadline` (`false`).
    async fn wait_for_attempt(&mut self, deadline: Instant) -> bool {
        loop {
            let now = Instant::now();
            let due = self.last_attempt.map_or(now, |t| t + REBIND_INTERVAL);
            let connected = is_connected(&self.client);
            if due <= now && connected {
                return true;
            }
            if !connected {
                self.reason = "not connected to the server".to_string();
            }
            let wake = due.max(now + CONNECTION_POLL);
            if wake >= deadline {
                sleep_until(deadline).await;
                return false;
            }
            sleep_until(wake).await;
        }
    }

    fn start_bind(&mut self) {
        self.last_attempt = Some(Instant::now());
        let (js, spec) = (self.js.clone(), self.spec.clone());
        let reuse = self.consumer_name.clone();
        self.link = Link::Binding(tokio::spawn(async move {
            bounded("bind", BIND_TIMEOUT, bind(js, spec, reuse)).await
        }));
    }

    /// Drops the binding (its pull stream and subscription) for `reason`.
    fn unbind(&mut self, reason: String) {
        self.link = Link::Unbound;
        self.reason = reason;
    }

    fn unbound_error(&self) -> BusError {
        BusError::Unbound {
            consumer: self.spec.name().to_string(),
            reason: self.reason.clone(),
        }
    }
}

/// Ensures the stream, binds to the consumer (the durable one, the
/// ephemeral one named `reuse` if it still exists, else a new ephemeral
/// one) and opens its pull stream.
async fn bind(
    js: jetstream::Context,
    spec: ConsumerSpec,
    reuse: Option<String>,
) -> Result<Bound, BusError> {
    let stream = ensure_stream(&js, &spec.stream, spec.subjects.clone()).await?;
    let existing = match (&spec.config.durable_name, reuse) {
        (None, Some(name)) => stream.get_consumer(&name).await.ok(),
        _ => None,
    };
    let consumer: Consumer<pull::Config> = match (existing, spec.config.durable_name.clone()) {
        (Some(consumer), _) => consumer,
        (None, Some(durable)) => stream
            .get_or_create_consumer(&durable, spec.config.clone())
            .await
            .map_err(|e| BusError::nats("create consumer", e))?,
        (None, None) => stream
            .create_consumer(spec.config.clone())
            .await
            .map_err(|e| BusError::nats("create consumer", e))?,
    };
    let messages = consumer
        .stream()
        .max_messages_per_batch(PULL_BATCH)
        .expires(PULL_EXPIRES)
        .heartbeat(PULL_HEARTBEAT)
        .messages()
        .await
        .map_err(|e| BusError::nats("pull", e))?;
    Ok(Bound {
        consumer_name: consumer.cached_info().name.clone(),
        messages,
    })
}
