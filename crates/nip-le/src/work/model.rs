//! A bounded exhaustive check of the work rules with `stateright`: three
//! windows queue the same two mentions and share one ledger file; every
//! interleaving of takes, replies (the reply and its `done` as one step:
//! the single-syscall window between them is the documented duplicate),
//! cancels, crashes, restarts, a hang, takeovers (of a holder that died,
//! hung or released) and hand-overs (a claim: the old holder lives, its
//! turns stay in flight) runs through the real [`WorkMachine`] and
//! [`Index`]. The lock's election is played here in a few lines: who holds,
//! at which epoch, and how it got there (the key machine's own check is
//! `elector/machine/model.rs`).
//!
//! Checked in every reachable state: no mention is answered twice; none
//! is lost (each unanswered one is in the turn of a window that can still
//! reply, or owed to a holder that can act, or waits for a takeover);
//! and what the holder is owed is exactly what it would be granted. So
//! that it cannot pass by doing nothing: a reply after a hand-over, a
//! re-grant after a crash and one after a hung holder's takeover are all
//! reached.

use std::collections::BTreeSet;
use std::time::Duration;

use stateright::{Checker, Model, Property};

use crate::elector::types::{QueuedEvent, TakeOutcome};
use crate::ledger::{Index, Op};

use super::{held_line, settle_line, Displaced, Lead, Settle, SettleStep, TakeStep, WorkMachine};

const EVENTS: [&str; 2] = ["e0", "e1"];
const MAX_CRASHES: u8 = 2;
const MAX_HANGS: u8 = 1;
const MAX_HANDOVERS: u8 = 2;
const NOW_MS: u64 = 1_000_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Window {
    alive: bool,
    /// Stopped (SIGSTOP, a suspend): takes no step, its presence lives.
    hung: bool,
    /// Its lock was taken over while it hung: once it resumes it finds
    /// itself fenced and sends nothing of what it had in hand.
    fenced: bool,
    /// Restarts so far: a new presence token each time.
    life: u8,
    m: WorkMachine,
    /// Granted turns in flight (the reply not sent yet).
    turns: BTreeSet<usize>,
}

