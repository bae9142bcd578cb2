//! Cycle time against queue depth: the loop must be bounded (docs/architecture.md, "How a cycle stays bounded").
//!
//! Builds a 10,000-node cluster (40 racks × 10 blocks × 25 nodes × 8 GPUs),
//! loads it with 14,500 mixed jobs and gangs (about 80% of its GPUs), then queues 1k, 10k,
//! 100k and 1M pending jobs and times one scheduling decision pass
//! (preemption, quota admission of K heads, then placement of K admitted
//! jobs) with an empty scan memo, so every pass does its full bounded work. Prints p50/p99/max
//! per depth and the p99 ratio of 1M to 1k in the same run.
//!
//! Run: `cargo bench -p gpusched-core --bench cycle` (add `-- quick` for 1k and 100k only).

use gpusched_core::{placement, preemption, quota, run_cycle, CycleConfig, ScanMemo};
use gpusched_model::Timestamp;
use std::time::Instant;

mod common;

use common::{cluster, submit};

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let sizes: &[usize] = if quick {
        &[1_000, 100_000]
    } else {
        &[1_000, 10_000, 100_000, 1_000_000]
    };
    let cfg = CycleConfig::default();
    let iters = 300;
    println!(
        "cycle time vs pending depth; 10,000 nodes × 8 GPUs, K = {}",
        cfg.max_heads
    );
    println!(
        "{:>10} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "pending", "p50_us", "p99_us", "max_us", "heads", "probes"
    );
    let mut p99s = Vec::new();
    for &n in sizes {
        let mut s = cluster();
        let mut next = 1u64;
        // Load the cluster with a filler population.
        submit(&mut s, &mut next, 14_500);
        let mut memo = ScanMemo::default();
        for _ in 0..10_000 {
            let out = run_cycle(&mut s, &mut memo, &cfg, Timestamp(0)).expect("cycle");
            if out.stats.decisions == 0 {
                break;
            }
        }
        let used = s.gpus_in_use();
        if std::env::var("BENCH_DEBUG").is_ok() {
            let c = s.phase_counts();
            eprintln!(
                "queued {} admitted {} running {} bound {}",
                c.get(gpusched_core::Phase::Queued),
                c.get(gpusched_core::Phase::Admitted),
                c.get(gpusched_core::Phase::Running),
                c.get(gpusched_core::Phase::Bound)
            );
        }
        // The pending population under test, plus one admission pass so
        // placement has K admitted jobs to look at.
        submit(&mut s, &mut next, n);
        let (adm, _) = quota::decide(&s, &mut ScanMemo::default(), &cfg, Timestamp(1));
        for e in &adm {
            s.apply(e).expect("admit");
        }
        let mut times = Vec::with_capacity(iters);
        let (mut heads, mut probes) = (0, 0);
        for _ in 0..iters {
            let t = Instant::now();
            let (p, _) = preemption::decide(&s, &mut ScanMemo::default(), &cfg, Timestamp(2));
            std::hint::black_box(p);
            let (a, qs) = quota::decide(&s, &mut ScanMemo::default(), &cfg, Timestamp(2));
            let (b, ps) = placement::decide(&s, &mut ScanMemo::default(), &cfg, Timestamp(2));
            times.push(t.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box((a, b));
            heads = qs.heads_examined + ps.heads_examined;
            probes = ps.domains_probed;
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let p = |q: f64| times[((q * iters as f64).ceil() as usize).clamp(1, iters) - 1];
        println!(
            "{:>10} {:>10.0} {:>10.0} {:>10.0} {:>8} {:>8}   (cluster {:.0}% used)",
            n,
            p(0.5),
            p(0.99),
            times[iters - 1],
            heads,
            probes,
            100.0 * used as f64 / 80_000.0
        );
        p99s.push((n, p(0.99)));
    }
    if let (Some(first), Some(last)) = (p99s.first(), p99s.last()) {
        println!("p99 ratio {}/{}: {:.2}", last.0, first.0, last.1 / first.1);
    }
}
