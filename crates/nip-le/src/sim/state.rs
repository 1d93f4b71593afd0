//! The simulated machine every process of a run shares: virtual time, the
//! lock directory (lock files with `flock` semantics and the epoch mark,
//! lead requests, work ledgers), the process table and the faults in
//! force. No rule of the election lives here: only what a kernel and a
//! filesystem would do.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::control::LeadRequest;
use crate::elector::Command;
use crate::pubkey::AgentPubkey;
use crate::record::LockContent;

use super::check::{Invariant, Violation};

/// Index of a process in [`State::procs`].
pub type ProcId = usize;

/// One lock file, `<pubkey>.lock`, and the epoch mark beside it.
#[derive(Debug, Default, Clone)]
pub struct LockFile {
    /// Its bytes (empty: absent or truncated).
    pub bytes: Vec<u8>,
    /// Whether the file exists.
    pub exists: bool,
    /// Until when a peer holds the file's `flock` (a hung harness, or one
    /// halfway through its in-place write).
    pub held_until: u64,
    /// The second half of a harness's in-place write (truncate, then
    /// write): these bytes land when its `flock` is released.
    pub pending: Option<Vec<u8>>,
    /// The epoch mark (`<pubkey>.epoch`).
    pub mark: crate::epoch::Mark,
}

impl LockFile {
    /// What a reader sees.
    pub fn content(&self) -> LockContent {
        if !self.exists {
            LockContent::Absent
        } else {
            LockContent::parse(&self.bytes)
        }
    }
}

/// What kind of participant a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One of our windows (the real writer).
    Window {
        /// Extensions on.
        extended: bool,
    },
    /// The NIP's own writer (Buzz's branch harness).
    Harness,
    /// An unrelated process that took a recycled pid.
    Squatter,
}

/// One process.
pub struct Proc {
    /// Its pid.
    pub pid: u32,
    /// Its instance id.
    pub instance_id: String,
    /// What it is.
    pub kind: Kind,
    /// Not killed or exited.
    pub alive: bool,
    /// When it started (virtual ns).
    pub started: u64,
    /// SIGSTOPped (or starved of CPU entirely) until then.
    pub stopped_until: u64,
    /// Its presence token while it holds its presence lock.
    pub token: Option<String>,
    /// The keys its presence lists.
    pub presence_keys: Vec<AgentPubkey>,
    /// Commands waiting for its next round.
    pub inbox: Vec<Command>,
    /// Keys a wake-up named, for its next round.
    pub wake_keys: BTreeSet<AgentPubkey>,
    /// Lock files it watches (extended windows).
    pub watch_files: BTreeSet<AgentPubkey>,
    /// Per key, the holder token whose death it watches.
    pub holder_watch: BTreeMap<AgentPubkey, String>,
    /// Keys it has left (nothing of it may be written there again).
    pub left: BTreeSet<AgentPubkey>,
    /// Mentions it answered whose `done` line is not on disk yet, with when
    /// the reply was sent (virtual ns): a second answer is forced by the
    /// disk if it had no round since in which the disk took writes.
    pub unwritten_done: BTreeMap<String, u64>,
    /// Its latest round while the disk took writes.
    pub writable_round_at: u64,
}

impl Proc {
    /// A new running process.
    pub fn new(pid: u32, instance_id: String, kind: Kind) -> Self {
        Self {
            pid,
            instance_id,
            kind,
            alive: true,
            started: 0,
            stopped_until: 0,
            token: None,
            presence_keys: Vec::new(),
            unwritten_done: BTreeMap::new(),
            writable_round_at: 0,
            inbox: Vec::new(),
            wake_keys: BTreeSet::new(),
            watch_files: BTreeSet::new(),
            holder_watch: BTreeMap::new(),
            left: BTreeSet::new(),
        }
    }

    /// Alive and not stopped at `t`.
    pub fn running(&self, t: u64) -> bool {
        self.alive && self.stopped_until <= t
    }

    /// Whether it is an extended window.
    pub fn extended(&self) -> bool {
        matches!(self.kind, Kind::Window { extended: true })
    }
}

/// Filesystem faults in force (virtual ns deadlines).
#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// Writes fail with ENOSPC until then.
    pub enospc_until: u64,
    /// The disk filled during a write that it took only in part: the next
    /// refused write leaves a fragment, and every one after it nothing (a
    /// full disk has no room for more fragments). Set when the fault starts.
    pub enospc_room: bool,
    /// Reads and writes fail with EIO until then.
    pub eio_until: u64,
    /// The directory is read-only until then.
    pub readonly_until: u64,
}

