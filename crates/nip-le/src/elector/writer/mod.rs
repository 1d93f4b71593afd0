//! The election task: one thread per [`crate::Elector`] owns the state of
//! every joined key and does all of its file I/O. Commands from the facade,
//! refresh ticks, file events and holder deaths are handled one at a time,
//! in order, so `leave` and `shutdown` can never race a refresh and nothing
//! is written after `shutdown` returns. Readers never wait for it: after
//! each evaluation it publishes the key's answer and status
//! (see [`super::cache`]).
//!
//! Arrows: the writer reads the store, asks the machine
//! ([`super::machine`]) what to do, and carries the decision out through the
//! store and the wake sources, all reached through its [`World`] (real
//! files and clocks in an app, virtual ones in the simulator). The machine
//! calls neither.
//!
//! One concept per file: this one is the loop and the commands;
//! `context` what the writer owns besides the keys (presence, probes);
//! `key` one key's evaluation, step-down and announcements; `work` the
//! work ledger; `global_level` the glue to the global level.

mod context;
mod deferred;
mod drain;
mod global_level;
mod key;
mod unwritten;
mod work;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::pubkey::AgentPubkey;
use crate::work::WorkMachine;

use super::cache::{self, KeyCell, Published, Snapshot};
use super::global_level::GlobalLevel;
use super::machine::{Cause, Input, KeyMachine, Rules, StepDownPlan};
use super::profile::Profile;
use super::types::ChangeReason;
use super::types::{ClaimOutcome, GlobalStatus, LeadershipChange};
use super::world::World;

use context::Ctx;
use deferred::DrainReply;
use key::Key;

pub(crate) use super::command::{Command, Reply, WorkOp, WorkReply};

/// What the writer and the facade share: the readers' snapshot and the
/// change events.
#[derive(Debug)]
pub(crate) struct Shared {
    pub snapshot: Snapshot,
    pub events: broadcast::Sender<LeadershipChange>,
    /// Which keys' agents this process runs (see
    /// [`super::agent_hold`]).
    pub agents: super::agent_hold::AgentHolds,
}

impl Shared {
    pub(crate) fn new() -> Self {
        Self {
            snapshot: Default::default(),
            events: broadcast::channel(1024).0,
            agents: Default::default(),
        }
    }
}

/// The writer.
pub(crate) struct Writer {
    ctx: Ctx,
    keys: BTreeMap<AgentPubkey, Key>,
    /// Work-ledger lines of keys we left that the disk refused (a `done`
    /// whose reply was sent): written on every wake-up until it takes
    /// them, or a successor answers the event again.
    left_unwritten: BTreeMap<AgentPubkey, unwritten::Unwritten>,
    /// `shutdown` was asked for: answered, and the task stopped, once every
    /// key has stepped down (each once its agent has stopped).
    closing: Option<Reply<()>>,
}

pub(crate) enum Flow {
    Go,
    Stop,
}

pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Writer {
    pub(crate) fn new(
        config: Config,
        our_id: Arc<str>,
        shared: Arc<Shared>,
        world: Box<dyn World>,
        global_level: Option<Box<dyn GlobalLevel>>,
    ) -> Self {
        let rules = Rules {
            profile: Profile::of(config.mode),
            refresh: config.refresh,
            stale: config.stale,
            stand_down: config.stand_down,
            reply_flight: config.reply_flight,
        };
        Self {
            ctx: Ctx::new(config, rules, our_id, shared, world, global_level),
            keys: BTreeMap::new(),
            left_unwritten: BTreeMap::new(),
            closing: None,
        }
    }

    /// Runs until a `Shutdown` command (or until every handle to the
    /// mailbox is gone).
    pub(crate) fn run(mut self) {
        while self.round() {}
    }

    /// One round of the loop: wait for the next wake-up (the world decides
    /// how: `poll` in an app, at once in the simulator), then handle every
    /// command, the due ticks and the wake-ups, in order. `false` once shut
    /// down.
    pub(crate) fn round(&mut self) -> bool {
        let now = self.ctx.world.now().mono;
        let asked = self.next_tick();
        let timeout = asked.map(|t| t.saturating_duration_since(now));
        let woken = self.ctx.world.wait(timeout);
        self.notice_pause(asked);
        for c in woken.commands {
            // A panic in a command drops its reply (the caller gets an
            // error) and leaves the task running.
            let flow = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.command(c)));
            match flow {
                Ok(Flow::Stop) => return false,
                Ok(Flow::Go) => {}
                Err(panic) => {
                    tracing::error!("a command panicked: {}", panic_message(&panic));
                }
            }
            // What waited for the answer: our presence, the watches.
            self.after_answer();
        }
        self.finish_drains(false);
        if self.closing.is_some() && self.keys.is_empty() {
            self.close();
            return false;
        }
        self.refresh_due(&woken.keys, woken.all);
        for key in self.keys.values_mut() {
            key.announce_fencing(&mut self.ctx);
        }
        self.after_answer();
        true
    }

    /// Extension: a round that began late enough after the wake-up it
    /// asked for (`asked`) that we were paused (the rule:
    /// [`Rules::paused`]) restarts the hang timers. A round woken early
    /// (a command, a file event) was not late.
    fn notice_pause(&mut self, asked: Option<Instant>) {
        let now = self.ctx.world.now().mono;
        let late = asked.map_or(Duration::ZERO, |a| now.saturating_duration_since(a));
        if !self.keys.is_empty() && self.ctx.rules.paused(late) {
            tracing::info!(
                ?late,
                "the election task was paused: hang timers start again"
            );
            for key in self.keys.values_mut() {
                key.m.step(Input::Paused, self.ctx.world.now());
            }
        }
    }

    /// The work no answer needs to wait for: the presence file and the
    /// watches of the keys whose view changed.
    fn after_answer(&mut self) {
        self.ctx.probed.get_mut().clear();
        self.ctx.flush_presence();
        for (pk, u) in self.left_unwritten.iter_mut() {
            work::retry(u, &self.ctx, pk);
        }
        self.left_unwritten.retain(|_, u| !u.is_empty());
        for key in self.keys.values_mut() {
            key.compact_ledger(&self.ctx);
            if let Some(watch) = key.watch.take() {
                self.ctx.world.watch_holder(&key.pubkey, watch.as_deref());
                self.ctx.world.watch_lock_file(&key.pubkey);
            }
        }
    }

    /// When the loop must wake next: the earliest tick, the moment a
    /// holder we watch would count as hung, or the moment a key we
    /// announced as led fences itself (each judged then, not at the next
    /// tick).
    pub(crate) fn next_tick(&self) -> Option<Instant> {
        let now = self.ctx.world.now().mono;
        // Lines of keys we left still wait for the disk: a wake-up each
        // refresh writes them, even with no key left.
        let unwritten = (!self.left_unwritten.is_empty()).then(|| now + self.ctx.rules.refresh);
        self.keys
            .values()
            .map(|k| k.next_wake(&self.ctx, now))
            .chain(unwritten)
            .min()
    }

    /// Ticks every key that is due (or nearly: ticks are coalesced, a
    /// refresh a little early is harmless) and looks again at the keys a
    /// file event or a holder's death named.
    fn refresh_due(&mut self, woken: &BTreeSet<AgentPubkey>, all: bool) {
        let now = self.ctx.world.now().mono;
        let due = now + self.ctx.rules.tick_slack();
        for key in self.keys.values_mut() {
            if key.next_tick <= due {
                // Before the look: the look may bring its next one closer.
                key.next_tick = self.ctx.world.now().mono + self.ctx.rules.refresh;
                key.evaluate(&mut self.ctx, Cause::Tick);
            } else if all
                || woken.contains(&key.pubkey)
                || key.m.hang_deadline().is_some_and(|d| d <= now)
            {
                key.evaluate(&mut self.ctx, Cause::Wake);
            }
        }
    }

    fn command(&mut self, c: Command) -> Flow {
        match c {
            Command::Join(keys, r) => {
                let out = match self.closing {
                    Some(_) => Err(Error::ShutDown),
                    None => Ok(self.join(&keys)),
                };
                let _ = r.send(out);
            }
            Command::Leave(pk, r) => self.leave(&pk, r),
            Command::Claim(pk, r) => {
                let out = match self.keys.get_mut(&pk) {
                    Some(k) => {
                        k.cancel_drain(&mut self.ctx);
                        k.claim(&mut self.ctx)
                            .map(|o| k.claim_global(&mut self.ctx, o))
                    }
                    None => Err(Error::NotJoined(pk)),
                };
                let _ = r.send(out);
            }
            Command::Release(pk, r) => match self.keys.get_mut(&pk) {
                Some(k) => {
                    let plan = plan(ChangeReason::Released, None, false);
                    let reply = Some(DrainReply::Released(r));
                    if let Some(done) = k.step_down_for(&mut self.ctx, plan, reply) {
                        done.answer();
                    }
                }
                None => drop(r.send(Err(Error::NotJoined(pk)))),
            },
            Command::StandDown(pk, r) => match self.keys.get_mut(&pk) {
                Some(k) => {
                    let plan = plan(ChangeReason::StoodDown, None, false);
                    let reply = Some(DrainReply::Done(r));
                    if let Some(done) = k.step_down_for(&mut self.ctx, plan, reply) {
                        done.answer();
                    }
                }
                None => drop(r.send(Err(Error::NotJoined(pk)))),
            },
            Command::Resume(pk, r) => {
                let ctx = &mut self.ctx;
                let out = self.keys.get_mut(&pk).ok_or(Error::NotJoined(pk)).map(|k| {
                    k.cancel_drain(ctx);
                    k.m.step(Input::Resume, ctx.world.now());
                    k.evaluate(ctx, Cause::Tick);
                    k.cell.is_leader_on(ctx.world.clocks())
                });
                let _ = r.send(out);
            }
            Command::ClaimFrame(pk, target, r) => {
                let _ = r.send(self.claim_frame(&pk, &target));
            }
            Command::RefreshNow(r) => {
                for key in self.keys.values_mut() {
                    key.evaluate(&mut self.ctx, Cause::Tick);
                }
                let _ = r.send(Ok(()));
            }
            Command::Shutdown(r) => {
                // Every key steps down as a leave does: each lock moves as
                // soon as its own agent has stopped.
                let pks: Vec<AgentPubkey> = self.keys.keys().copied().collect();
                for pk in pks {
                    let Some(key) = self.keys.get_mut(&pk) else {
                        continue;
                    };
                    let plan = StepDownPlan {
                        always: false,
                        ..plan(ChangeReason::Released, None, true)
                    };
                    if let Some(done) = key.step_down_for(&mut self.ctx, plan, None) {
                        if let Some(key) = self.keys.remove(&pk) {
                            self.forget(key);
                        }
                        done.answer();
                    }
                }
                self.closing = Some(r);
                if self.keys.is_empty() {
                    self.close();
                    return Flow::Stop;
                }
            }
            Command::Work(pk, op, reply) => match self.keys.get_mut(&pk) {
                Some(k) => k.work(&mut self.ctx, op, reply),
                None => reply.fail(Error::NotJoined(pk)),
            },
            Command::Global(pk, news) => {
                if let Some(k) = self.keys.get_mut(&pk) {
                    k.global_news(&mut self.ctx, news);
                }
            }
            Command::Renewed(pk, r) => {
                if let Some(k) = self.keys.get_mut(&pk) {
                    k.renewed(&self.ctx, r);
                }
            }
        }
        Flow::Go
    }

    /// Joins `keys` and claims each at once (auto-claim on launch). Returns
    /// the resulting leadership of each; joining a key twice is a no-op.
    fn join(&mut self, keys: &[AgentPubkey]) -> Vec<bool> {
        // A lock directory we cannot create is the NIP's fail-safe case (we
        // lead, and say why in `last_error`), not a reason to refuse to run.
        if let Err(e) = self.ctx.world.ensure_dir() {
            tracing::warn!("lock directory unusable, failing safe to leader: {e}");
        }
        // Listed in our presence (one write for them all) before the first
        // look and before the answer: a record we write names a presence
        // that says we take part, and a leader leaving right after our join
        // finds us as its heir.
        let before = self.ctx.joined.len();
        self.ctx.joined.extend(keys.iter().copied());
        self.ctx.presence_dirty |= self.ctx.joined.len() != before;
        self.ctx.flush_presence();
        keys.iter().map(|pk| self.join_one(*pk)).collect()
    }

    fn join_one(&mut self, pk: AgentPubkey) -> bool {
        if let Some(k) = self.keys.get(&pk) {
            return k.cell.is_leader_on(self.ctx.world.clocks());
        }
        let pid = self.ctx.world.pid();
        let mut key = Key {
            pubkey: pk,
            m: KeyMachine::new(
                self.ctx.rules,
                Arc::clone(&self.ctx.our_id),
                pid,
                self.ctx.world.here(),
            ),
            cell: Arc::new(KeyCell::new(
                self.ctx.rules.profile.self_fencing,
                Published::initial(pk),
            )),
            store: self.ctx.world.store(&pk),
            next_tick: self.ctx.world.now().mono + self.ctx.rules.refresh,
            watch: None,
            work: WorkMachine::new(self.ctx.rules.profile.ledger, self.ctx.rules.stale),
            ledger: None,
            unwritten: self.left_unwritten.remove(&pk).unwrap_or_default(),
            announcer: Default::default(),
            told_global: false,
            told_locked: false,
            permit: super::global_level::Permit::NOT_HELD,
            global_open: Default::default(),
            global_tenure: 0,
            global: None,
            drain: None,
            drain_replies: Vec::new(),
            withdraw_at: None,
            work_counts: None,
            work_degraded: None,
        };
        key.note_member(&self.ctx);
        if let Some(u) = &self.ctx.global_level {
            key.cell.set_global(cache::global_state::NOT_HELD, 0);
            key.global = Some(GlobalStatus {
                host_id: u.host_id().to_owned(),
                ..GlobalStatus::default()
            });
        }
        let cell = Arc::clone(&key.cell);
        self.ctx
            .shared
            .snapshot
            .update(|m| drop(m.insert(pk, Arc::clone(&cell))));
        key.evaluate(&mut self.ctx, Cause::Join);
        self.keys.insert(pk, key);
        cell.is_leader_on(self.ctx.world.clocks())
    }

    /// Leaves `pk`, releasing the lock if we hold it (once our agent has
    /// stopped, if it runs: `r` is answered then).
    fn leave(&mut self, pk: &AgentPubkey, r: Reply<()>) {
        let Some(key) = self.keys.get_mut(pk) else {
            let _ = r.send(Err(Error::NotJoined(*pk)));
            return;
        };
        let plan = plan(ChangeReason::Released, None, true);
        if let Some(done) = key.step_down_for(&mut self.ctx, plan, Some(DrainReply::Done(r))) {
            if mutated!(Leave) {
                done.answer();
                return;
            }
            if let Some(key) = self.keys.remove(pk) {
                self.forget(key);
            }
            done.answer();
        }
    }

    /// Completes the step-downs that waited for our agent and may go on
    /// now (every one, `now`: at shutdown), and leaves the keys that were
    /// left meanwhile.
    fn finish_drains(&mut self, now: bool) {
        let mut over = Vec::new();
        for (pk, key) in self.keys.iter_mut() {
            key.finish_withdrawal(&mut self.ctx, now);
            if let Some(f) = key.finish_drain(&mut self.ctx, now) {
                over.push((*pk, f));
            }
        }
        for (pk, f) in over {
            if f.departing {
                if let Some(key) = self.keys.remove(&pk) {
                    self.forget(key);
                }
            }
            f.answer();
        }
    }

    /// Drops a key that has stepped down: its watches, its place in the
    /// snapshot and in our presence file.
    fn forget(&mut self, mut key: Key) {
        let unwritten = key.take_unwritten();
        if !unwritten.is_empty() && !mutated!(LeaveDropsLines) {
            self.left_unwritten.insert(key.pubkey, unwritten);
        }
        self.ctx.world.watch_holder(&key.pubkey, None);
        self.ctx.world.unwatch_lock_file(&key.pubkey);
        self.ctx.presence_dirty |= self.ctx.joined.remove(&key.pubkey);
        self.ctx.flush_presence();
        self.ctx
            .shared
            .snapshot
            .update(|m| drop(m.remove(&key.pubkey)));
        key.cell.set_leader(false);
    }

    fn claim_frame(&mut self, pk: &AgentPubkey, target: &str) -> Result<bool> {
        let ctx = &mut self.ctx;
        let key = self.keys.get_mut(pk).ok_or(Error::NotJoined(*pk))?;
        if target == &*ctx.our_id {
            let local = key.claim(ctx)?;
            return Ok(key.claim_global(ctx, local) != ClaimOutcome::Pending);
        }
        if key.m.holds_lock() {
            // Across hosts the relay fans the frame out to every host, but
            // only the claimant's host must give its lock up: elsewhere
            // the claim travels through etcd and the host keeps its leader.
            if ctx.global_level.is_some() && key.heir(ctx, Some(target)).is_none() {
                return Ok(false);
            }
            let plan = plan(ChangeReason::StoodDown, Some(target.to_owned()), false);
            if let Some(done) = key.step_down_for(ctx, plan, None) {
                done.answer();
            }
        }
        Ok(false)
    }

    /// Shuts down whatever happens (a panic while releasing must not keep
    /// the task, and the caller of `shutdown`, waiting) and answers it.
    fn close(&mut self) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.shutdown()));
        if let Some(r) = self.closing.take() {
            let _ = r.send(Ok(()));
        }
    }

    /// Releases every lock we still hold and stops every wake source. A
    /// step-down still waiting for our agent gives the lock up now.
    fn shutdown(&mut self) {
        self.finish_drains(true);
        let keys = std::mem::take(&mut self.keys);
        for (_, mut key) in keys {
            key.step_down(&mut self.ctx, ChangeReason::Released, None, false, true);
            self.forget(key);
        }
        // The last chance for lines the disk refused, those of keys we left
        // before included (a `done` refused by EIO, its key left, the
        // process quit before the next retry; its successor answered the
        // mention again: `seeds_found_beyond_the_budget_stay_fixed`).
        for (pk, u) in self.left_unwritten.iter_mut() {
            work::retry(u, &self.ctx, pk);
        }
        if let Some(u) = self.ctx.global_level.as_mut() {
            u.shutdown();
        }
        self.ctx.world.stop_all();
        self.ctx.presence = None;
    }
}

/// A step-down we chose: its reason and target, and whether we leave the
/// key (its takes are then given back).
fn plan(reason: ChangeReason, target: Option<String>, departing: bool) -> StepDownPlan {
    StepDownPlan {
        reason,
        target,
        always: departing,
        departing,
        nonce: None,
    }
}

/// Runs a store call; a panic in it becomes an error (the store is where
/// foreign content and the platform meet, so that is where one is most
/// likely).
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        Err(Error::io(
            "<store>",
            std::io::Error::other(format!("internal error: {}", panic_message(&panic))),
        ))
    })
}

/// The text of a caught panic.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned())
}
