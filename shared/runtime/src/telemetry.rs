//! Tracing set-up and trace context propagation.
//!
//! Owns: the process's `tracing` subscriber (structured logs to stderr,
//! filtered by `RUST_LOG`), the optional OpenTelemetry layer that exports
//! spans over OTLP (HTTP/protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` is
//! set, and the W3C `traceparent` strings that carry trace context in NATS
//! headers (one per message, and one per job: see the `job_trace`
//! module).
//!
//! Must never: crash or refuse to start a service because telemetry could
//! not be set up (it warns and carries on with logs only), export anything
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` is unset, or let a missing or
//! malformed `traceparent` affect what a service decides.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// The environment variable that turns OTLP export on (the collector's
/// base URL, e.g. `http://collector:4318`).
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The header name (and propagator field) of W3C trace context.
const TRACEPARENT: &str = "traceparent";

/// Keeps the OpenTelemetry tracer provider alive; dropping it flushes the
/// spans not yet exported and shuts the exporter down. Hold it for the
/// life of `main`.
#[must_use = "dropping the guard shuts OpenTelemetry export down at once"]
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are being exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("OpenTelemetry shutdown: {e}");
            }
        }
    }
}

/// Installs the process's subscriber: logs to stderr filtered by
/// `RUST_LOG` (else `default_filter`), plus, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set and not empty, spans exported over
/// OTLP/HTTP with `service.name` = `gpusched-<service>`. If the exporter
/// cannot be built it warns and runs with logs only. Calling it again (a
/// subscriber already installed) changes nothing.
pub fn init_tracing_with(service: &str, default_filter: &str) -> TelemetryGuard {
    let endpoint = std::env::var(OTLP_ENDPOINT_ENV).ok();
    init_tracing_for(service, default_filter, endpoint.as_deref())
}

/// Whether the OTLP endpoint variable's value asks for export: set and
/// not blank.
fn wants_otlp(endpoint: Option<&str>) -> bool {
    endpoint.is_some_and(|v| !v.trim().is_empty())
}

/// [`init_tracing_with`], given the endpoint variable's value.
fn init_tracing_for(service: &str, default_filter: &str, endpoint: Option<&str>) -> TelemetryGuard {
    if tracing::dispatcher::has_been_set() {
        return TelemetryGuard::default();
    }
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // Colour only for a person at a terminal: never escape codes in a
    // redirected log, and never when NO_COLOR is set.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    let (provider, failure) = if wants_otlp(endpoint) {
        match otlp_provider(service) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        }
    } else {
        (None, None)
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer().with_tracer(p.tracer(format!("gpusched-{service}")))
    });
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .is_ok();
    if let Some(e) = failure {
        tracing::warn!(error = %e, "OTLP exporter not built; running without OpenTelemetry");
    }
    if !installed {
        // Someone else's subscriber is in place; ours would never see a span.
        if let Some(p) = provider {
            let _ = p.shutdown();
        }
        return TelemetryGuard::default();
    }
    if provider.is_some() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        tracing::info!(service, "exporting spans over OTLP");
    }
    TelemetryGuard { provider }
}

/// A tracer provider with a batch span processor (its own thread) and an
/// OTLP/HTTP (protobuf) exporter that reads its endpoint from the
/// standard `OTEL_EXPORTER_OTLP_*` variables.
fn otlp_provider(service: &str) -> Result<SdkTracerProvider, String> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
        .map_err(|e| e.to_string())?;
    let resource = Resource::builder()
        .with_service_name(format!("gpusched-{service}"))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// The W3C `traceparent` of the current `tracing` span's OpenTelemetry
/// context, for a NATS header; `None` when there is no valid span context
/// (OpenTelemetry off, or outside any span).
pub fn current_traceparent() -> Option<String> {
    span_traceparent(&tracing::Span::current())
}

/// The W3C `traceparent` of `span`'s OpenTelemetry context; `None` when
/// it has no valid span context (OpenTelemetry off, or a disabled span).
pub fn span_traceparent(span: &tracing::Span) -> Option<String> {
    traceparent_of(&span.context())
}

/// The W3C `traceparent` of a context's span, if valid.
pub(crate) fn traceparent_of(cx: &Context) -> Option<String> {
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Links `span` to the remote span `traceparent` names, if any and well
/// formed (a batch span that serves many traces); call it before the span
/// is first entered.
pub fn add_remote_link(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let cx = parent_context(tp);
    let sc = cx.span().span_context().clone();
    if sc.is_valid() {
        span.add_link(sc);
    }
}

/// The OpenTelemetry context a received `traceparent` names (an empty
/// context if it is malformed), to parent a span with
/// [`OpenTelemetrySpanExt::set_parent`].
pub fn parent_context(traceparent: &str) -> Context {
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.to_string())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// Makes `span` a child of the remote span `traceparent` names, if any and
/// well formed; otherwise leaves it alone.
pub fn set_remote_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let cx = parent_context(tp);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_traceparent(s: &str) -> bool {
        let parts: Vec<&str> = s.split('-').collect();
        let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
        parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && hex(parts[2], 16)
            && parts[3] == "01"
    }

    fn with_otel<R>(f: impl FnOnce() -> R) -> R {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, f)
    }

    #[test]
    fn traceparent_round_trips() {
        with_otel(|| {
            assert_eq!(current_traceparent(), None, "no span, no context");
            let span = tracing::info_span!("publish");
            let _entered = span.enter();
            let tp = current_traceparent().expect("a traceparent inside a span");
            assert!(is_traceparent(&tp), "{tp}");
            let sent = span.context().span().span_context().trace_id();
            let received = parent_context(&tp).span().span_context().trace_id();
            assert_eq!(received, sent);
        });
    }

    #[test]
    fn remote_parent_carries_the_trace() {
        let remote = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        with_otel(|| {
            let span = tracing::info_span!("cycle");
            set_remote_parent(&span, Some(remote));
            let tp = span
                .in_scope(current_traceparent)
                .expect("a traceparent inside a span");
            assert!(
                tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
                "{tp}"
            );
            assert!(!tp.contains("00f067aa0ba902b7"), "a new span id: {tp}");
            // Malformed or absent parents are ignored.
            let other = tracing::info_span!("cycle");
            set_remote_parent(&other, Some("garbage"));
            set_remote_parent(&other, None);
            assert!(other.in_scope(current_traceparent).is_some());
        });
    }

    #[test]
    fn only_a_set_endpoint_turns_export_on() {
        assert!(!wants_otlp(None));
        assert!(!wants_otlp(Some("")));
        assert!(!wants_otlp(Some("  ")));
        assert!(wants_otlp(Some("http://collector:4318")));
    }

    #[test]
    fn no_otel_without_the_endpoint() {
        // Whatever this process's environment holds: no endpoint, no export.
        let guard = init_tracing_for("test", "warn", None);
        assert!(!guard.exporting());
        assert_eq!(current_traceparent(), None);
        drop(guard);
        // A second call finds a subscriber in place and does not panic.
        let again = init_tracing_for("test", "warn", Some("http://127.0.0.1:9"));
        assert!(!again.exporting(), "a subscriber was already in place");
    }
}