/// The clocks every process of the machine reads: the monotonic clock
/// (stands still while the machine is suspended) and the boot clock.
#[derive(Debug, Clone, Default)]
pub struct SimClocks {
    mono: Arc<AtomicU64>,
    boot: Arc<AtomicU64>,
}

impl SimClocks {
    /// Sets both clocks (nanoseconds since the run began).
    pub fn set(&self, mono: u64, boot: u64) {
        self.mono.store(mono, Ordering::Relaxed);
        self.boot.store(boot, Ordering::Relaxed);
    }
}

impl crate::elector::cache::Clocks for SimClocks {
    fn boot_nanos(&self) -> u64 {
        self.boot.load(Ordering::Relaxed)
    }
}

/// The machine.
pub struct State {
    /// The machine's host name.
    pub host: String,
    /// Virtual nanoseconds since the run began.
    pub t: u64,
    /// What the monotonic clock lost to suspends.
    pub mono_lag: u64,
    /// Wall clock steps, in nanoseconds (either sign).
    pub wall_offset: i128,
    /// The origin of every process's monotonic clock.
    pub base: Instant,
    /// The wall clock at the start.
    pub wall0: SystemTime,
    /// The shared clocks.
    pub clocks: SimClocks,
    /// How long one acquire waits for the `flock`.
    pub lock_wait: u64,
    /// Lock files.
    pub files: BTreeMap<AgentPubkey, LockFile>,
    /// Lead requests (`<pubkey>.claim`).
    pub requests: BTreeMap<AgentPubkey, LeadRequest>,
    /// Work ledgers (`<pubkey>.work`).
    pub ledgers: BTreeMap<AgentPubkey, Vec<u8>>,
    /// Which file each ledger is: counts its rewrites (a file renamed over
    /// it), as a real one's inode tells.
    pub ledger_files: BTreeMap<AgentPubkey, u64>,
    /// How much of each ledger is on disk (synced): a power loss keeps
    /// that, and perhaps part of the rest.
    pub ledger_synced: BTreeMap<AgentPubkey, usize>,
    /// The largest any ledger grew, bytes.
    pub ledger_peak: usize,
    /// The sizes the ledgers keep to ([`crate::sim::Options::ledger_budget`]).
    pub ledger_limits: crate::ledger::Limits,
    /// Windows whose `held` line the disk refused, none of theirs taken
    /// since: a harness child's record naming one reads to a successor as
    /// a writer's without a ledger (see [`State::unkept_replaced`]).
    pub unkept: BTreeSet<String>,
    /// Windows a `held` line on disk names: a harness child's record
    /// naming any other reads to a successor as a writer's without a
    /// ledger too (its window never held: it was paused, or killed, when
    /// its child took the lock).
    pub kept: BTreeSet<String>,
    /// When a record with an epoch replaced one without, naming a window
    /// of [`State::unkept`] or not of [`State::kept`] that was gone: from
    /// then on the new holder owes only what is published after it
    /// (virtual ns), since that writer may have answered the rest (Buzz's
    /// harness drains its backlog when it gains). A mention published
    /// before and never answered is counted, not failed.
    pub unkept_replaced: Vec<u64>,
    /// Every process ever started.
    pub procs: Vec<Proc>,
    /// Pids of processes that exited, which an unrelated process may take.
    pub next_pid: u32,
    /// Faults in force.
    pub faults: Faults,
    /// Processes that must run a round soon: (process, at).
    pub wakeups: Vec<(ProcId, u64)>,
    /// Per key, the highest epoch written and the holder it named.
    pub epochs: BTreeMap<AgentPubkey, (u64, String)>,
    /// What went wrong (the first one ends the run).
    pub violations: Vec<Violation>,
    /// Holder changes per key, as the file shows them (a record naming
    /// another instance than the last one).
    pub holder_changes: u64,
    /// Last holder per key.
    pub last_holder: BTreeMap<AgentPubkey, String>,
}

