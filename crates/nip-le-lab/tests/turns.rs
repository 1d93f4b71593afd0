//! `nip-le run --turn-ms`: every instance queues every mention, the leader
//! works them one at a time through the work ledger. Real processes, real
//! signals: every mention must be answered exactly once across a crash
//! mid-turn, a hang, a claim mid-turn and a restart that reads the whole
//! backlog.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use nip_le_cli::drive::cluster::{wait_until, Instance, RunOptions};
use nip_le_cli::lines::{Line, ReplyLine, TurnOutcome};
use support::*;

struct Feed {
    mentions: PathBuf,
    replies: PathBuf,
}

impl Feed {
    fn new(s: &Scratch) -> Self {
        let f = Self {
            mentions: s.tmp.path().join("mentions.jsonl"),
            replies: s.tmp.path().join("replies.jsonl"),
        };
        std::fs::write(&f.mentions, b"").unwrap();
        f
    }

    fn opts(&self, s: &Scratch, turn_ms: u64) -> RunOptions {
        let mut o = s.opts();
        o.feed = Some((self.mentions.clone(), self.replies.clone()));
        o.extra_args = vec!["--turn-ms".into(), turn_ms.to_string()];
        o
    }

    fn mention(&self, id: &str) {
        let line = format!("{{\"id\":\"{id}\",\"at_ms\":{}}}\n", nip_le_cli::unix_ms());
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.mentions)
            .unwrap()
            .write_all(line.as_bytes())
            .unwrap();
    }

    /// Replies per mention id: who answered.
    fn replies(&self) -> BTreeMap<String, Vec<String>> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in ReplyLine::read_all(&self.replies) {
            m.entry(r.mention_id()).or_default().push(r.instance_id);
        }
        m
    }

    fn all_answered(&self, ids: &[String]) -> bool {
        let r = self.replies();
        ids.iter().all(|id| r.contains_key(id))
    }

    fn assert_exactly_once(&self, ids: &[String]) {
        let r = self.replies();
        for id in ids {
            assert_eq!(r.get(id).map(Vec::len), Some(1), "{id}: {r:?}");
        }
        assert_eq!(r.len(), ids.len(), "replies to unknown mentions: {r:?}");
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// The one leader's index.
fn leader_index(insts: &[Instance]) -> usize {
    let l = leaders(insts);
    assert_eq!(l.len(), 1, "{l:?}");
    insts.iter().position(|i| i.instance_id == l[0]).unwrap()
}

fn turns_of(inst: &Instance, outcome: TurnOutcome) -> usize {
    inst.reports()
        .iter()
        .filter(|r| matches!(&r.line, Line::Turn { outcome: o, .. } if *o == outcome))
        .count()
}

/// Waits until `inst` reports, after `cursor`, that a turn began.
fn wait_turn_started(inst: &Instance, cursor: usize) {
    let started = inst.wait_after(cursor, Duration::from_secs(5), |r| {
        matches!(
            &r.line,
            Line::Turn {
                outcome: TurnOutcome::Started,
                ..
            }
        )
    });
    assert!(started.is_some(), "{} started no turn", inst.instance_id);
}

fn wait_answered(feed: &Feed, all: &[String], within: Duration) {
    assert!(
        wait_until(within, || feed.all_answered(all)),
        "not all answered: {:?}",
        feed.replies()
    );
    // Nothing answers twice afterwards either.
    std::thread::sleep(ms(REFRESH_MS * 2));
    feed.assert_exactly_once(all);
}

#[test]
fn sigkill_mid_turn_hands_the_turn_to_the_next_leader() {
    let s = Scratch::new();
    let feed = Feed::new(&s);
    let insts: Vec<_> = (0..3)
        .map(|i| s.spawn_with(&format!("i{i}"), feed.opts(&s, 300)))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || leaders(&insts).len() == 1));
    let mut insts = insts;
    let l = leader_index(&insts);
    let c = insts[l].cursor();
    let all = ids("k", 4);
    for id in &all {
        feed.mention(id);
    }
    // In the first turn, the leader dies.
    wait_turn_started(&insts[l], c);
    insts[l].kill_and_reap().unwrap();
    wait_answered(&feed, &all, Duration::from_secs(10));
}

