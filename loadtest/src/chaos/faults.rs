//! Injecting one fault into the running deployment: SIGKILL and restart a
//! service, restart or stop Postgres, kill, stop or wipe nats-server,
//! pause a leader past its lease, or publish bad messages on the bus.
//!
//! Owns: the steps of each fault and when it starts and ends (Unix ms):
//! a kill ends when the replacement is started, a stop when the server
//! is back, a pause at SIGCONT.
//!
//! Must never: touch a process or server that is not the run's own, or
//! leave a paused process paused.

use std::time::Duration;

use anyhow::{Context, Result};
use gpusched_runtime::wall_clock;
use rand_chacha::ChaCha8Rng;

use super::plan::Fault;
use crate::infra::Infra;
use crate::stack::Stack;

/// What injecting a fault did.
#[derive(Clone, Debug, Default)]
pub struct Injection {
    /// Fault start, Unix ms.
    pub start_ms: u64,
    /// Fault end, Unix ms.
    pub end_ms: u64,
    /// What was done, for the report.
    pub detail: String,
    /// What went wrong, if anything.
    pub error: Option<String>,
    /// The instance started to replace a killed one.
    pub new_instance: Option<String>,
}

/// Everything a fault may act on.
pub struct Target<'a> {
    /// The service processes.
    pub stack: &'a mut Stack,
    /// Postgres and nats-server.
    pub infra: &'a mut Infra,
    /// The run's random source (bus messages).
    pub rng: &'a mut ChaCha8Rng,
}

/// Injects `fault`; errors are recorded in the result, not returned, so
/// the run carries on and reports them.
pub async fn inject(fault: &Fault, t: Target<'_>) -> Injection {
    let mut out = Injection {
        start_ms: wall_clock().0,
        ..Injection::default()
    };
    let r = match fault {
        Fault::Kill { service } => kill(service, t.stack, &mut out).await,
        Fault::PgRestart => t
            .infra
            .pg
            .restart()
            .await
            .map(|_| "pg_ctl restart -m fast".into()),
        Fault::PgStop { secs } => pg_stop(t.infra, *secs).await,
        Fault::NatsKill { wipe } => nats_kill(t.infra, *wipe).await,
        Fault::NatsStop { secs } => nats_stop(t.infra, *secs).await,
        Fault::PauseLeader { service, secs } => pause(service, *secs, t.stack).await,
        Fault::BusGarbage => {
            let url = t.infra.nats.url();
            super::bus::inject(&url, &t.stack.namespace, t.rng)
                .await
                .map(|i| i.describe())
        }
    };
    out.end_ms = wall_clock().0;
    match r {
        Ok(d) => out.detail = d,
        Err(e) => {
            out.detail = format!("{}: failed", fault.label());
            out.error = Some(format!("{e:#}"));
        }
    }
    out
}

async fn kill(service: &str, stack: &mut Stack, out: &mut Injection) -> Result<String> {
    let victim = stack
        .leader(service)
        .await
        .with_context(|| format!("no live {service} instance"))?;
    stack.kill_instance(&victim)?;
    out.start_ms = wall_clock().0;
    let new = stack.start(service)?;
    out.new_instance = Some(new.clone());
    Ok(format!("SIGKILLed {victim}, started {new}"))
}

async fn pg_stop(infra: &mut Infra, secs: f64) -> Result<String> {
    infra.pg.stop().await?;
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    infra.pg.start().await?;
    Ok(format!("pg_ctl stop -m fast; {secs:.0} s; pg_ctl start"))
}

async fn nats_kill(infra: &mut Infra, wipe: bool) -> Result<String> {
    infra.nats.kill()?;
    if wipe {
        infra.nats.wipe()?;
    }
    infra.nats.start().await?;
    Ok(if wipe {
        "SIGKILL nats-server; store removed; started empty".into()
    } else {
        "SIGKILL nats-server; started on its store".into()
    })
}

async fn nats_stop(infra: &mut Infra, secs: f64) -> Result<String> {
    infra.nats.stop().await?;
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    infra.nats.start().await?;
    Ok(format!(
        "SIGTERM nats-server; {secs:.0} s; started on its store"
    ))
}

/// Pauses `service`'s leader for `secs` with a standby running (one is
/// started first if none is).
async fn pause(service: &str, secs: f64, stack: &mut Stack) -> Result<String> {
    let live = stack
        .procs
        .iter()
        .filter(|p| p.service == service && !p.stopped)
        .count();
    if live < 2 {
        stack.start(service)?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let leader = stack
        .leader(service)
        .await
        .with_context(|| format!("no live {service} instance"))?;
    stack.signal(&leader, "STOP")?;
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    // SIGCONT whatever happens: a paused process must not outlive the fault.
    stack.signal(&leader, "CONT")?;
    let now = stack.leader(service).await.unwrap_or_default();
    Ok(format!(
        "SIGSTOP {leader} for {secs:.0} s, then SIGCONT; lease holder after: {now}"
    ))
}
