//! The hot path: what `is_leader` reads. The writer publishes; readers do an
//! atomic load or two and, in extended mode, a clock read for
//! self-fencing (through the vDSO on Linux). No lock, no syscall, no
//! allocation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;

use crate::pubkey::AgentPubkey;

use super::types::{ElectionStatus, Level};

/// `valid_until` meaning "no self-fencing" (spec mode, or a fail-safe
/// leader that holds no lock).
pub(crate) const ALWAYS_VALID: u64 = u64::MAX;

/// Nanoseconds on `clock`.
#[cfg(unix)]
fn clock_nanos(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Nanoseconds on a clock that keeps running while the machine sleeps, for
/// every deadline we act under (self-fencing and the cross-host lease):
/// time runs on for the others while a laptop is suspended (a harness
/// judges our record by its wall-clock `claimed_at`, etcd counts the
/// lease down), so our validity must be counted as spent then too (the
/// simulator: a holder that woke from a 26 s suspend granted a take while
/// its window's harness child, by the NIP's rules, had taken the lock).
#[cfg(target_os = "linux")]
pub(crate) fn boot_nanos() -> u64 {
    clock_nanos(libc::CLOCK_BOOTTIME)
}

/// See the Linux variant: macOS's `CLOCK_MONOTONIC` runs on while the
/// machine sleeps (`CLOCK_UPTIME_RAW`, which `Instant` reads, does not).
#[cfg(all(unix, not(target_os = "linux")))]
pub(crate) fn boot_nanos() -> u64 {
    clock_nanos(libc::CLOCK_MONOTONIC)
}

/// See the Linux variant: the tick count runs on while the machine sleeps
/// (at the timer's resolution, about 16 ms: well inside the validity's
/// margin).
#[cfg(windows)]
pub(crate) fn boot_nanos() -> u64 {
    // SAFETY: no arguments, no state.
    let ms = unsafe { windows_sys::Win32::System::SystemInformation::GetTickCount64() };
    ms.saturating_mul(1_000_000)
}

/// The clock the hot path compares deadlines with: the real ones in
/// an app ([`SystemClocks`]), virtual ones in the simulator.
pub(crate) trait Clocks {
    /// See [`boot_nanos`].
    fn boot_nanos(&self) -> u64;
}

/// The process's real clocks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemClocks;

impl Clocks for SystemClocks {
    #[inline]
    fn boot_nanos(&self) -> u64 {
        boot_nanos()
    }
}

/// Whether a global level (etcd) is configured for a key, and what it says.
pub(crate) mod global_state {
    /// No global level: leading the host is enough.
    pub const OFF: u8 = 0;
    /// Etcd is configured and we do not hold the agent's lease.
    pub const NOT_HELD: u8 = 1;
    /// We hold the lease until `global_until`.
    pub const HELD: u8 = 2;
    /// Etcd cannot be reached and the policy is to act on the host level.
    pub const FALLBACK: u8 = 3;
}

/// The published state of one key: the leader flag, its validity (the
/// self-fencing deadline) and the last status snapshot.
#[derive(Debug)]
pub(crate) struct KeyCell {
    leader: AtomicBool,
    valid_until: AtomicU64,
    /// The global level's permit: `ALWAYS_VALID` without one (or in
    /// fallback), 0 when not held, else a [`boot_nanos`] deadline. Written
    /// only by the global level's task.
    global_until: AtomicU64,
    /// One of [`global_state`].
    global_state: AtomicU8,
    status: ArcSwap<Published>,
}

/// A status snapshot and the holder's `claimed_at`, so that the holder's
/// age is computed when the status is read, not when it was published.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub(crate) status: ElectionStatus,
    pub(crate) claimed_at: Option<SystemTime>,
    pub(crate) standing_down_until: Option<Instant>,
    pub(crate) claim_pending_until: Option<Instant>,
}

impl Published {
    /// Before the first look.
    pub(crate) fn initial(pubkey: AgentPubkey) -> Self {
        Self {
            status: ElectionStatus {
                pubkey,
                is_leader: false,
                lock_state: super::types::LockState::Absent,
                holder: None,
                standing_down: false,
                claim_pending: false,
                last_error: None,
                level: Level::None,
                global: None,
                work: None,
                work_degraded: None,
            },
            claimed_at: None,
            standing_down_until: None,
            claim_pending_until: None,
        }
    }
}

