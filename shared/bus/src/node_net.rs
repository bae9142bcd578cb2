//! The node network: how agents and the relay reach each other. NATS core
//! subjects in a deployment; an in-process hub when everything runs in one
//! process (`gpusched dev --agents process`, tests).
//!
//! Owns: publishing, subscribing to one subject, and request/reply over
//! either. Must never: persist anything (the log is the only record) or
//! interpret a payload.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::mpsc;

/// One message on the node network.
#[derive(Clone, Debug)]
pub struct NetMessage {
    /// Its body.
    pub payload: Bytes,
    /// Where to answer, for a request.
    pub reply: Option<String>,
}

/// Errors of the node network.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// NATS refused or failed.
    #[error("nats: {0}")]
    Nats(String),
    /// Nobody answered a request in time.
    #[error("no answer on {0} in time")]
    NoAnswer(String),
}

/// Where node messages go.
#[derive(Clone)]
pub enum NodeNet {
    /// A NATS connection.
    Nats(async_nats::Client),
    /// Everything in this process.
    Local(LocalHub),
}

impl std::fmt::Debug for NodeNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeNet::Nats(_) => f.write_str("NodeNet::Nats"),
            NodeNet::Local(_) => f.write_str("NodeNet::Local"),
        }
    }
}

impl NodeNet {
    /// Whether the connection is up now (in-process: always).
    pub fn connected(&self) -> bool {
        match self {
            NodeNet::Nats(c) => c.connection_state() == async_nats::connection::State::Connected,
            NodeNet::Local(_) => true,
        }
    }

    /// Sends `payload` to `subject` (at most once; level-triggered peers
    /// repair a loss with the next message).
    pub async fn publish(&self, subject: String, payload: Vec<u8>) -> Result<(), NetError> {
        match self {
            NodeNet::Nats(c) => c
                .publish(subject, payload.into())
                .await
                .map_err(|e| NetError::Nats(e.to_string())),
            NodeNet::Local(h) => {
                h.deliver(&subject, Bytes::from(payload), None);
                Ok(())
            }
        }
    }

    /// Every message sent to `subject` from now on.
    pub async fn subscribe(
        &self,
        subject: String,
    ) -> Result<BoxStream<'static, NetMessage>, NetError> {
        match self {
            NodeNet::Nats(c) => {
                let sub = c
                    .subscribe(subject)
                    .await
                    .map_err(|e| NetError::Nats(e.to_string()))?;
                Ok(sub
                    .map(|m| NetMessage {
                        payload: m.payload,
                        reply: m.reply.map(|r| r.to_string()),
                    })
                    .boxed())
            }
            NodeNet::Local(h) => Ok(h.subscribe(&subject).boxed()),
        }
    }

    /// Sends a request and waits up to `timeout` for the first answer.
    pub async fn request(
        &self,
        subject: String,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Bytes, NetError> {
        let ask = async {
            match self {
                NodeNet::Nats(c) => c
                    .request(subject.clone(), payload.into())
                    .await
                    .map(|m| m.payload)
                    .map_err(|e| NetError::Nats(e.to_string())),
                NodeNet::Local(h) => {
                    let inbox = format!("_local.reply.{}", uuid_like());
                    let mut answers = h.subscribe(&inbox);
                    h.deliver(&subject, Bytes::from(payload), Some(inbox));
                    answers
                        .next()
                        .await
                        .map(|m| m.payload)
                        .ok_or_else(|| NetError::NoAnswer(subject.clone()))
                }
            }
        };
        tokio::time::timeout(timeout, ask)
            .await
            .map_err(|_| NetError::NoAnswer(subject.clone()))?
    }

    /// Waits until what was published has left this process (NATS).
    pub async fn flush(&self) {
        if let NodeNet::Nats(c) = self {
            let _ = c.flush().await;
        }
    }
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// An in-process subject hub: exact subjects, every subscriber gets a copy.
#[derive(Clone, Default)]
pub struct LocalHub {
    subs: Arc<Mutex<HashMap<String, Vec<mpsc::UnboundedSender<NetMessage>>>>>,
}

impl LocalHub {
    /// An empty hub.
    pub fn new() -> Self {
        LocalHub::default()
    }

    fn subscribe(&self, subject: &str) -> tokio_stream_like::Receiver {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut subs) = self.subs.lock() {
            subs.entry(subject.to_string()).or_default().push(tx);
        }
        tokio_stream_like::Receiver(rx)
    }

    fn deliver(&self, subject: &str, payload: Bytes, reply: Option<String>) {
        if let Ok(mut subs) = self.subs.lock() {
            if let Some(list) = subs.get_mut(subject) {
                list.retain(|tx| {
                    tx.send(NetMessage {
                        payload: payload.clone(),
                        reply: reply.clone(),
                    })
                    .is_ok()
                });
            }
        }
    }
}

/// A receiver as a stream, without another dependency.
mod tokio_stream_like {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::sync::mpsc;

    use super::NetMessage;

    pub struct Receiver(pub mpsc::UnboundedReceiver<NetMessage>);

    impl futures::Stream for Receiver {
        type Item = NetMessage;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<NetMessage>> {
            self.0.poll_recv(cx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_local_hub_delivers_and_answers() {
        let net = NodeNet::Local(LocalHub::new());
        let mut a = net.subscribe("x.orders".into()).await.expect("subscribe");
        let mut b = net.subscribe("x.orders".into()).await.expect("subscribe");
        net.publish("x.orders".into(), b"hi".to_vec())
            .await
            .expect("publish");
        net.publish("x.other".into(), b"no".to_vec())
            .await
            .expect("publish");
        assert_eq!(&a.next().await.expect("a").payload[..], b"hi");
        assert_eq!(&b.next().await.expect("b").payload[..], b"hi");

        let mut server = net.subscribe("x.logs".into()).await.expect("subscribe");
        let n2 = net.clone();
        tokio::spawn(async move {
            while let Some(m) = server.next().await {
                if let Some(r) = m.reply {
                    let _ = n2.publish(r, b"pong".to_vec()).await;
                }
            }
        });
        let answer = net
            .request("x.logs".into(), b"ping".to_vec(), Duration::from_secs(5))
            .await
            .expect("answer");
        assert_eq!(&answer[..], b"pong");
        assert!(net
            .request("x.nobody".into(), Vec::new(), Duration::from_millis(50))
            .await
            .is_err());
    }
}
