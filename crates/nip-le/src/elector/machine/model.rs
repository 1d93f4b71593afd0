//! A bounded exhaustive check of the key machine with `stateright`: two or
//! three extended windows on one lock file, every interleaving of their
//! looks, crashes and releases (handed to a live sibling, as the
//! extension does) with the passing of time, up to a time bound; a locked
//! look may also fail: a peer held the `flock` for the whole wait (the
//! look falls back to a read), or the file cannot be read (EIO). A window
//! that takes no step while time passes is one that is stopped or starved,
//! for any length up to the bound. Each look is one whole evaluation
//! through [`KeyMachine::step`], atomic as the lock file's `flock` makes
//! its locked part; the writer's part (the key cell's flag and validity,
//! the release path) is played here in a few lines, as the writer does it.
//! With children, each window also has an agent harness child with its id
//! (`INTEROP.md`): it acquires by the NIP's rules, writing its own pid and
//! none of our fields, and truncates the file when it exits.
//!
//! Checked in every reachable state: never two windows acting (leading
//! within their validity) that each hold the lock in their own view; a
//! window that leads because its last look found no record (unreadable,
//! absent or emptied: the NIP's fail-safe, duplicates over silence) is the
//! NIP's accepted transient, as in the simulator. And, so that the check
//! cannot pass by doing nothing, that a takeover from a crashed or stopped
//! holder and a handoff are both reached (and, with children, that a
//! holder takes back a file its child emptied).

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use stateright::{Checker, Model, Property};

use super::super::profile::Profile;
use super::*;

const MS: u64 = 1;
/// The model's step of time: half a refresh (the writer looks at least
/// once per refresh; finer steps add states, not behaviour the rules can
/// tell apart: every deadline they use is a multiple of it, plus the
/// validity's 50 ms margin).
const TICK_MS: u64 = 2500 * MS;

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn now(t_ms: u64) -> Now {
    Now {
        mono: base() + Duration::from_millis(t_ms),
        wall: SystemTime::UNIX_EPOCH
            + Duration::from_secs(1_800_000_000)
            + Duration::from_millis(t_ms),
    }
}

fn rules() -> Rules {
    Rules {
        profile: Profile::of(crate::config::Mode::Extended),
        refresh: Duration::from_secs(5),
        stale: Duration::from_secs(10),
        stand_down: Duration::from_secs(10),
        reply_flight: crate::config::DEFAULT_REPLY_FLIGHT,
    }
}

fn here() -> Arc<Here> {
    Arc::new(Here {
        host: Some("model".into()),
        boot: Some("model-boot".into()),
    })
}

fn pid(i: usize) -> u32 {
    100 + i as u32
}

fn token(i: usize) -> String {
    format!("{}-0123456789abcdef", pid(i))
}

/// One window: its machine and the writer's view of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Window {
    m: KeyMachine,
    alive: bool,
    leader: bool,
    /// The self-fencing deadline (ms); `None`: never fenced.
    valid_until: Option<u64>,
}

impl Window {
    fn acting(&self, t: u64) -> bool {
        self.alive && self.leader && self.valid_until.is_none_or(|u| t < u)
    }

