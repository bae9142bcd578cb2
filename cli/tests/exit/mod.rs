//! Assertions on a finished `gpusched` command, shared by the CLI's tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::process::Output;

/// The command succeeded: its standard output.
pub fn ok(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The command failed: its standard error.
pub fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).to_string()
}