impl State {
    /// A new machine at time 0, for a run of `opts`.
    pub fn new(opts: &super::Options) -> Self {
        Self {
            host: "sim".into(),
            t: 0,
            mono_lag: 0,
            wall_offset: 0,
            base: Instant::now(),
            wall0: SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000),
            clocks: SimClocks::default(),
            lock_wait: opts.lock_wait.as_nanos() as u64,
            files: BTreeMap::new(),
            requests: BTreeMap::new(),
            ledgers: BTreeMap::new(),
            ledger_files: BTreeMap::new(),
            ledger_synced: BTreeMap::new(),
            ledger_peak: 0,
            ledger_limits: opts.ledger_limits(),
            unkept: BTreeSet::new(),
            kept: BTreeSet::new(),
            unkept_replaced: Vec::new(),
            procs: Vec::new(),
            next_pid: 1000,
            faults: Faults::default(),
            wakeups: Vec::new(),
            epochs: BTreeMap::new(),
            violations: Vec::new(),
            holder_changes: 0,
            last_holder: BTreeMap::new(),
        }
    }

    /// The monotonic clock now, in nanoseconds.
    pub fn mono(&self) -> u64 {
        self.t.saturating_sub(self.mono_lag)
    }

    /// Moves time to `t` and the clocks with it.
    pub fn advance(&mut self, t: u64) {
        self.t = self.t.max(t);
        self.clocks.set(self.mono(), self.t);
    }

    /// The wall clock now.
    pub fn wall(&self) -> SystemTime {
        let ns = self.t as i128 + self.wall_offset;
        if ns >= 0 {
            self.wall0 + Duration::from_nanos(ns as u64)
        } else {
            self.wall0 - Duration::from_nanos((-ns) as u64)
        }
    }

    /// The monotonic instant of `mono` nanoseconds.
    pub fn instant(&self, mono: u64) -> Instant {
        self.base + Duration::from_nanos(mono)
    }

    /// The virtual time at which the monotonic clock shows `i`.
    pub fn t_of(&self, i: Instant) -> u64 {
        let mono = i.saturating_duration_since(self.base).as_nanos() as u64;
        mono + self.mono_lag
    }

    /// A fresh pid.
    pub fn fresh_pid(&mut self) -> u32 {
        self.next_pid += 1;
        self.next_pid
    }

    /// Whether a process with `pid` runs (any kind, stopped or not).
    pub fn pid_alive(&self, pid: u32) -> bool {
        self.procs.iter().any(|p| p.alive && p.pid == pid)
    }

    /// Wakes every extended window watching `pk` (a write, a request).
    pub fn file_event(&mut self, pk: &AgentPubkey, delay: u64) {
        let at = self.t + delay;
        for (i, p) in self.procs.iter_mut().enumerate() {
            if p.alive && p.extended() && p.watch_files.contains(pk) {
                p.wake_keys.insert(*pk);
                self.wakeups.push((i, at));
            }
        }
    }

    /// The holder with `token` is gone: wake whoever watched it.
    pub fn holder_gone(&mut self, token: &str, delay: u64) {
        let at = self.t + delay;
        for (i, p) in self.procs.iter_mut().enumerate() {
            let keys: Vec<AgentPubkey> = p
                .holder_watch
                .iter()
                .filter(|(_, t)| t.as_str() == token)
                .map(|(k, _)| *k)
                .collect();
            for k in keys {
                p.holder_watch.remove(&k);
                if p.alive {
                    p.wake_keys.insert(k);
                    self.wakeups.push((i, at));
                }
            }
        }
    }

    /// Notes a lock file write (for the epoch and holder-change checks).
    pub fn wrote(&mut self, pk: &AgentPubkey, by: ProcId) {
        let content = self.files.get(pk).map(LockFile::content);
        let Some(LockContent::Record(r)) = content else {
            return;
        };
        if self.last_holder.get(pk) != Some(&r.instance_id) {
            self.holder_changes += 1;
            self.last_holder.insert(*pk, r.instance_id.clone());
        }
        let Some(e) = r.epoch else {
            return;
        };
        match self.epochs.get(pk) {
            Some((max, _)) if e < *max => self.violations.push(Violation::new(
                self.t,
                Invariant::EpochWentBackwards,
                format!("{} wrote epoch {e} after {max}", self.procs[by].instance_id),
            )),
            Some((max, holder)) if e == *max && *holder != r.instance_id => {
                let what = format!("epoch {e} named {holder}, then {}", r.instance_id);
                self.violations
                    .push(Violation::new(self.t, Invariant::EpochIssuedTwice, what));
            }
            _ => {
                self.epochs.insert(*pk, (e, r.instance_id.clone()));
            }
        }
    }
}