    /// What the writer does with a conclusion: the flag and the validity.
    fn apply(&mut self, c: &Conclusion, t: u64) {
        self.valid_until = match c.validity {
            Validity::Keep => self.valid_until,
            Validity::Always => None,
            Validity::Fenced => Some(0),
            Validity::Renew => Some(t + rules().validity().as_millis() as u64),
        };
        self.leader = c.leader;
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    t: u64,
    file: LockContent,
    floor: crate::epoch::Mark,
    windows: Vec<Window>,
    crashes: u8,
    releases: u8,
    /// Reached: a window took over a record whose holder was still alive
    /// but silent (stopped), or crashed.
    took_over: bool,
    /// Reached: a handoff confirmed by its heir.
    handed: bool,
    /// Moves of the harness children so far (acquires and exits).
    child_moves: u8,
    /// Reached: a holder took back, at its epoch, a file its child emptied.
    took_back: bool,
}

/// What the store does with a write: the file, and the epoch mark.
fn store(file: &mut LockContent, floor: &mut crate::epoch::Mark, write: Write) {
    match write {
        Write::Put(_, r) => {
            *floor = floor.raised(r.epoch.unwrap_or(0));
            *file = LockContent::Record(r);
        }
        Write::Clear(mark) => {
            if let Some(e) = mark {
                *floor = floor.released_at(e);
            }
            *file = LockContent::Empty;
        }
        Write::Keep => {}
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Action {
    Look(usize),
    /// A look whose lock wait timed out: a peer held the `flock`.
    Blocked(usize),
    /// A look that could not read the file (EIO).
    Unreadable(usize),
    Crash(usize),
    /// Window `i`'s harness child acquires, by the NIP's rules.
    Child(usize),
    /// Window `i`'s harness child exits gracefully: it truncates the file
    /// if the record names its id.
    ChildExit(usize),
    Release(usize),
    Advance,
}

struct Elections {
    windows: usize,
    until_ms: u64,
    /// Each window has a harness child with its id.
    children: bool,
}

/// What the probes see: pids and presence of live windows.
struct LiveProbes<'a>(&'a [bool]);

impl Probes for LiveProbes<'_> {
    fn pid(&self, p: u32) -> Liveness {
        // Windows are 100 + i, their harness children 200 + i (a child
        // lives as long as its window: its process group).
        let i = (p as usize).wrapping_sub(100) % 100;
        if self.0.get(i).copied().unwrap_or(false) {
            Liveness::Alive
        } else {
            Liveness::Dead
        }
    }
    fn presence(&self, live: &str) -> PeerPresence {
        let alive = (0..self.0.len()).any(|i| self.0[i] && token(i) == live);
        if alive {
            PeerPresence::Alive
        } else {
            PeerPresence::Gone
        }
    }
    fn others_present(&self) -> bool {
        self.0.iter().filter(|a| **a).count() > 1
    }
    fn present_as(&self, id: &str) -> Option<String> {
        (0..self.0.len())
            .find(|&i| self.0[i] && format!("w{i}") == id)
            .map(token)
    }
}

impl Elections {
    /// A look whose locked part failed: what the fallback read saw.
    fn failed_look(&self, w: &mut World, i: usize, busy: bool) {
        let at = now(w.t);
        let win = &mut w.windows[i];
        win.m.step(
            Input::Evaluate {
                cause: Cause::Tick,
                request: None,
                claimant_gone: false,
            },
            at,
        );
        win.m.step(Input::Look, at);
        let seen = Seen {
            content: if busy {
                Ok(w.file.clone())
            } else {
                Err("EIO".into())
            },
            took: None,
            locked: false,
            busy,
            error: Some(if busy { "lock wait timed out" } else { "EIO" }.into()),
        };
        if let Some(c) = win.m.step(Input::Seen(seen), at).conclusion() {
            win.apply(&c, w.t);
        }
    }

    fn look(&self, w: &mut World, i: usize) {
        let at = now(w.t);
        let alive: Vec<bool> = w.windows.iter().map(|x| x.alive).collect();
        let probes = LiveProbes(&alive);
        let holder_before = w.file.record().map(|r| r.instance_id.clone());
        let vacant_before = same_id::vacant(&w.file);
        let win = &mut w.windows[i];
        let request = None;
        win.m.step(
            Input::Evaluate {
                cause: Cause::Tick,
                request,
                claimant_gone: false,
            },
            at,
        );
        let look = win.m.step(Input::Look, at).look();
        let tok = token(i);
        let locked = Input::Locked {
            content: &w.file,
            floor: w.floor,
            token: Some(&tok),
            probes: &probes,
        };
        let (write, took) = win.m.step(locked, at).write();
        store(&mut w.file, &mut w.floor, write);
        let seen = Seen {
            content: Ok(w.file.clone()),
            took,
            locked: look != Look::Read,
            busy: false,
            error: None,
        };
        let Some(c) = win.m.step(Input::Seen(seen), at).conclusion() else {
            return;
        };
        win.apply(&c, w.t);
        let me = format!("w{i}");
        let holder_now = w.file.record().map(|r| r.instance_id.clone());
        if took.is_some_and(|r| r != crate::election::TakeReason::Ours)
            && holder_before.as_ref().is_some_and(|h| *h != me)
        {
            w.took_over = true;
        }
        if took == Some(crate::election::TakeReason::Ours)
            && holder_now.as_deref() == Some(me.as_str())
            && c.reason == ChangeReason::HandedOver
        {
            w.handed = true;
        }
        if took == Some(crate::election::TakeReason::Ours) && vacant_before {
            w.took_back = true;
        }
    }

    /// Window `i`'s child acquires: empty or malformed, its own id, a dead
    /// pid or a `claimed_at` past the stale bound; then an in-place write
    /// of its own record.
    fn child(&self, w: &mut World, i: usize) {
        let alive: Vec<bool> = w.windows.iter().map(|x| x.alive).collect();
        let id = format!("w{i}");
        let at = now(w.t).wall;
        let takeable = crate::election::takeable(&w.file, &id, at, rules().stale, |p| {
            LiveProbes(&alive).pid(p)
        });
        if matches!(takeable, Takeable::Yes(_)) {
            let bytes = crate::record::encode_record(&id, 200 + i as u32, at, None);
            w.file = LockContent::parse(&bytes);
        }
    }