impl Window {
    fn token(&self, i: usize) -> String {
        format!("w{i}-{}", self.life)
    }
    /// Takes steps of its own.
    fn runs(&self) -> bool {
        self.alive && !self.hung
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    ledger: Vec<Op>,
    windows: Vec<Window>,
    holder: Option<usize>,
    epoch: u64,
    sent: [u8; 2],
    crashes: u8,
    hangs: u8,
    handovers: u8,
    // Reached, so that the check cannot pass by doing nothing.
    replied_after_handover: bool,
    regranted_after_crash: bool,
    regranted_after_hang: bool,
}

impl World {
    fn index(&self) -> Index {
        let mut ix = Index::default();
        for op in &self.ledger {
            ix.apply(op);
        }
        ix
    }
    fn alive_token(&self) -> impl Fn(&str) -> bool + '_ {
        |t: &str| (self.windows.iter().enumerate()).any(|(i, w)| w.alive && w.token(i) == t)
    }
    /// The holder can act (the lock names it, it runs).
    fn acting(&self) -> Option<usize> {
        self.holder.filter(|&h| self.windows[h].runs())
    }
    fn queue() -> Vec<QueuedEvent> {
        (EVENTS.iter())
            .map(|id| QueuedEvent {
                id: (*id).to_owned(),
                published_ms: Some(1),
            })
            .collect()
    }
    fn owed(&self, h: usize) -> Vec<String> {
        let ix = self.index();
        let alive = self.alive_token();
        // On a copy: asking changes nothing the check should keep.
        (self.windows[h].m.clone()).owed(&Self::queue(), true, (Some(&ix), 0), &alive)
    }
    fn would_grant(&self, h: usize, e: usize) -> bool {
        let ix = self.index();
        let alive = self.alive_token();
        let w = &self.windows[h];
        let token = w.token(h);
        // On a copy: asking changes nothing the check should keep.
        let step = (w.m.clone()).take(
            (EVENTS[e], None),
            true,
            NOW_MS,
            (Some(&ix), false),
            &alive,
            "w",
            Some(&token),
        );
        matches!(step, TakeStep::Record(_))
    }
    /// `to` holds at a new epoch.
    fn gain(&mut self, to: usize, takeover: bool) {
        // The record our take replaces names the holder (none at first).
        let before = self.holder.map(|h| self.windows[h].token(h));
        (self.windows[to].m).replaced(None, Displaced::Token(before));
        self.epoch += 1;
        self.holder = Some(to);
        let lead = self.windows[to]
            .m
            .lead(NOW_MS, true, Some(self.epoch), takeover);
        assert_eq!(lead, Lead::Open { epoch: self.epoch });
        let ix = self.index();
        let given = self.windows[to].m.opened(Some(&ix), &|_| false, NOW_MS);
        self.ledger.extend(given);
        let by = format!("w{to}");
        self.ledger.extend(held_line(&ix, self.epoch, &by, NOW_MS));
    }
    fn settle(&mut self, i: usize, e: usize, what: Settle) {
        let ix = self.index();
        let token = self.windows[i].token(i);
        let leads = self.acting() == Some(i);
        let line =
            match self.windows[i]
                .m
                .settle(EVENTS[e], Some(&token), leads, what, NOW_MS, Some(&ix))
            {
                SettleStep::Record(op) => Some(op),
                SettleStep::Outside { done_anyway, .. } => {
                    settle_line(&ix, EVENTS[e], Some(&token), what, NOW_MS, done_anyway)
                }
                SettleStep::Answer(_) => None,
            };
        self.ledger.extend(line);
        self.windows[i].turns.remove(&e);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Action {
    Take(usize, usize),
    Reply(usize, usize),
    Cancel(usize, usize),
    Crash(usize),
    Restart(usize),
    Hang(usize),
    Resume(usize),
    /// The lock's holder died, hangs past the stale bound, or there is none.
    TakeOver(usize),
    /// A claim: the holder hands its lock over, alive.
    HandOver(usize),
}

struct Ledgers {
    windows: usize,
}

impl Model for Ledgers {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let window = Window {
            alive: true,
            hung: false,
            fenced: false,
            life: 0,
            m: WorkMachine::new(true, Duration::from_secs(10)),
            turns: BTreeSet::new(),
        };
        let mut w = World {
            ledger: Vec::new(),
            windows: vec![window; self.windows],
            holder: None,
            epoch: 0,
            sent: [0; 2],
            crashes: 0,
            hangs: 0,
            handovers: 0,
            replied_after_handover: false,
            regranted_after_crash: false,
            regranted_after_hang: false,
        };
        w.gain(0, true);
        vec![w]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        let holder_gone = w.holder.is_none_or(|h| !w.windows[h].runs());
        for (i, win) in w.windows.iter().enumerate() {
            if !win.alive {
                if w.crashes <= MAX_CRASHES && win.life < MAX_CRASHES {
                    actions.push(Action::Restart(i));
                }
                continue;
            }
            if win.hung {
                actions.push(Action::Resume(i));
                continue;
            }
            if w.acting() == Some(i) {
                for e in 0..EVENTS.len() {
                    actions.push(Action::Take(i, e));
                }
            }
            for &e in &win.turns {
                if !win.fenced {
                    actions.push(Action::Reply(i, e));
                }
                actions.push(Action::Cancel(i, e));
            }
            if w.crashes < MAX_CRASHES {
                actions.push(Action::Crash(i));
            }
            if w.hangs < MAX_HANGS {
                actions.push(Action::Hang(i));
            }
            if holder_gone {
                actions.push(Action::TakeOver(i));
            } else if w.holder != Some(i) && w.handovers < MAX_HANDOVERS {
                actions.push(Action::HandOver(i));
            }
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        match action {
            Action::Take(i, e) => {
                let step = {
                    let ix = w.index();
                    let alive = w.alive_token();
                    let win = &w.windows[i];
                    let token = win.token(i);
                    (win.m.clone()).take(
                        (EVENTS[e], None),
                        true,
                        NOW_MS,
                        (Some(&ix), false),
                        &alive,
                        "w",
                        Some(&token),
                    )
                };
                let TakeStep::Record(lines) = step else {
                    return None;
                };
                let (out, _) = w.windows[i].m.take_written(EVENTS[e], true);
                assert!(matches!(out, TakeOutcome::Granted { epoch: Some(_) }));
                // Granted though a window still has it in hand.
                let again = (w.windows.iter()).any(|x| x.turns.contains(&e));
                w.regranted_after_crash |= again && w.crashes > 0;
                w.regranted_after_hang |= again && w.hangs > 0;
                w.ledger.extend(lines);
                w.windows[i].turns.insert(e);
            }
            Action::Reply(i, e) => {
                w.sent[e] += 1;
                w.replied_after_handover |= w.holder != Some(i) && w.handovers > 0;
                w.settle(i, e, Settle::Done);
            }
            Action::Cancel(i, e) => w.settle(i, e, Settle::GiveBack),
            Action::Crash(i) => {
                w.crashes += 1;
                let win = &mut w.windows[i];
                win.alive = false;
                win.hung = false;
                win.turns.clear();
            }
            Action::Restart(i) => {
                let win = &mut w.windows[i];
                *win = Window {
                    alive: true,
                    hung: false,
                    fenced: false,
                    life: win.life + 1,
                    m: WorkMachine::new(true, Duration::from_secs(10)),
                    turns: BTreeSet::new(),
                };
                if w.holder == Some(i) {
                    // Its old record is stale: the lock is taken over.
                    w.holder = None;
                }
            }
            Action::Hang(i) => {
                w.hangs += 1;
                w.windows[i].hung = true;
            }
            Action::Resume(i) => {
                let win = &mut w.windows[i];
                win.hung = false;
                if win.fenced {
                    // Fenced on waking: nothing it had in hand is sent, and
                    // it leads no more.
                    win.turns.clear();
                    win.fenced = false;
                    let _ = win.m.lead(NOW_MS, false, None, false);
                }
            }
            Action::TakeOver(j) => {
                if let Some(h) = w.holder {
                    let old = &mut w.windows[h];
                    if old.alive && old.hung {
                        old.fenced = true;
                    }
                }
                w.gain(j, true);
            }
            Action::HandOver(j) => {
                let h = w.holder.expect("a holder hands over");
                w.handovers += 1;
                let _ = w.windows[h].m.lead(NOW_MS, false, None, false);
                w.gain(j, false);
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no mention answered twice", |_, w: &World| {
                w.sent.iter().all(|&n| n <= 1)
            }),
            Property::always("no mention lost", |_, w: &World| {
                (0..EVENTS.len()).all(|e| {
                    let in_hand =
                        (w.windows.iter()).any(|x| x.alive && !x.fenced && x.turns.contains(&e));
                    let owed = match w.acting() {
                        Some(h) => w.owed(h).iter().any(|id| id == EVENTS[e]),
                        // A takeover will come.
                        None => true,
                    };
                    w.sent[e] > 0 || in_hand || owed
                })
            }),
            Property::always("owed is what a take grants", |_, w: &World| {
                let Some(h) = w.acting() else {
                    return true;
                };
                let owed = w.owed(h);
                (0..EVENTS.len())
                    .all(|e| owed.iter().any(|id| id == EVENTS[e]) == w.would_grant(h, e))
            }),
            Property::sometimes("a reply after a hand-over", |_, w: &World| {
                w.replied_after_handover
            }),
            Property::sometimes("a re-grant after a crash", |_, w: &World| {
                w.regranted_after_crash
            }),
            Property::sometimes(
                "a re-grant after a hung holder's takeover",
                |_, w: &World| w.regranted_after_hang,
            ),
        ]
    }
}

#[test]
fn three_windows_answer_each_mention_once_in_any_interleaving() {
    let cap = 3_000_000;
    let checker = Ledgers { windows: 3 }
        .checker()
        .target_state_count(cap)
        .spawn_bfs()
        .join();
    checker.assert_properties();
    let states = checker.unique_state_count();
    eprintln!("work rules, three windows: {states} states");
    assert!(states < cap, "not exhaustive: {states} states");
}
