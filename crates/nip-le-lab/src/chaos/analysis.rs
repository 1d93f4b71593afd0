//! The analysis, pure: from the lives the runner recorded, the mentions it
//! sent and the replies file, count each mention's replies, explain every
//! duplicate or fail, and measure the leadership timeline and failovers.
//!
//! A duplicate is forced by the NIP (and excused) only when a spec-only
//! replier was not running normally when the mention came: it was stopped,
//! or starved past its tick, and answered from its backlog while it still
//! believed it led (the wall-clock stale rule had already replaced it).
//! Extended repliers fence themselves in that case, so a duplicate with
//! only extended repliers is a split-brain.

use std::collections::BTreeMap;

use nip_le::Mode;

use super::outcome::{Life, Outcome};
use nip_le_cli::lines::ReplyLine;

/// What the run amounted to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Mentions sent.
    pub sent: usize,
    /// Answered exactly once.
    pub once: usize,
    /// Duplicates the NIP forces (a late spec replier).
    pub dup_forced: usize,
    /// Duplicates nothing excuses.
    pub dup_unexplained: usize,
    /// Cross-host runs: duplicates answered while etcd was unreachable
    /// (paused, or without a leader), or by a window acting for its host
    /// only (the fall-back policy: each host leader acts for its host once
    /// etcd has not answered it for a whole TTL).
    pub dup_etcd_unreachable: usize,
    /// `--fill-locks-fs-s`: duplicates with a replier that led by the
    /// NIP's fail-safe (the lock file could not be locked or written)
    /// while the lock directories' filesystem was full: no ledger line can
    /// be written then, so the fail-safe leaders cannot know of each
    /// other's answers, or a holder after them of theirs.
    pub dup_disk_full: usize,
    /// Never answered.
    pub missed: usize,
    /// The unexplained duplicates, described.
    pub unexplained: Vec<String>,
    /// The same: when each mention was sent, and who answered it when.
    pub unexplained_replies: Vec<(u64, Vec<(String, u64)>)>,
    /// Time with two or more running instances reporting leadership, ms.
    pub two_leaders_ms: u64,
    /// Of which a spec instance was one of them, ms.
    pub two_with_spec_ms: u64,
    /// Of which while etcd was unreachable (cross-host runs), ms.
    pub two_while_etcd_unreachable_ms: u64,
    /// Time with no running instance reporting leadership, ms.
    pub no_leader_ms: u64,
    /// After each SIGKILL of a leader, ms until the next report of leading.
    pub failovers: Vec<u64>,
    /// Duplicates with a spec-only replier among the repliers.
    pub dup_with_spec: usize,
    /// For each answered mention, ms from its publication to its first
    /// reply, sorted.
    pub latencies: Vec<u64>,
    /// Cross-host runs: the same, of the mentions whose wait overlapped
    /// no span in which etcd counted as unreachable, sorted.
    pub latencies_reachable: Vec<u64>,
    /// Runs with harness children: the same, of the mentions whose wait
    /// overlapped no span in which a leading window's child held the lock
    /// for it while the window could not answer: a stop of the window with
    /// the child running (the child keeps their shared record fresh, as
    /// INTEROP.md's writer does, so the NIP replaces no one until the
    /// window resumes), or the window killed and its child not yet gone
    /// (the NIP's own leader: in Buzz's desktop it is the harness that
    /// answers), sorted.
    pub latencies_unfrozen: Vec<u64>,
    /// The missed mentions' ids.
    pub missing: Vec<String>,
}

/// Sampling step of the leadership timeline.
const STEP_MS: u64 = 5;

/// Judges the run. `refresh_ms` is the instances' refresh interval.
pub fn analyse(out: &Outcome, replies: &[ReplyLine], refresh_ms: u64) -> Summary {
    let mut s = Summary {
        sent: out.sent.len(),
        ..Summary::default()
    };
    count_replies(out, replies, refresh_ms, &mut s);
    sort_latencies(&mut s);
    timeline(out, &mut s);
    s.failovers = failovers(out);
    s
}

