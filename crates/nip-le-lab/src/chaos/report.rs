//! The chaos report: the summary table, and the verdict.

use super::analysis::Summary;

/// Prints `s`; returns whether the run passed (no duplicate the NIP does
/// not force).
pub fn print(s: &Summary, secs: u64, faults: &str) -> bool {
    let p = |q: f64| nearest_rank(&s.failovers, q);
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
        "duplicates while etcd was unreachable (fall-back)",
        s.dup_etcd_unreachable.to_string(),
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
        "  of which while etcd was unreachable",
        format!("{} ms", s.two_while_etcd_unreachable_ms),
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
    println!("  (views of stopped instances are excluded; an extended leader that hung past its validity reports `fenced` as it resumes)");
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

/// The report of a run with agent turns: per mention, exactly once,
/// duplicated, missed, and the mention → reply latency. Fails on any
/// duplicate among extended instances, and on any miss when every instance
/// was extended (`extended_only`): with spec-only instances in the cluster
/// a miss may be the NIP's own (a spec leader answers only what was
/// published after it began to lead).
pub fn print_turns(s: &Summary, secs: u64, faults: &str, extended_only: bool) -> bool {
    let p = |q: f64| nearest_rank(&s.latencies, q);
    let duplicated = s.dup_forced + s.dup_unexplained;
    println!();
    println!("summary ({secs} s of faults, then drained)");
    println!("  faults: {faults}");
    let row = |k: &str, v: String| println!("  {k:<52} {v:>10}");
    row("mentions sent", s.sent.to_string());
    row("answered exactly once", s.once.to_string());
    row("duplicated", duplicated.to_string());
    row(
        "  of which with a spec-only replier",
        s.dup_with_spec.to_string(),
    );
    if s.dup_etcd_unreachable > 0 || s.two_while_etcd_unreachable_ms > 0 {
        row(
            "duplicated while etcd was unreachable (fall-back, apart)",
            s.dup_etcd_unreachable.to_string(),
        );
    }
    if s.dup_disk_full > 0 {
        row(
            "duplicated by a fail-safe leader on a full disk (apart)",
            s.dup_disk_full.to_string(),
        );
    }
    row("missed", s.missed.to_string());
    row(
        "mention → reply latency p50 / p99 (ms)",
        format!("{} / {}", p(0.5), p(0.99)),
    );
    if !s.latencies_reachable.is_empty() {
        let r = |q: f64| nearest_rank(&s.latencies_reachable, q);
        row(
            "  while etcd was reachable: p50 / p99 (ms)",
            format!("{} / {}", r(0.5), r(0.99)),
        );
    }
    if !s.latencies_unfrozen.is_empty() {
        let r = |q: f64| nearest_rank(&s.latencies_unfrozen, q);
        row(
            "  no child holding for its leader: p50 / p99 (ms)",
            format!("{} / {}", r(0.5), r(0.99)),
        );
    }
    let extended_dups = duplicated - s.dup_with_spec;
    if !s.missing.is_empty() {
        println!("  missed: {}", s.missing.join(", "));
    }
    let fail_missed = extended_only && s.missed > 0;
    if extended_dups > 0 || fail_missed {
        for u in s.unexplained.iter().take(10) {
            println!("  duplicate: {u}");
        }
        println!(
            "chaos FAILED: {extended_dups} duplicated among extended instances, {} missed",
            s.missed
        );
        return false;
    }
    if s.dup_disk_full > 0 {
        println!(
            "chaos passed: every mention answered exactly once, but {} answered again by fail-safe leaders while the disk was full (the NIP's fail-safe, counted apart)",
            s.dup_disk_full
        );
    } else if s.dup_etcd_unreachable > 0 {
        println!(
            "chaos passed: every mention answered exactly once, but {} answered again while etcd was unreachable (the fall-back policy's, counted apart)",
            s.dup_etcd_unreachable
        );
    } else {
        println!("chaos passed: every mention answered exactly once");
    }
    true
}

/// The `q` quantile of sorted values (nearest rank), 0 when there are none.
fn nearest_rank(sorted: &[u64], q: f64) -> u64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(0)
}

/// Every life's reports, etcd's faults and the mentions, one line each in
/// time order (unix ms, host, instance): kept with `--keep`, to trace a
/// miss or a duplicate after the run.
pub fn timeline(out: &super::outcome::Outcome) -> String {
    let mut lines: Vec<(u64, String)> = Vec::new();
    for l in &out.lives {
        let who = format!("host{} {} {:?}", l.host, l.instance_id, l.mode);
        lines.push((l.start, format!("{who} started")));
        if let Some(end) = l.end {
            lines.push((end, format!("{who} ended")));
        }
        for (stop, cont) in &l.stops {
            lines.push((*stop, format!("{who} stopped until {cont}")));
        }
        for at in &l.claims {
            lines.push((*at, format!("{who} told to claim")));
        }
        for (at, said) in &l.said {
            lines.push((*at, format!("{who}: {said}")));
        }
    }
    for (id, at) in &out.sent {
        lines.push((*at, format!("mention {id}")));
    }
    for (from, to) in &out.etcd_pauses {
        lines.push((*from, format!("etcd unreachable until {to}")));
    }
    for (from, to) in &out.disk_full {
        lines.push((*from, format!("lock directories' disk full until {to}")));
    }
    for f in &out.etcd_member_faults {
        let what = if f.cut {
            "cut from the others"
        } else {
            "restarted"
        };
        lines.push((
            f.from,
            format!("etcd member {} {what} until {}", f.member, f.until),
        ));
    }
    lines.sort();
    lines
        .into_iter()
        .map(|(at, l)| format!("{at} {l}\n"))
        .collect()
}