    fn child_exit(&self, w: &mut World, i: usize) {
        let id = format!("w{i}");
        if w.file.record().is_some_and(|r| r.instance_id == id) {
            w.file = LockContent::Empty;
        }
    }

    /// The writer's one step-down path, handing the lock to a live sibling.
    fn release(&self, w: &mut World, i: usize) {
        let at = now(w.t);
        let heir = (0..w.windows.len())
            .find(|&j| j != i && w.windows[j].alive)
            .map(|j| crate::presence::Sibling {
                token: token(j),
                instance_id: format!("w{j}"),
                pid: pid(j),
            });
        let win = &mut w.windows[i];
        win.m.step(Input::StepDown, at);
        win.leader = false;
        let release = Input::Release {
            content: &w.file,
            floor: w.floor,
            heir: heir.as_ref(),
        };
        let (write, _) = win.m.step(release, at).release();
        store(&mut w.file, &mut w.floor, write);
        let content = Ok(w.file.clone());
        w.windows[i].m.step(Input::Released(content), at);
    }
}

impl Model for Elections {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let windows = (0..self.windows)
            .map(|i| Window {
                m: KeyMachine::new(rules(), Arc::from(format!("w{i}")), pid(i), here()),
                alive: true,
                leader: false,
                valid_until: Some(0),
            })
            .collect();
        vec![World {
            t: 0,
            file: LockContent::Absent,
            floor: crate::epoch::Mark::default(),
            windows,
            crashes: 0,
            releases: 0,
            took_over: false,
            handed: false,
            child_moves: 0,
            took_back: false,
        }]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        for (i, win) in w.windows.iter().enumerate() {
            if !win.alive {
                continue;
            }
            actions.push(Action::Look(i));
            actions.push(Action::Blocked(i));
            actions.push(Action::Unreadable(i));
            if w.crashes < 1 {
                actions.push(Action::Crash(i));
            }
            if w.releases < 1 && win.m.holds_lock() {
                actions.push(Action::Release(i));
            }
            if self.children && w.child_moves < 2 {
                actions.push(Action::Child(i));
                actions.push(Action::ChildExit(i));
            }
        }
        if w.t < self.until_ms {
            actions.push(Action::Advance);
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        match action {
            Action::Look(i) => self.look(&mut w, i),
            Action::Blocked(i) => self.failed_look(&mut w, i, true),
            Action::Unreadable(i) => self.failed_look(&mut w, i, false),
            Action::Crash(i) => {
                w.windows[i].alive = false;
                w.crashes += 1;
            }
            Action::Release(i) => {
                self.release(&mut w, i);
                w.releases += 1;
            }
            Action::Child(i) => {
                self.child(&mut w, i);
                w.child_moves += 1;
            }
            Action::ChildExit(i) => {
                self.child_exit(&mut w, i);
                w.child_moves += 1;
            }
            Action::Advance => w.t += TICK_MS,
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never two acting holders", |_, w: &World| {
                let holders = w
                    .windows
                    .iter()
                    .filter(|x| x.acting(w.t) && x.m.holds_lock());
                holders.count() < 2
            }),
            Property::sometimes(
                "a takeover from a silent or crashed holder",
                |_, w: &World| w.took_over,
            ),
            Property::sometimes("a handoff confirmed by its heir", |_, w: &World| w.handed),
            Property::sometimes(
                "a holder takes back what its child emptied (with children)",
                |m: &Elections, w: &World| !m.children || w.took_back,
            ),
        ]
    }
}

/// Runs the check to its end (never past `cap` states: a bound that grew
/// the space beyond it fails loudly instead of eating the machine).
fn check(windows: usize, until_ms: u64, children: bool, cap: usize) -> usize {
    let checker = Elections {
        windows,
        until_ms,
        children,
    }
    .checker()
    .target_state_count(cap)
    .spawn_bfs()
    .join();
    checker.assert_properties();
    let states = checker.unique_state_count();
    assert!(states < cap, "not exhaustive: {states} states");
    states
}

#[test]
fn two_windows_never_act_together_in_any_interleaving() {
    let states = check(2, 25_000, false, 2_000_000);
    eprintln!("two windows: {states} states");
    assert!(states > 1000, "{states}");
}

#[test]
fn three_windows_never_act_together_in_any_interleaving() {
    let states = check(3, 15_000, false, 3_000_000);
    eprintln!("three windows: {states} states");
    assert!(states > 1000, "{states}");
}

#[test]
fn two_windows_with_harness_children_never_act_together_in_any_interleaving() {
    let states = check(2, 20_000, true, 3_000_000);
    eprintln!("two windows with children: {states} states");
    assert!(states > 1000, "{states}");
}