fn count_replies(out: &Outcome, replies: &[ReplyLine], refresh_ms: u64, s: &mut Summary) {
    let mut by_mention: BTreeMap<String, Vec<(&str, u64)>> = BTreeMap::new();
    for r in replies {
        by_mention
            .entry(r.mention_id())
            .or_default()
            .push((&r.instance_id, r.at_ms));
    }
    let mode_of = |id: &str| {
        out.lives
            .iter()
            .find(|l| l.instance_id == id)
            .map(|l| l.mode)
    };
    // A replier that acted at the host level only when it replied: across
    // hosts a window acts without etcd's key only under the fall-back (its
    // contender had no answer from etcd for a whole TTL). On one host every
    // leader acts at the host level: nothing is excused so.
    let across = out.lives.iter().any(|l| l.host > 0);
    let children = out.lives.iter().any(|l| !l.fresh_stops.is_empty());
    let fell_back = |id: &str, t: u64| {
        across && last_said(out, id, t).is_some_and(|(_, v)| v.starts_with("Host "))
    };
    // When the disk was freed after a reply of a replier that led by the
    // fail-safe while it was full, if it did.
    let full_fail_safe = |id: &str, t: u64| {
        let (s, v) = last_said(out, id, t)?;
        (v.ends_with(" FailSafe"))
            .then(|| (out.disk_full.iter()).find(|(from, until)| *from <= t && *s <= *until))
            .flatten()
            .map(|(_, until)| *until)
    };
    // Whether `id` ran at some moment from `a` to `b` (alive, not
    // stopped): a refused line of its own would have gone out then.
    let ran = |id: &str, a: u64, b: u64| {
        (out.lives.iter()).any(|l| {
            let (from, to) = (a.max(l.start), l.end.map_or(b, |e| e.min(b)));
            l.instance_id == id && from < to && !l.stops.iter().any(|(s, c)| *s <= from && *c >= to)
        })
    };
    // When the disk was freed after `t`, if it was full then.
    let freed_after = |t: u64| {
        (out.disk_full.iter())
            .find(|(from, until)| *from <= t && t <= *until)
            .map(|(_, until)| *until)
    };
    // Every answer after the first forced by the full disk: its replier
    // granted unrecorded as a fail-safe leader, or an earlier replier
    // answered while the disk refused its `done` and did not run again
    // before it (the simulator's "forced by the disk").
    let forced_by_disk = |r: &[(&str, u64)]| {
        let mut r = r.to_vec();
        r.sort_by_key(|(_, t)| *t);
        (1..r.len()).all(|j| {
            let (who, t) = r[j];
            full_fail_safe(who, t).is_some()
                || r[..j].iter().any(|(w, ti)| {
                    (full_fail_safe(w, *ti).or_else(|| freed_after(*ti)))
                        .is_some_and(|freed| !ran(w, freed, t))
                })
        })
    };
    let recently_resumed = |id: &str, t: u64, within: u64| {
        out.lives
            .iter()
            .filter(|l| l.instance_id == id)
            .any(|l| l.stops.iter().any(|(_, c)| *c <= t && t <= c + within))
    };
    for (id, at) in &out.sent {
        let r = by_mention.get(id).map(Vec::as_slice).unwrap_or(&[]);
        if let Some(first) = r.iter().map(|(_, t)| *t).min() {
            s.latencies.push(first.saturating_sub(*at));
            let unreachable =
                (out.etcd_pauses.iter()).any(|(p, c)| *p <= first && *at <= c + out.etcd_grace_ms);
            if across && !unreachable {
                s.latencies_reachable.push(first.saturating_sub(*at));
            }
            if children && !frozen_behind_fresh_record(out, *at, first) {
                s.latencies_unfrozen.push(first.saturating_sub(*at));
            }
        }
        if r.len() > 1 && r.iter().any(|(who, _)| mode_of(who) == Some(Mode::Spec)) {
            s.dup_with_spec += 1;
        }
        match r.len() {
            0 => {
                s.missed += 1;
                s.missing.push(id.clone());
            }
            1 => s.once += 1,
            _ if r
                .iter()
                .any(|(who, t)| etcd_unreachable(out, *t) || fell_back(who, *t)) =>
            {
                s.dup_etcd_unreachable += 1
            }
            _ if forced_by_disk(r) => s.dup_disk_full += 1,
            _ => {
                let forced = r.iter().any(|(who, t)| {
                    mode_of(who) == Some(Mode::Spec)
                        && (recently_resumed(who, *t, refresh_ms + 1000)
                            || t.saturating_sub(*at) > refresh_ms)
                });
                if forced {
                    s.dup_forced += 1;
                } else {
                    s.dup_unexplained += 1;
                    let who: Vec<String> = r
                        .iter()
                        .map(|(w, t)| {
                            let mode = mode_of(w).map_or("?", Mode::as_str);
                            let stops: Vec<String> = out
                                .lives
                                .iter()
                                .filter(|l| l.instance_id == *w)
                                .flat_map(|l| l.stops.iter())
                                .filter(|(s, c)| *c + 3000 >= *at && *s <= t + 1000)
                                .map(|(s, c)| {
                                    format!(
                                        "stopped {:+}..{:+} ms",
                                        *s as i64 - *at as i64,
                                        *c as i64 - *at as i64
                                    )
                                })
                                .chain(first_member_faults(out, w, *at, *t))
                                .collect();
                            // What it last said before the reply.
                            let said = last_said(out, w, *t).map_or(String::new(), |(s, v)| {
                                format!(" [{v} at {:+} ms]", *s as i64 - *at as i64)
                            });
                            format!(
                                "{w} [{mode}]{said} +{} ms{}",
                                t.saturating_sub(*at),
                                if stops.is_empty() {
                                    String::new()
                                } else {
                                    format!(" ({})", stops.join(", "))
                                }
                            )
                        })
                        .collect();
                    s.unexplained
                        .push(format!("{id} at {at}: {}", who.join(", ")));
                    s.unexplained_replies
                        .push((*at, r.iter().map(|(w, t)| ((*w).to_owned(), *t)).collect()));
                }
            }
        }
    }
}

