//! The web dashboard at `/ui`: queues, the cluster as a heatmap, jobs and
//! each job's timeline, live over the event stream.
//!
//! Owns: serving the dashboard's files, which are compiled into the binary
//! (`services/gateway/ui/`: plain HTML, CSS and JavaScript, no build step),
//! and the headers that lock the page down (a content security policy that
//! allows only this origin, no framing, no referrer).
//!
//! Must never: hold data or a token (the files are the same for everyone;
//! the page reads the API with the token the user typed, kept in the
//! browser's session storage, never in a URL), or need anything at run
//! time besides the binary.

use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// Only this origin, for everything; inline code of any kind is refused.
const CSP: &str = "default-src 'self'; img-src 'self' data:; script-src 'self'; \
    style-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
    form-action 'self'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            // Revalidate each load, so a new gateway's page is never mixed
            // with an old one's script.
            (CACHE_CONTROL, "no-cache"),
            (CONTENT_SECURITY_POLICY, CSP),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (X_FRAME_OPTIONS, "DENY"),
            (REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

/// The dashboard's routes, `/ui` and its files; they need no token (the
/// page asks for one and sends it with each API call).
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(INDEX.contains(r#"src="/ui/app.js""#));
        assert!(INDEX.contains(r#"href="/ui/app.css""#));
        // No inline script or style: the CSP would refuse them.
        assert!(!INDEX.contains("<script>") && !INDEX.contains("style="));
        assert!(
            !SCRIPT.contains("localStorage"),
            "the token stays in sessionStorage"
        );
    }
}
