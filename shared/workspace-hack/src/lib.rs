//! No code: this crate depends on every third-party crate the workspace
//! builds, with the union of the features any member (tests included)
//! turns on, and every member depends on it. So `cargo test`, `cargo build
//! --bins` and `cargo run -p gpusched` resolve each dependency to one
//! feature set and share its artifacts, instead of recompiling a dozen
//! crates each time the set of packages built changes.
//!
//! Owns: the `[dependencies]` between its Cargo.toml's HAKARI markers,
//! written by `cargo hakari generate` (install: `cargo install
//! cargo-hakari --locked`); `tests/unified.rs` fails when they are stale.
//!
//! Must never: hold code, or be edited between the markers by hand.