/// The faults of the etcd member `id`'s host asks first, from 3 s before
/// the mention at `at` to 1 s after the reply at `t`: a member cut from the
/// others holds a write sent to it (a `done`) until the call times out.
fn first_member_faults(out: &Outcome, id: &str, at: u64, t: u64) -> Vec<String> {
    let Some(host) = (out.lives.iter())
        .find(|l| l.instance_id == id)
        .map(|l| l.host)
    else {
        return Vec::new();
    };
    (out.etcd_member_faults.iter())
        .filter(|f| out.etcd_members > 0 && f.member == host % out.etcd_members)
        .filter(|f| f.until + 3000 >= at && f.from <= t + 1000)
        .map(|f| {
            format!(
                "its host's first etcd member {} {:+}..{:+} ms",
                if f.cut { "cut" } else { "restarted" },
                f.from as i64 - at as i64,
                f.until as i64 - at as i64
            )
        })
        .collect()
}

/// Whether etcd counted as unreachable at `t`: paused, or within the
/// grace after a pause.
fn etcd_unreachable(out: &Outcome, t: u64) -> bool {
    out.etcd_pauses
        .iter()
        .any(|(s, c)| *s <= t && t <= c + out.etcd_grace_ms)
}

/// Sorts the latencies (called once every mention is counted).
fn sort_latencies(s: &mut Summary) {
    s.latencies.sort_unstable();
    s.latencies_reachable.sort_unstable();
    s.latencies_unfrozen.sort_unstable();
}

/// What `id` said last, at `t` or before: (when, "level reason").
fn last_said<'a>(out: &'a Outcome, id: &str, t: u64) -> Option<&'a (u64, String)> {
    (out.lives.iter())
        .filter(|l| l.instance_id == id)
        .flat_map(|l| l.said.iter())
        .rfind(|(s, _)| *s <= t)
}

/// Whether a leading window's child held the lock for it while the window
/// could not answer during some of `from..to` (see
/// [`Summary::latencies_unfrozen`]).
fn frozen_behind_fresh_record(out: &Outcome, from: u64, to: u64) -> bool {
    let overlaps = |&(s, c): &(u64, u64)| s < to && from < c;
    (out.lives.iter())
        .any(|l| (l.fresh_stops.iter()).any(|span| overlaps(span) && leads_at(l, span.0)))
        || out.orphan_holds.iter().any(overlaps)
}

fn leads_at(life: &Life, t: u64) -> bool {
    life.views
        .iter()
        .rev()
        .find(|(at, _)| *at <= t)
        .is_some_and(|(_, l)| *l)
}

fn running_at(life: &Life, t: u64) -> bool {
    life.start <= t
        && life.end.is_none_or(|e| t < e)
        && !life.stops.iter().any(|(s, c)| *s <= t && t < *c)
}

/// Samples every 5 ms, from a second after the first start to the last end.
fn timeline(out: &Outcome, s: &mut Summary) {
    let lives = &out.lives;
    let t0 = lives.iter().map(|l| l.start).min().unwrap_or(0);
    let t1 = lives.iter().filter_map(|l| l.end).max().unwrap_or(t0);
    let mut t = t0 + 1000;
    while t < t1 {
        let leaders: Vec<&Life> = lives
            .iter()
            .filter(|l| running_at(l, t) && leads_at(l, t))
            .collect();
        match leaders.len() {
            0 => s.no_leader_ms += STEP_MS,
            1 => {}
            _ => {
                s.two_leaders_ms += STEP_MS;
                if leaders.iter().any(|l| l.mode == Mode::Spec) {
                    s.two_with_spec_ms += STEP_MS;
                }
                if etcd_unreachable(out, t) {
                    s.two_while_etcd_unreachable_ms += STEP_MS;
                }
            }
        }
        t += STEP_MS;
    }
}

