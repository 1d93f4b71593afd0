//! The slowest mentions of a run with agent turns, each with what happened
//! between its publication and its first reply (who said it led, stops,
//! deaths, starts), so that a latency tail can be traced to its faults.

use std::collections::BTreeMap;

use super::outcome::Outcome;
use nip_le_cli::lines::ReplyLine;

/// The `n` slowest answered mentions, slowest first, each as one line of
/// its latency and the events of every instance in its window (times
/// relative to the mention's publication, ms).
pub fn slowest(out: &Outcome, replies: &[ReplyLine], n: usize) -> Vec<String> {
    let mut first: BTreeMap<String, (u64, &str)> = BTreeMap::new();
    for r in replies {
        let e = first
            .entry(r.mention_id())
            .or_insert((r.at_ms, &r.instance_id));
        if r.at_ms < e.0 {
            *e = (r.at_ms, &r.instance_id);
        }
    }
    let mut slow: Vec<(u64, &str, u64, u64, &str)> = (out.sent.iter())
        .filter_map(|(id, at)| {
            let (t, by) = first.get(id)?;
            Some((t.saturating_sub(*at), id.as_str(), *at, *t, *by))
        })
        .collect();
    slow.sort_unstable_by_key(|s| std::cmp::Reverse(s.0));
    slow.into_iter()
        .take(n)
        .map(|(ms, id, at, t, by)| {
            let rel = |x: u64| x as i64 - at as i64;
            let within = |x: u64| x + 2000 >= at && x <= t;
            let mut events: Vec<(i64, String)> = Vec::new();
            for l in &out.lives {
                let who = &l.instance_id;
                if within(l.start) {
                    events.push((rel(l.start), format!("{who} started")));
                }
                if let Some(e) = l.end.filter(|&e| within(e)) {
                    events.push((rel(e), format!("{who} ended")));
                }
                for (s, c) in &l.stops {
                    if *c + 2000 >= at && *s <= t {
                        events.push((rel(*s), format!("{who} stopped until {:+}", rel(*c))));
                    }
                }
                for c in l.claims.iter().filter(|c| within(**c)) {
                    events.push((rel(*c), format!("{who} told to claim")));
                }
                for (s, v) in l.said.iter().filter(|(s, _)| within(*s)) {
                    events.push((rel(*s), format!("{who}: {v}")));
                }
            }
            for (d, leading) in out.deaths.iter().filter(|(d, _)| within(*d)) {
                let what = if *leading { "a leader" } else { "an observer" };
                events.push((rel(*d), format!("SIGKILL of {what}")));
            }
            events.sort();
            let told: Vec<String> = (events.iter()).map(|(t, e)| format!("{t:+} {e}")).collect();
            format!("{id:.12}… {ms} ms, first by {by}: {}", told.join("; "))
        })
        .collect()
}