#[test]
fn a_claim_mid_turn_cancels_it_and_the_claimant_answers() {
    let s = Scratch::new();
    let feed = Feed::new(&s);
    let mut insts: Vec<_> = (0..2)
        .map(|i| s.spawn_with(&format!("i{i}"), feed.opts(&s, 400)))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || leaders(&insts).len() == 1));
    let old = leader_index(&insts);
    let new = 1 - old;
    let c = insts[old].cursor();
    let all = ids("c", 3);
    for id in &all {
        feed.mention(id);
    }
    wait_turn_started(&insts[old], c);
    insts[new].send("claim").unwrap();
    wait_answered(&feed, &all, Duration::from_secs(10));
    assert!(
        turns_of(&insts[old], TurnOutcome::Cancelled) >= 1,
        "the old leader's turn was not cancelled"
    );
    let answered_by_new = feed
        .replies()
        .values()
        .filter(|w| w[0] == insts[new].instance_id)
        .count();
    assert_eq!(
        answered_by_new,
        all.len(),
        "the claimant answered everything"
    );
}

#[test]
fn a_resumed_hung_leader_is_fenced_and_does_not_answer_again() {
    let s = Scratch::new();
    let feed = Feed::new(&s);
    let insts: Vec<_> = (0..2)
        .map(|i| s.spawn_with(&format!("i{i}"), feed.opts(&s, 600)))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || leaders(&insts).len() == 1));
    let l = leader_index(&insts);
    let c = insts[l].cursor();
    let all = ids("h", 2);
    for id in &all {
        feed.mention(id);
    }
    wait_turn_started(&insts[l], c);
    // Hung mid-turn, past the stale bound: the other takes over and answers.
    stop_outside_flock(&insts[l], &s.lock_path());
    assert!(
        wait_until(ms(STALE_MS * 3), || feed.all_answered(&all)),
        "the survivor did not answer: {:?}",
        feed.replies()
    );
    // Resumed: its turn is over by its clock, but it is fenced.
    let c = insts[l].cursor();
    insts[l].resume().unwrap();
    let ended = insts[l].wait_after(
        c,
        Duration::from_secs(5),
        |r| matches!(&r.line, Line::Turn { outcome: o, .. } if *o != TurnOutcome::Started),
    );
    assert!(
        matches!(
            ended.map(|r| r.line),
            Some(Line::Turn {
                outcome: TurnOutcome::Cancelled,
                ..
            })
        ),
        "the resumed leader's turn did not end cancelled"
    );
    feed.assert_exactly_once(&all);
}

#[test]
fn a_restarted_instance_reads_the_backlog_without_answering_it_again() {
    let s = Scratch::new();
    let feed = Feed::new(&s);
    let mut first = s.spawn_with("first", feed.opts(&s, 20));
    assert!(wait_until(Duration::from_secs(5), || first.is_leader() == Some(true)));
    let old = ids("b", 5);
    for id in &old {
        feed.mention(id);
    }
    // Every turn ended (reply sent *and* marked done): a kill between the
    // two is the one duplicate window the ledger leaves, not this test's.
    assert!(wait_until(Duration::from_secs(5), || turns_of(
        &first,
        TurnOutcome::Replied
    ) == old.len()));
    assert!(feed.all_answered(&old));
    first.kill_and_reap().unwrap();
    // A new instance reads the whole feed, as a client fetches recent events
    // when it connects: the ledger says it is all done.
    let second = s.spawn_with("second", feed.opts(&s, 20));
    assert!(wait_until(Duration::from_secs(5), || second.is_leader() == Some(true)));
    assert!(wait_until(Duration::from_secs(5), || second
        .reports()
        .iter()
        .filter(|r| r.event() == "mention")
        .count()
        == old.len()));
    feed.mention("after");
    let mut all = old.clone();
    all.push("after".into());
    wait_answered(&feed, &all, Duration::from_secs(5));
    assert_eq!(feed.replies()["after"], vec![second.instance_id.clone()]);
}