impl KeyCell {
    /// A key not led yet. An extended key starts fenced: its first
    /// successful write validates it.
    pub(crate) fn new(extended: bool, status: Published) -> Self {
        Self {
            leader: AtomicBool::new(false),
            valid_until: AtomicU64::new(if extended { 0 } else { ALWAYS_VALID }),
            global_until: AtomicU64::new(ALWAYS_VALID),
            global_state: AtomicU8::new(global_state::OFF),
            status: ArcSwap::from_pointee(status),
        }
    }

    /// The cached answer: leader, and not past its self-fencing deadline.
    #[inline]
    pub(crate) fn is_leader(&self) -> bool {
        self.is_leader_on(&SystemClocks)
    }

    /// [`KeyCell::is_leader`] on `clocks` (the writer's world: the real
    /// clocks, or the simulator's). A clock is read only when a deadline
    /// is set.
    #[inline]
    pub(crate) fn is_leader_on(&self, clocks: &(impl Clocks + ?Sized)) -> bool {
        if !self.leader.load(Ordering::Acquire) {
            return false;
        }
        let until = self.valid_until.load(Ordering::Acquire);
        if until != ALWAYS_VALID && clocks.boot_nanos() >= until {
            return false;
        }
        let global = self.global_until.load(Ordering::Acquire);
        global == ALWAYS_VALID || clocks.boot_nanos() < global
    }

    /// The flag as the writer set it, fenced or not.
    pub(crate) fn is_set_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    /// We lead our host and are not past the self-fencing deadline (the
    /// global level's permit aside).
    pub(crate) fn host_valid_on(&self, clocks: &(impl Clocks + ?Sized)) -> bool {
        let until = self.valid_until.load(Ordering::Acquire);
        self.is_set_leader() && (until == ALWAYS_VALID || clocks.boot_nanos() < until)
    }

    /// The level we hold, as [`KeyCell::is_leader`] says it now.
    pub(crate) fn level(&self) -> Level {
        self.level_on(&SystemClocks)
    }

    /// [`KeyCell::level`] on `clocks`.
    pub(crate) fn level_on(&self, clocks: &(impl Clocks + ?Sized)) -> Level {
        if !self.leader.load(Ordering::Acquire) {
            return Level::None;
        }
        let held = self.global_state.load(Ordering::Acquire) == global_state::HELD;
        if held && self.is_leader_on(clocks) {
            Level::Global
        } else {
            Level::Host
        }
    }

    /// The global level's verdict: one of [`global_state`] and, for `HELD`,
    /// the [`boot_nanos`] deadline of the lease.
    pub(crate) fn set_global(&self, state: u8, until: u64) {
        let until = match state {
            global_state::OFF | global_state::FALLBACK => ALWAYS_VALID,
            global_state::HELD => until.min(ALWAYS_VALID - 1),
            _ => 0,
        };
        // Closing comes first, opening last: no reader sees a permit that
        // the state does not back.
        if until == 0 {
            self.global_until.store(0, Ordering::Release);
        }
        self.global_state.store(state, Ordering::Release);
        self.global_until.store(until, Ordering::Release);
    }

