//! The chaos report: the summary table, and the verdict.

use super::analysis::Summary;

/// Prints `s`; returns whether the run passed (no duplicate the NIP does
/// not force).
pub fn print(s: &Summary, secs: u64, faults: &str) -> bool {
    let p = |q: f64| {
        s.failovers
            .get(((s.failovers.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    println!();
    println!("summary ({secs} s of faults)");
    println!("  faults: {faults}");
    let row = |k: &str, v: String| println!("  {k:<52} {v:>8}");
    row("mentions sent", s.sent.to_string());
    row("answered exactly once", s.once.to_string());
    row(
        "duplicates forced by the NIP (resumed spec leader)",
        s.dup_forced.to_string(),
    );
    row(
        "duplicates not explained (split-brain)",
        s.dup_unexplained.to_string(),
    );
    row(
        "missed (no running leader: death, hang, handoff gap)",
        s.missed.to_string(),
    );
    row(
        "time with 2+ running leaders (reported views)",
        format!("{} ms", s.two_leaders_ms),
    );
    row(
        "  of which a spec instance was one of them",
        format!("{} ms", s.two_with_spec_ms),
    );
    row(
        "time with no running leader",
        format!("{} ms", s.no_leader_ms),
    );
    row(
        "leader deaths → failover p50 / p99 / max (ms)",
        format!(
            "{} / {} / {}",
            p(0.5),
            p(0.99),
            s.failovers.last().copied().unwrap_or(0)
        ),
    );
    println!("  (views of stopped instances are excluded; an extended leader fences itself after a hang, so its view may say leader while it answers nothing)");
    if s.dup_unexplained > 0 {
        for u in s.unexplained.iter().take(10) {
            println!("  unexplained: {u}");
        }
        println!(
            "chaos FAILED: {} duplicate replies the NIP does not force",
            s.dup_unexplained
        );
        return false;
    }
    println!("chaos passed: no split-brain beyond the NIP's own rules");
    true
}