fn failovers(out: &Outcome) -> Vec<u64> {
    let mut v: Vec<u64> = out
        .deaths
        .iter()
        .filter(|(_, was_leading)| *was_leading)
        .filter_map(|(td, _)| {
            out.lives
                .iter()
                .flat_map(|l| l.views.iter())
                .filter(|(at, lead)| *lead && at >= td)
                .map(|(at, _)| at - td)
                .min()
        })
        .collect();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(id: &str, mode: Mode, views: &[(u64, bool)]) -> Life {
        Life {
            instance_id: id.into(),
            mode,
            host: 0,
            start: 0,
            end: Some(10_000),
            stops: Vec::new(),
            fresh_stops: Vec::new(),
            claims: Vec::new(),
            views: views.to_vec(),
            said: Vec::new(),
        }
    }

    fn reply(m: &str, who: &str, at: u64) -> ReplyLine {
        ReplyLine {
            mention: m.into(),
            instance_id: who.into(),
            at_ms: at,
        }
    }

    fn outcome(lives: Vec<Life>, sent: &[(&str, u64)]) -> Outcome {
        Outcome {
            lives,
            sent: sent.iter().map(|(i, t)| ((*i).into(), *t)).collect(),
            ..Outcome::default()
        }
    }

    #[test]
    fn counts_once_missed_and_unexplained_duplicates() {
        let o = outcome(
            vec![
                life("a", Mode::Extended, &[(0, true)]),
                life("b", Mode::Extended, &[(0, false)]),
            ],
            &[("m0", 2000), ("m1", 3000), ("m2", 4000)],
        );
        let replies = [
            reply("m0", "a", 2001),
            reply("m2", "a", 4001),
            reply("m2", "b", 4002),
        ];
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.sent, s.once, s.missed), (3, 1, 1));
        assert_eq!((s.dup_unexplained, s.dup_forced), (1, 0));
        assert!(
            s.unexplained[0].starts_with("m2 at 4000: a [extended]"),
            "{:?}",
            s.unexplained
        );
    }

    #[test]
    fn on_one_host_acting_at_the_host_level_excuses_no_duplicate() {
        let mut a = life("a", Mode::Extended, &[(0, true)]);
        let mut b = life("b", Mode::Extended, &[(0, false), (2500, true)]);
        a.said.push((0, "Host Acquired".into()));
        b.said.push((2500, "Host Failover".into()));
        let mut o = outcome(vec![a, b], &[("m0", 2000)]);
        let replies = [reply("m0", "a", 2001), reply("m0", "b", 2600)];
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.dup_unexplained, s.dup_etcd_unreachable), (1, 0));
        // Across hosts the same reports are the fall-back's.
        o.lives[1].host = 1;
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.dup_unexplained, s.dup_etcd_unreachable), (0, 1));
    }

    #[test]
    fn a_full_disk_forces_a_duplicate_only_where_no_line_could_go_out() {
        let mut a = life("a", Mode::Extended, &[(0, true)]);
        let mut b = life("b", Mode::Extended, &[(0, false), (3500, true)]);
        let mut c = life("c", Mode::Extended, &[(0, false), (1100, true)]);
        a.said.push((1000, "Host FailSafe".into()));
        b.said.push((3500, "Host Claimed".into()));
        c.said.push((1100, "Host FailSafe".into()));
        let mut o = outcome(vec![a, b, c], &[("m0", 1200), ("m1", 1300)]);
        o.disk_full.push((900, 3000));
        // m0: a answered on the full disk, b after it was freed; m1: two
        // fail-safe leaders on the full disk.
        let replies = [
            reply("m0", "a", 1500),
            reply("m0", "b", 4000),
            reply("m1", "a", 1400),
            reply("m1", "c", 1450),
        ];
        let s = analyse(&o, &replies, 300);
        assert_eq!(
            (s.dup_disk_full, s.dup_unexplained),
            (1, 1),
            "a ran after the disk was freed: its done could go out before b's answer"
        );
        o.lives[0].end = Some(2000);
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.dup_disk_full, s.dup_unexplained), (2, 0), "a was gone");
        // A holder's reply whose done the full disk refused, its window
        // gone before the disk took writes again: the same.
        o.lives[0].said = vec![(1000, "Host Claimed".into())];
        let replies = [reply("m0", "a", 1500), reply("m0", "b", 4000)];
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.dup_disk_full, s.dup_unexplained), (1, 0));
        o.lives[0].end = Some(3500);
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.dup_disk_full, s.dup_unexplained), (0, 1), "a ran after");
    }

    #[test]
    fn a_late_or_resumed_spec_replier_is_the_nips_forced_duplicate() {
        let mut spec = life("s", Mode::Spec, &[(0, true)]);
        spec.stops.push((1000, 3900));
        let o = outcome(
            vec![life("a", Mode::Extended, &[(0, true)]), spec],
            &[("m0", 2000), ("m1", 5000)],
        );
        // m0: the spec replier answered 1.95 s late (starved or stopped).
        // m1: it had just resumed from a stop.
        let replies = [
            reply("m0", "a", 2001),
            reply("m0", "s", 3950),
            reply("m1", "a", 5001),
            reply("m1", "s", 5002),
        ];
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.dup_forced, s.dup_unexplained), (2, 0));
    }

    #[test]
    fn a_leader_held_for_by_its_child_is_a_span_apart() {
        let mut a = life("a", Mode::Extended, &[(0, true), (3200, false)]);
        a.fresh_stops.push((1000, 3000));
        let mut b = life("b", Mode::Extended, &[(0, false), (3200, true)]);
        b.fresh_stops.push((4000, 4500));
        let mut o = outcome(
            vec![a, b],
            &[("m0", 1500), ("m1", 3900), ("m2", 6000), ("m3", 7000)],
        );
        // b killed at 7,050 while it led: its child held the lock on.
        o.orphan_holds.push((7050, 8000));
        let replies = [
            reply("m0", "b", 3300),
            reply("m1", "b", 4600),
            reply("m2", "b", 6100),
            reply("m3", "a", 8100),
        ];
        let s = analyse(&o, &replies, 300);
        assert_eq!(s.latencies, [100, 700, 1100, 1800]);
        assert_eq!(
            s.latencies_unfrozen,
            [100],
            "m0 waited on the frozen leader a, m1 on b, m3 on b's orphaned child"
        );
    }

    #[test]
    fn timeline_and_failover() {
        let mut a = life("a", Mode::Extended, &[(0, true)]);
        a.end = Some(5000);
        let b = life("b", Mode::Spec, &[(0, false), (5100, true)]);
        let mut o = outcome(vec![a, b], &[]);
        o.deaths.push((5000, true));
        o.deaths.push((6000, false));
        let s = analyse(&o, &[], 300);
        assert_eq!(s.failovers, vec![100]);
        assert_eq!(s.no_leader_ms, 100);
        assert_eq!(s.two_leaders_ms, 0);
        // Both lead at once for a while: counted, and flagged as spec.
        let o = outcome(
            vec![
                life("a", Mode::Extended, &[(0, true)]),
                life("b", Mode::Spec, &[(0, false), (2000, true), (2050, false)]),
            ],
            &[],
        );
        let s = analyse(&o, &[], 300);
        assert_eq!((s.two_leaders_ms, s.two_with_spec_ms), (50, 50));
    }

    #[test]
    fn duplicates_while_etcd_was_unreachable_are_the_fall_back_policys() {
        let mut o = outcome(
            vec![
                life("a", Mode::Extended, &[(0, true)]),
                life(
                    "b",
                    Mode::Extended,
                    &[(0, false), (3000, true), (3500, false)],
                ),
            ],
            &[("m0", 3100), ("m1", 8000)],
        );
        o.etcd_pauses.push((1000, 2800));
        o.etcd_grace_ms = 1000;
        o.lives[1].host = 1;
        let replies = [
            reply("m0", "a", 3101),
            reply("m0", "b", 3102),
            reply("m1", "a", 8001),
            reply("m1", "b", 8002),
        ];
        let s = analyse(&o, &replies, 300);
        // m0 fell in the grace after the pause; m1 long after: split-brain.
        assert_eq!((s.dup_etcd_unreachable, s.dup_unexplained), (1, 1));
        assert_eq!(s.two_while_etcd_unreachable_ms, 500);
        // A replier that said it fell back (acting for its host only: etcd
        // had not answered it for a TTL) is the fall-back's too.
        o.lives[1].said = vec![(7900, "Host FailSafe".into())];
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.dup_etcd_unreachable, s.dup_unexplained), (2, 0));
        o.lives[1].said = vec![(7900, "Global Acquired".into())];
        let s = analyse(&o, &replies, 300);
        assert_eq!((s.dup_etcd_unreachable, s.dup_unexplained), (1, 1));
    }
}