    /// How long until the self-fencing deadline, while we lead and one is
    /// set (`None`: not leading, or never fenced).
    pub(crate) fn fences_in(&self, clocks: &(impl Clocks + ?Sized)) -> Option<Duration> {
        if !self.leader.load(Ordering::Acquire) {
            return None;
        }
        let until = self.valid_until.load(Ordering::Acquire);
        let host = (until != ALWAYS_VALID)
            .then(|| Duration::from_nanos(until.saturating_sub(clocks.boot_nanos())));
        let global = self.global_until.load(Ordering::Acquire);
        let global = (global != ALWAYS_VALID)
            .then(|| Duration::from_nanos(global.saturating_sub(clocks.boot_nanos())));
        match (host, global) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sets the flag; returns the previous value.
    pub(crate) fn set_leader(&self, leader: bool) -> bool {
        self.leader.swap(leader, Ordering::AcqRel)
    }

    /// Fenced until renewed.
    pub(crate) fn fence(&self) {
        self.valid_until.store(0, Ordering::Release);
    }

    /// Never fenced.
    pub(crate) fn never_fence(&self) {
        self.valid_until.store(ALWAYS_VALID, Ordering::Release);
    }

    /// Valid for `d` from `from` (a [`boot_nanos`] instant).
    pub(crate) fn renew_from(&self, from: u64, d: Duration) {
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let until = from.saturating_add(d).min(ALWAYS_VALID - 1);
        self.valid_until.store(until, Ordering::Release);
    }

    /// Publishes a new status snapshot.
    pub(crate) fn publish(&self, status: Published) {
        self.status.store(Arc::new(status));
    }

    /// The last published snapshot, with `is_leader` as the hot path says
    /// it now (so the two can never disagree) and the holder's age as of
    /// `now`.
    pub(crate) fn status(&self, now: SystemTime) -> ElectionStatus {
        let p = self.status.load();
        let mut s = p.status.clone();
        s.is_leader = self.is_leader();
        s.level = self.level();
        let mono = Instant::now();
        s.standing_down = p.standing_down_until.is_some_and(|u| u > mono);
        s.claim_pending = p.claim_pending_until.is_some_and(|u| u > mono);
        if let (Some(h), Some(t)) = (s.holder.as_mut(), p.claimed_at) {
            h.age_ms = Some(match now.duration_since(t) {
                Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
                Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
            });
        }
        s
    }
}

/// Zero-cost view of one key's cached leadership, for hot paths (the
/// dispatch, 👀 and heartbeat checks).
#[derive(Debug, Clone)]
pub struct LeaderFlag(pub(crate) Arc<KeyCell>);

impl LeaderFlag {
    /// The cached answer: atomic loads and, in extended mode, a monotonic
    /// clock read (vDSO, no syscall); no allocation.
    #[inline]
    pub fn is_leader(&self) -> bool {
        self.0.is_leader()
    }
}

/// Hashes an [`AgentPubkey`] by folding its first 16 bytes: keys are random
/// hex (16 hex digits are 64 random bits) and a process joins a handful, so
/// SipHash's protection buys nothing and costs most of a lookup.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(2) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(w))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29);
        }
    }
}

/// The joined keys as readers see them. Replaced whole by the writer on
/// join and leave (rare); read with one atomic load.
pub(crate) type KeyMap =
    HashMap<AgentPubkey, Arc<KeyCell>, std::hash::BuildHasherDefault<KeyHasher>>;

/// The snapshot every reader loads.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    keys: ArcSwap<KeyMap>,
}

impl Snapshot {
    /// The cell of `pubkey`, if joined.
    #[inline]
    pub(crate) fn get(&self, pubkey: &AgentPubkey) -> Option<Arc<KeyCell>> {
        self.keys.load().get(pubkey).cloned()
    }

    /// `is_leader` without cloning the cell's `Arc`.
    #[inline]
    pub(crate) fn is_leader(&self, pubkey: &AgentPubkey) -> bool {
        self.keys.load().get(pubkey).is_some_and(|c| c.is_leader())
    }

    /// Every joined key, ordered.
    pub(crate) fn keys(&self) -> Vec<AgentPubkey> {
        let mut v: Vec<_> = self.keys.load().keys().copied().collect();
        v.sort();
        v
    }

    /// Every key's status, ordered by pubkey.
    pub(crate) fn statuses(&self) -> Vec<ElectionStatus> {
        let map = self.keys.load();
        let now = SystemTime::now();
        let mut v: Vec<_> = map.values().map(|c| c.status(now)).collect();
        v.sort_by_key(|s| s.pubkey);
        v
    }

    /// Writer only: adds or removes a key.
    pub(crate) fn update(&self, f: impl FnOnce(&mut KeyMap)) {
        let mut next = KeyMap::clone(&self.keys.load());
        f(&mut next);
        self.keys.store(Arc::new(next));
    }
}
