//! Snapshot costs at the restart scenario's size: 10,000 nodes loaded with
//! 14,500 running jobs, then N jobs pending with reasons (default
//! 100,000). Times, in one run: copying the state (what a leading service
//! holds its loop for), encoding, decoding with every check, and the
//! snapshot's size.
//!
//! Run: `cargo bench -p gpusched-core --bench snapshot` (add `-- 1000000`
//! for another depth).

mod common;

use common::{cluster, submit};
use gpusched_core::{run_cycle, snapshot, CycleConfig, ScanMemo};
use gpusched_model::Timestamp;
use std::time::Instant;

fn best_of<T>(n: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::MAX;
    let mut out = None;
    for _ in 0..n {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
        out = Some(v);
    }
    (best, out.expect("ran at least once"))
}

fn main() {
    let pending: usize = std::env::args()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(100_000);
    let mut s = cluster();
    let mut next = 1u64;
    submit(&mut s, &mut next, 14_500);
    let cfg = CycleConfig::default();
    let mut memo = ScanMemo::default();
    for _ in 0..10_000 {
        let out = run_cycle(&mut s, &mut memo, &cfg, Timestamp(0)).expect("cycle");
        if out.stats.decisions == 0 {
            break;
        }
    }
    submit(&mut s, &mut next, pending);
    for _ in 0..50 {
        run_cycle(&mut s, &mut memo, &cfg, Timestamp(1)).expect("cycle");
    }
    let with_reason = s.jobs().filter(|j| j.last_reason.is_some()).count();
    println!(
        "state: {} jobs ({} with a pending reason), {} nodes",
        s.job_count(),
        with_reason,
        s.nodes().len()
    );
    let (hash_ms, _) = best_of(5, || s.state_hash());
    println!("state_hash {hash_ms:.1} ms");
    let (copy_ms, copy) = best_of(5, || s.clone());
    drop(copy);
    let (encode_ms, bytes) = best_of(5, || snapshot::encode(&s, 1));
    let (decode_ms, back) = best_of(5, || snapshot::decode(&bytes).expect("decodes"));
    assert!(back.state == s, "read back as written");
    println!(
        "copy {copy_ms:.1} ms, encode {encode_ms:.1} ms, decode+check {decode_ms:.1} ms, size {:.1} MiB",
        bytes.len() as f64 / (1 << 20) as f64
    );
}
