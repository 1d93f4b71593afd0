//! The elector: one process's participation in the elections of many agent
//! keys, with a refresh thread, a lock-free leadership cache and change
//! notifications.
//!
//! Per key, on join and on every refresh tick (NIP-LE): honour a local claim
//! request aimed at someone else (stand down), then acquire under the
//! exclusive lock (which rewrites `claimed_at` while we hold it), then update
//! the cache from what the locked read saw. When no acquire ran (standing
//! down, or the lock could not be had in time) the cache comes from the
//! unguarded read side, which fails safe to leader.
//!
//! Two deliberate refinements of the letter of the NIP, both documented in
//! the README:
//! * An instance that is standing down (or has released) is never the leader
//!   in its own cache, even though the emptied file would read as "leader" —
//!   otherwise the step-down would keep prompting.
//! * While a fresh local claim request names another instance, we do not
//!   take a free lock that is not already ours, and an emptied file does not
//!   make us a fail-safe leader: the intended target, not a bystander, wins
//!   the released lock, and nobody prompts twice meanwhile. The request
//!   expires after the stand-down timeout, so this can never wedge an
//!   election (worst case: no leader for that long, as the NIP allows).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::config::{Config, Mode};
use crate::control::{self, ClaimRequest, ControlFrame, ControlResult};
use crate::election::{self, claim_age, ClaimAge, TakeReason, Takeable};
use crate::error::{Error, Result};
use crate::identity::InstanceId;
use crate::liveness;
use crate::lockfile::{self, LockedFile};
use crate::presence::{self, Presence};
use crate::pubkey::AgentPubkey;
use crate::record::{encode_record, format_claimed_at, LockContent, LockRecord, RecordExt};

/// Why this instance's view of a key's leadership changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeReason {
    /// We took a free lock (absent, empty/released, or malformed).
    Acquired,
    /// We took over the claim of a dead or stale holder.
    Failover,
    /// We asked to lead (claim or `claim_leadership` frame) and now hold the
    /// lock: send the `control_result` if the claim came from the relay.
    Claimed,
    /// We lead only because the lock file cannot be read as a record and we
    /// could not write it (fail-safe rule).
    FailSafe,
    /// First view after joining: another instance holds a live claim.
    Observer,
    /// Another instance holds the lock now.
    Lost,
    /// We stood down for another instance's claim. Hard-steal: cancel the
    /// in-flight turn now.
    StoodDown,
    /// We released the lock (explicitly, on leave or on shutdown).
    Released,
    /// Extension: the previous leader handed the lock straight to us
    /// (graceful exit, or its stand-down for a claim that named us).
    HandedOver,
}

impl ChangeReason {
    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeReason::Acquired => "acquired",
            ChangeReason::Failover => "failover",
            ChangeReason::Claimed => "claimed",
            ChangeReason::FailSafe => "fail_safe",
            ChangeReason::Observer => "observer",
            ChangeReason::Lost => "lost",
            ChangeReason::StoodDown => "stood_down",
            ChangeReason::Released => "released",
            ChangeReason::HandedOver => "handed_over",
        }
    }

    /// Whether the window must abort its in-flight agent turn (NIP-LE
    /// hard-steal, via NIP-AO `cancel_turn`).
    pub fn must_cancel_turn(self) -> bool {
        matches!(self, ChangeReason::StoodDown)
    }
}

/// One change of this instance's view of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeadershipChange {
    /// The agent key.
    pub pubkey: AgentPubkey,
    /// Whether we are the prompter now.
    pub is_leader: bool,
    /// Why.
    pub reason: ChangeReason,
    /// The holder named by the lock file, when it names one.
    pub leader_instance_id: Option<String>,
    /// Extension: the holder's fencing epoch, when its record carries one.
    /// It grows with every change of holder: tag work started as leader with
    /// it and check it before acting on the work's result.
    pub epoch: Option<u64>,
    /// Wall-clock time of the change, unix milliseconds.
    pub at_ms: u64,
}

/// Result of [`Elector::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimOutcome {
    /// We already held the lock.
    AlreadyLeader,
    /// We hold the lock now.
    Claimed,
    /// The current holder has been asked to stand down; refresh ticks keep
    /// trying until the stand-down timeout.
    Pending,
}

/// The holder named by a lock record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HolderStatus {
    /// Holder's election id.
    pub instance_id: String,
    /// Holder's pid.
    pub pid: u32,
    /// `claimed_at` as RFC 3339 when it parsed.
    pub claimed_at: Option<String>,
    /// Milliseconds since `claimed_at` (negative when in the future).
    pub age_ms: Option<i64>,
    /// Whether the holder is this instance.
    pub is_us: bool,
}

/// A snapshot of one key's election, for UIs and `status` commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ElectionStatus {
    /// The agent key.
    pub pubkey: AgentPubkey,
    /// The cached answer.
    pub is_leader: bool,
    /// The lock file.
    pub lock_path: PathBuf,
    /// What the file held at the last look: `record`, `absent`, `empty`,
    /// `malformed`, `oversized` or `unreadable`.
    pub lock_state: &'static str,
    /// The holder, when the file names one.
    pub holder: Option<HolderStatus>,
    /// Whether we are standing down (acquire suppressed).
    pub standing_down: bool,
    /// Whether a claim of ours is waiting for the holder to stand down.
    pub claim_pending: bool,
    /// The last error met while refreshing, if the last refresh failed.
    pub last_error: Option<String>,
}

/// Zero-cost view of one key's cached leadership, for hot paths.
#[derive(Debug, Clone)]
pub struct LeaderFlag(Arc<KeyState>);

impl LeaderFlag {
    /// The cached answer: atomic loads and, in extended mode, a monotonic
    /// clock read (vDSO, no syscall); no allocation.
    #[inline]
    pub fn is_leader(&self) -> bool {
        self.0.is_leader()
    }
}

/// Monotonic nanoseconds. It stands still while the machine sleeps, so a
/// slept leader is not fenced for having slept. On Linux the coarse clock
/// (a few ns through the vDSO, millisecond resolution, plenty for a bound
/// counted in seconds) keeps `is_leader` cheap.
#[cfg(target_os = "linux")]
fn mono_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(not(target_os = "linux"))]
fn mono_nanos() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Hashes an [`AgentPubkey`] by folding its bytes: keys are random hex, so
/// SipHash's protection buys nothing and costs most of a lookup.
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(w))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29);
        }
    }
}

type KeyMap = HashMap<AgentPubkey, Arc<KeyState>, std::hash::BuildHasherDefault<KeyHasher>>;

/// `valid_until` value meaning "no self-fencing" (spec mode).
const ALWAYS_VALID: u64 = u64::MAX;

#[derive(Debug)]
struct KeyState {
    pubkey: AgentPubkey,
    lock_path: PathBuf,
    claim_path: PathBuf,
    leader: AtomicBool,
    /// Extension (self-fencing): the cache counts only until this monotonic
    /// instant, pushed forward by every successful refresh. A leader that
    /// went longer than the stale bound without one (it was stopped, or its
    /// disk hung) acts on nothing until it re-validates.
    valid_until: AtomicU64,
    /// Extension: our presence lock in this election.
    presence: Mutex<Option<Presence>>,
    /// Presence tokens of holders a thread is waiting on (death signal).
    watched: Mutex<HashSet<String>>,
    m: Mutex<KeyMut>,
}

impl KeyState {
    #[inline]
    fn is_leader(&self) -> bool {
        if !self.leader.load(Ordering::Acquire) {
            return false;
        }
        let until = self.valid_until.load(Ordering::Acquire);
        until == ALWAYS_VALID || mono_nanos() < until
    }

    fn token(&self) -> Option<String> {
        lock(&self.presence).as_ref().map(|p| p.token().to_owned())
    }
}

#[derive(Debug, Default)]
struct KeyMut {
    stand_down_until: Option<Instant>,
    /// Our own outstanding claim: expiry, and the nonce of our local
    /// request once written.
    pending: Option<(Instant, Option<String>)>,
    /// Nonce of the last local request we stood down for.
    honoured: Option<String>,
    /// The nonce of the request the current stand-down serves, if any.
    stood_down_for: Option<String>,
    /// Whether the last look showed a record naming us.
    holds_lock: bool,
    observed: Option<std::result::Result<LockContent, String>>,
    last_error: Option<String>,
    /// Extension: the last record seen and since when (our monotonic clock)
    /// it has not changed, to tell a hung holder from a slept machine.
    seen: Option<(LockRecord, Instant)>,
    /// Highest fencing epoch seen for this key.
    epoch: u64,
}

struct Inner {
    config: Config,
    id: InstanceId,
    pid: u32,
    keys: RwLock<KeyMap>,
    events: broadcast::Sender<LeadershipChange>,
    shut: AtomicBool,
    /// Wakes the refresh thread: `Some(key)` re-reads one key now, `None`
    /// just checks for shutdown.
    wake: mpsc::Sender<Option<AgentPubkey>>,
}

/// Participation of this process in the elections of many agent keys.
///
/// Dropping it (or calling [`Elector::shutdown`]) releases every lock it
/// holds.
pub struct Elector {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("instance_id", &self.inner.id)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not turn every later call into a panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Elector {
    /// Validates `config` and starts the refresh thread. `id` is this
    /// window's election id (see [`InstanceId::from_env_or_random`]).
    pub fn start(config: Config, id: InstanceId) -> Result<Self> {
        config.validate()?;
        let (events, _) = broadcast::channel(1024);
        let (tx, rx) = mpsc::channel::<Option<AgentPubkey>>();
        if config.mode == Mode::Extended {
            watch_lock_dir(&config.lock_dir, tx.clone());
        }
        let inner = Arc::new(Inner {
            config,
            id,
            pid: liveness::current_pid(),
            keys: RwLock::new(KeyMap::default()),
            events,
            shut: AtomicBool::new(false),
            wake: tx,
        });
        let worker = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("nip-le-refresh".into())
            .spawn(move || worker.refresh_loop(rx))
            .map_err(|e| Error::io("<refresh thread>", e))?;
        Ok(Self {
            inner,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// This window's election id: pass it to spawned agent processes in
    /// `BUZZ_INSTANCE_ELECTION_ID`.
    pub fn instance_id(&self) -> &InstanceId {
        &self.inner.id
    }

    /// The validated configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Subscribes to every later [`LeadershipChange`]. A receiver that falls
    /// more than 1024 changes behind gets `Lagged` and should re-read
    /// [`Elector::status`].
    pub fn subscribe(&self) -> broadcast::Receiver<LeadershipChange> {
        self.inner.events.subscribe()
    }

    /// Joins the election for `pubkey` and claims at once (auto-claim on
    /// launch). Returns the resulting leadership. Joining twice is a no-op.
    pub fn join(&self, pubkey: &AgentPubkey) -> Result<bool> {
        self.inner.check_open()?;
        let dir = &self.inner.config.lock_dir;
        // A lock directory we cannot create is the NIP's fail-safe case (we
        // lead, and say why in `last_error`), not a reason to refuse to run.
        if let Err(e) = lockfile::ensure_dir(dir) {
            tracing::warn!("lock directory unusable, failing safe to leader: {e}");
        }
        let ks = {
            let mut keys = self.inner.keys.write().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = keys.get(pubkey) {
                return Ok(k.is_leader());
            }
            let presence = match self.inner.config.mode {
                // Without a presence (full disk, read-only directory) we still
                // take part, by the NIP's rules: our records then carry no
                // token and peers judge them by pid and claimed_at.
                Mode::Extended => match Presence::create(dir, pubkey, self.inner.id.as_str()) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        tracing::warn!(pubkey = %pubkey, "no presence lock, NIP rules only: {e}");
                        None
                    }
                },
                Mode::Spec => None,
            };
            let ks = Arc::new(KeyState {
                pubkey: *pubkey,
                lock_path: lockfile::lock_path(dir, pubkey),
                claim_path: control::claim_request_path(dir, pubkey),
                leader: AtomicBool::new(false),
                valid_until: AtomicU64::new(match self.inner.config.mode {
                    Mode::Extended => 0,
                    Mode::Spec => ALWAYS_VALID,
                }),
                presence: Mutex::new(presence),
                watched: Mutex::new(HashSet::new()),
                m: Mutex::new(KeyMut::default()),
            });
            keys.insert(*pubkey, Arc::clone(&ks));
            ks
        };
        let mut m = lock(&ks.m);
        self.inner.evaluate(&ks, &mut m, Eval::Initial);
        Ok(ks.is_leader())
    }

    /// Leaves the election for `pubkey`, releasing the lock if we hold it.
    pub fn leave(&self, pubkey: &AgentPubkey) -> Result<()> {
        let ks = self
            .inner
            .keys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(pubkey)
            .ok_or(Error::NotJoined(*pubkey))?;
        let mut m = lock(&ks.m);
        self.inner
            .stop_and_release(&ks, &mut m, ChangeReason::Released, true, None);
        lock(&ks.presence).take();
        Ok(())
    }

    /// The keys joined, in no particular order.
    pub fn joined(&self) -> Vec<AgentPubkey> {
        self.inner
            .keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// The cached answer for `pubkey`: no syscall, no allocation. `false`
    /// for a key that was never joined (use [`Elector::leader_flag`] on hot
    /// paths to skip even the map lookup).
    #[inline]
    pub fn is_leader(&self, pubkey: &AgentPubkey) -> bool {
        self.inner
            .keys
            .read()
            .map(|k| k.get(pubkey).is_some_and(|k| k.is_leader()))
            .unwrap_or(false)
    }

    /// A handle whose [`LeaderFlag::is_leader`] is a single atomic load.
    pub fn leader_flag(&self, pubkey: &AgentPubkey) -> Result<LeaderFlag> {
        Ok(LeaderFlag(self.inner.key(pubkey)?))
    }

    /// "This instance wants to lead" (the sidebar's claim). Co-located
    /// instances learn it through the local claim request, without a relay:
    /// the holder stands down on its next refresh and we take the lock on
    /// ours. Never evicts a live leader by force.
    pub fn claim(&self, pubkey: &AgentPubkey) -> Result<ClaimOutcome> {
        self.inner.check_open()?;
        let ks = self.inner.key(pubkey)?;
        let mut m = lock(&ks.m);
        self.inner.claim_locked(&ks, &mut m)
    }

    /// Releases the lock if the file names us (truncation under the lock;
    /// never a successor's claim) and stands down, so our own next tick does
    /// not take it straight back. Returns whether a claim of ours was
    /// released. The stand-down expires like any other.
    pub fn release(&self, pubkey: &AgentPubkey) -> Result<bool> {
        let ks = self.inner.key(pubkey)?;
        let mut m = lock(&ks.m);
        Ok(self
            .inner
            .step_down(&ks, &mut m, ChangeReason::Released, None))
    }

    /// NIP-LE `stand_down()` + `release()`: stop leading now (hard-steal:
    /// the change says cancel the in-flight turn) and suppress acquiring
    /// until [`Elector::resume`] or the stand-down timeout.
    pub fn stand_down(&self, pubkey: &AgentPubkey) -> Result<()> {
        let ks = self.inner.key(pubkey)?;
        let mut m = lock(&ks.m);
        self.inner
            .step_down(&ks, &mut m, ChangeReason::StoodDown, None);
        Ok(())
    }

    /// Ends a stand-down and re-claims at once.
    pub fn resume(&self, pubkey: &AgentPubkey) -> Result<bool> {
        self.inner.check_open()?;
        let ks = self.inner.key(pubkey)?;
        let mut m = lock(&ks.m);
        m.stand_down_until = None;
        self.inner.evaluate(&ks, &mut m, Eval::Tick);
        Ok(ks.is_leader())
    }

    /// Handles a relay-delivered control frame (decrypted JSON content) for
    /// `pubkey`. Authorisation (NIP-AO: only the agent's owner may send
    /// control frames) is the caller's job. Returns the `control_result` to
    /// send, if any:
    /// * we are the target → claim; `Some(claimed)` once we hold the lock,
    ///   else `None` and later refresh ticks retry (a [`ChangeReason::Claimed`]
    ///   change says when to send the result);
    /// * we hold the lock and are not the target → stand down and release;
    /// * otherwise, and for unknown frame types → ignored.
    pub fn handle_control_frame(
        &self,
        pubkey: &AgentPubkey,
        frame: &str,
    ) -> Result<Option<ControlResult>> {
        let target = match ControlFrame::parse(frame)? {
            ControlFrame::ClaimLeadership { target_instance_id } => target_instance_id,
            ControlFrame::Other => return Ok(None),
        };
        self.inner.check_open()?;
        let ks = self.inner.key(pubkey)?;
        let mut m = lock(&ks.m);
        if target == self.inner.id.as_str() {
            let outcome = self.inner.claim_locked(&ks, &mut m)?;
            return Ok((outcome != ClaimOutcome::Pending).then(ControlResult::claimed));
        }
        if m.holds_lock {
            self.inner
                .step_down(&ks, &mut m, ChangeReason::StoodDown, Some(&target));
        }
        Ok(None)
    }

    /// Runs one refresh of every key now, without waiting for the tick.
    pub fn refresh_now(&self) {
        self.inner.tick_all();
    }

    /// A snapshot of every joined key.
    pub fn status(&self) -> Vec<ElectionStatus> {
        let keys: Vec<_> = self
            .inner
            .keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let now = SystemTime::now();
        let mut out: Vec<_> = keys
            .iter()
            .map(|ks| self.inner.status_of(ks, now))
            .collect();
        out.sort_by_key(|s| s.pubkey);
        out
    }

    /// Stops the refresh thread and releases every lock we hold. Idempotent;
    /// later calls that would touch files return [`Error::ShutDown`].
    pub fn shutdown(&self) {
        if self.inner.shut.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.inner.wake.send(None);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        let keys: Vec<_> = self
            .inner
            .keys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, k)| k)
            .collect();
        for ks in keys {
            let mut m = lock(&ks.m);
            self.inner
                .stop_and_release(&ks, &mut m, ChangeReason::Released, false, None);
            lock(&ks.presence).take();
        }
    }
}

impl Drop for Elector {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Eval {
    /// First look after join: always report.
    Initial,
    /// A refresh.
    Tick,
    /// A look prompted by a file event or a holder's death: never rewrites
    /// our own record.
    Wake,
}

impl Inner {
    fn check_open(&self) -> Result<()> {
        if self.shut.load(Ordering::SeqCst) {
            Err(Error::ShutDown)
        } else {
            Ok(())
        }
    }

    fn key(&self, pubkey: &AgentPubkey) -> Result<Arc<KeyState>> {
        self.keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(pubkey)
            .cloned()
            .ok_or(Error::NotJoined(*pubkey))
    }

    /// Ticks every refresh interval; in between, re-reads a key at once when
    /// the directory watch or a holder-death waiter says it changed.
    fn refresh_loop(&self, wake: mpsc::Receiver<Option<AgentPubkey>>) {
        let mut next = Instant::now() + self.config.refresh;
        loop {
            let mut woken: Vec<AgentPubkey> = Vec::new();
            match wake.recv_timeout(next.saturating_duration_since(Instant::now())) {
                Ok(k) => {
                    woken.extend(k);
                    // Coalesce a burst of file events into one look per key.
                    while let Ok(k) = wake.try_recv() {
                        woken.extend(k);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            if self.shut.load(Ordering::SeqCst) {
                return;
            }
            if Instant::now() >= next {
                self.tick_all();
                next = Instant::now() + self.config.refresh;
                continue;
            }
            woken.sort();
            woken.dedup();
            for k in woken {
                if let Ok(ks) = self.key(&k) {
                    let mut m = lock(&ks.m);
                    self.evaluate(&ks, &mut m, Eval::Wake);
                }
            }
        }
    }

    fn tick_all(&self) {
        let keys: Vec<_> = self
            .keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for ks in keys {
            let mut m = lock(&ks.m);
            self.evaluate(&ks, &mut m, Eval::Tick);
        }
    }

    fn claim_locked(&self, ks: &Arc<KeyState>, m: &mut KeyMut) -> Result<ClaimOutcome> {
        m.stand_down_until = None;
        if m.holds_lock {
            self.evaluate(ks, m, Eval::Tick);
            if m.holds_lock {
                return Ok(ClaimOutcome::AlreadyLeader);
            }
        }
        // The lock may be free already (the holder stood down first).
        let until = Instant::now() + self.config.stand_down;
        m.pending = Some((until, None));
        self.evaluate(ks, m, Eval::Tick);
        if m.holds_lock {
            return Ok(ClaimOutcome::Claimed);
        }
        let req = ClaimRequest::new(self.id.as_str());
        control::write_claim_request(&ks.claim_path, &req)?;
        m.pending = Some((until, Some(req.nonce)));
        self.evaluate(ks, m, Eval::Tick);
        Ok(if m.holds_lock {
            ClaimOutcome::Claimed
        } else {
            ClaimOutcome::Pending
        })
    }

    /// Stand down (suppress acquire until the timeout) and release the file
    /// if it names us. Returns whether a claim of ours was truncated.
    fn step_down(
        &self,
        ks: &KeyState,
        m: &mut KeyMut,
        reason: ChangeReason,
        target: Option<&str>,
    ) -> bool {
        m.stand_down_until = Some(Instant::now() + self.config.stand_down);
        m.stood_down_for = None;
        m.pending = None;
        self.stop_and_release(ks, m, reason, false, target)
    }

    /// Gives up the lock iff the file names us, under the exclusive lock. In
    /// extended mode the lock goes straight to a live sibling (`target` when
    /// it has a presence, else any live participant when `target` is None),
    /// so the file is never empty while a sibling lives; otherwise it is
    /// truncated as the NIP says. Returns whether a claim of ours was given
    /// up.
    fn release_file(&self, ks: &KeyState, m: &mut KeyMut, target: Option<&str>) -> bool {
        let heir = match (self.config.mode, ks.token()) {
            (Mode::Extended, Some(token)) => {
                let siblings = presence::live_siblings(&self.config.lock_dir, &ks.pubkey, &token);
                match target {
                    Some(t) => siblings.into_iter().find(|s| s.instance_id == t),
                    None => siblings
                        .into_iter()
                        .find(|s| s.instance_id != self.id.as_str()),
                }
            }
            _ => None,
        };
        let result = LockedFile::open_and_lock(&ks.lock_path, self.config.lock_wait).and_then(|mut f| {
            let content = f.read()?;
            let ours = content.record().is_some_and(|r| r.instance_id == self.id.as_str());
            if !ours {
                m.observed = Some(Ok(content));
                return Ok(false);
            }
            match &heir {
                Some(h) => {
                    let epoch = self.next_epoch(m, &content);
                    let bytes = encode_record(
                        &h.instance_id,
                        h.pid,
                        SystemTime::now(),
                        Some(RecordExt { epoch, live: &h.token }),
                    );
                    f.write(&bytes)?;
                    tracing::info!(pubkey = %ks.pubkey, heir = %h.instance_id, epoch, "handed the lock over");
                    m.observed = Some(Ok(LockContent::parse(&bytes)));
                }
                None => {
                    f.truncate()?;
                    m.observed = Some(Ok(LockContent::Empty));
                }
            }
            Ok(true)
        });
        m.holds_lock = false;
        match result {
            Ok(released) => released,
            Err(e) => {
                tracing::warn!(pubkey = %ks.pubkey, "release failed: {e}");
                m.last_error = Some(e.to_string());
                false
            }
        }
    }

    /// The epoch for a new holder: one above every epoch seen for this key.
    fn next_epoch(&self, m: &mut KeyMut, content: &LockContent) -> u64 {
        let seen = content
            .record()
            .and_then(|r| r.epoch)
            .unwrap_or(0)
            .max(m.epoch);
        m.epoch = seen + 1;
        m.epoch
    }

    /// How long (our monotonic clock) the record in `content` has stayed
    /// exactly as it is now.
    fn unchanged_for(&self, m: &mut KeyMut, content: &LockContent) -> Duration {
        match content.record() {
            Some(r) => match &m.seen {
                Some((prev, since)) if prev == r => since.elapsed(),
                _ => {
                    m.seen = Some((r.clone(), Instant::now()));
                    Duration::ZERO
                }
            },
            None => {
                m.seen = None;
                Duration::ZERO
            }
        }
    }

    /// Read-decide-write under the exclusive lock. Returns what the file
    /// holds afterwards and why we wrote, if we did. `write_own` is false for
    /// looks prompted by file events: rewriting our own record then would
    /// only cause more events.
    fn acquire(
        &self,
        ks: &KeyState,
        m: &mut KeyMut,
        may_take_others: bool,
        write_own: bool,
    ) -> Result<(LockContent, Option<TakeReason>)> {
        lockfile::ensure_dir(&self.config.lock_dir)?;
        let mut f = LockedFile::open_and_lock(&ks.lock_path, self.config.lock_wait)?;
        let content = f.read()?;
        let now = SystemTime::now();
        if let Some(e) = content.record().and_then(|r| r.epoch) {
            m.epoch = m.epoch.max(e);
        }
        let decision = match self.config.mode {
            Mode::Spec => election::takeable(
                &content,
                self.id.as_str(),
                now,
                self.config.stale,
                liveness::probe,
            ),
            Mode::Extended => {
                let unchanged = self.unchanged_for(m, &content);
                election::takeable_extended(
                    &content,
                    self.id.as_str(),
                    now,
                    self.config.stale,
                    unchanged,
                    liveness::probe,
                    |t| {
                        // A thread waits on this holder's presence lock and
                        // wakes us when it is gone: no need to open it again.
                        if lock(&ks.watched).contains(t) {
                            presence::PeerPresence::Alive
                        } else {
                            presence::probe(&self.config.lock_dir, &ks.pubkey, t)
                        }
                    },
                )
            }
        };
        let ext_token = ks.token();
        match decision {
            Takeable::Yes(TakeReason::Ours) if !write_own => Ok((content, None)),
            Takeable::Yes(reason) if reason == TakeReason::Ours || may_take_others => {
                let ext = match (self.config.mode, ext_token.as_deref()) {
                    (Mode::Extended, Some(live)) => {
                        let epoch = if reason == TakeReason::Ours {
                            content.record().and_then(|r| r.epoch).unwrap_or(m.epoch)
                        } else {
                            self.next_epoch(m, &content)
                        };
                        Some((epoch, live))
                    }
                    _ => None,
                };
                let bytes = encode_record(
                    self.id.as_str(),
                    self.pid,
                    now,
                    ext.map(|(epoch, live)| RecordExt { epoch, live }),
                );
                f.write(&bytes)?;
                Ok((LockContent::parse(&bytes), Some(reason)))
            }
            _ => Ok((content, None)),
        }
    }

    /// Extension: once the lock names another live holder with a presence
    /// token, a thread waits on that holder's presence lock and wakes us the
    /// moment it dies.
    fn watch_holder(&self, ks: &Arc<KeyState>, content: &LockContent) {
        if self.config.mode != Mode::Extended {
            return;
        }
        let Some(token) = content
            .record()
            .filter(|r| r.instance_id != self.id.as_str())
            .and_then(|r| r.live.clone())
        else {
            return;
        };
        if !lock(&ks.watched).insert(token.clone()) {
            return;
        }
        let (dir, pk, tx, ks2) = (
            self.config.lock_dir.clone(),
            ks.pubkey,
            self.wake.clone(),
            Arc::clone(ks),
        );
        let spawned = std::thread::Builder::new()
            .name("nip-le-holder".into())
            .spawn(move || {
                presence::wait_gone(&dir, &pk, &token);
                lock(&ks2.watched).remove(&token);
                let _ = tx.send(Some(pk));
            });
        if spawned.is_err() {
            tracing::warn!(
                "cannot start a holder watch thread; the refresh tick remains the bound"
            );
        }
    }

    fn evaluate(&self, ks: &Arc<KeyState>, m: &mut KeyMut, eval: Eval) {
        let held_before = m.holds_lock;
        let now_i = Instant::now();
        let now = SystemTime::now();
        if m.stand_down_until.is_some_and(|u| now_i >= u) {
            m.stand_down_until = None;
        }
        if m.pending.as_ref().is_some_and(|(u, _)| now_i >= *u) {
            m.pending = None;
        }

        // A co-located instance asked to lead: the holder stands down once
        // per request.
        let request = control::read_claim_request(&ks.claim_path)
            .filter(|r| r.is_fresh(now, self.config.stand_down));
        let other_wants_it = request
            .as_ref()
            .is_some_and(|r| r.target_instance_id != self.id.as_str());
        if let Some(r) = request.as_ref().filter(|_| other_wants_it) {
            if m.holds_lock && m.honoured.as_deref() != Some(r.nonce.as_str()) {
                m.honoured = Some(r.nonce.clone());
                tracing::info!(pubkey = %ks.pubkey, target = %r.target_instance_id, "standing down for a local claim");
                self.step_down(ks, m, ChangeReason::StoodDown, Some(&r.target_instance_id));
                m.stood_down_for = Some(r.nonce.clone());
            }
        }

        // The stand-down exists so that we do not re-grab the lock before
        // someone else takes it. Once the request we stood down for is gone
        // (its target took the lock and removed it, or it expired) or another
        // instance holds the lock, the handoff is over and the acquire rules
        // protect any new claim: end the stand-down, so we can take over from
        // a departed successor without waiting out the timeout.
        if m.stood_down_for
            .as_ref()
            .is_some_and(|n| request.as_ref().map(|r| &r.nonce) != Some(n))
        {
            m.stand_down_until = None;
            m.stood_down_for = None;
        }

        let mut took = None;
        let mut validated = false;
        let content = if m.stand_down_until.is_none() {
            // A look prompted by an event writes only to take the lock, or to
            // confirm one just handed to us (that write restarts every
            // observer's hang timer, and our own validity, together).
            let write_own = eval != Eval::Wake || !m.holds_lock;
            match self.acquire(ks, m, !other_wants_it || m.holds_lock, write_own) {
                Ok((c, t)) => {
                    took = t;
                    validated = true;
                    m.last_error = None;
                    Ok(c)
                }
                Err(e) => {
                    tracing::debug!(pubkey = %ks.pubkey, "acquire failed: {e}");
                    m.last_error = Some(e.to_string());
                    lockfile::read_unguarded(&ks.lock_path)
                }
            }
        } else {
            let c = lockfile::read_unguarded(&ks.lock_path);
            // Another holder, or a holder that handed the lock to us: the
            // handoff is over either way.
            if matches!(&c, Ok(LockContent::Record(_))) {
                m.stand_down_until = None;
                m.stood_down_for = None;
            }
            c
        };

        m.holds_lock =
            matches!(&content, Ok(LockContent::Record(r)) if r.instance_id == self.id.as_str());
        if self.config.mode == Mode::Extended && !m.holds_lock {
            // Leading without holding the lock can only be the NIP's
            // fail-safe (absent, unreadable or malformed file): a MUST that
            // self-fencing never overrides. Fencing applies to holders.
            ks.valid_until.store(ALWAYS_VALID, Ordering::Release);
        }
        // Validity counts from our own last write: observers time a hang from
        // the last change they saw, which is never earlier than that write,
        // so we are fenced before any of them may take over. A read that
        // finds our record unchanged proves nothing to them.
        if m.holds_lock && validated && took.is_some() && self.config.mode == Mode::Extended {
            // A successful refresh (or a locked read naming us): the cache
            // counts for another stale bound.
            // A little under the stale bound: observers replace a hung holder
            // only after the bound, measured from when they saw its last
            // refresh, so the leader is fenced before anyone may take over,
            // whatever the coarse clock's granularity.
            let margin =
                Duration::from_millis(50).min((self.config.stale - self.config.refresh) / 2);
            let until = mono_nanos().saturating_add((self.config.stale - margin).as_nanos() as u64);
            ks.valid_until.store(until, Ordering::Release);
        }
        if let Ok(c) = &content {
            self.watch_holder(ks, c);
        }
        // While another instance's claim is pending and we do not hold the
        // lock, an emptied file means a handoff in progress, not "no
        // coordination": the fail-safe does not make us a leader then.
        let leader = m.stand_down_until.is_none()
            && (m.holds_lock || !other_wants_it)
            && election::reads_as_leader(content.as_ref(), self.id.as_str());
        tracing::debug!(
            pubkey = %ks.pubkey,
            request = ?request.as_ref().map(|r| &r.target_instance_id),
            other_wants_it,
            holds = m.holds_lock,
            content = ?content.as_ref().map(LockContent::kind),
            leader,
            "evaluated"
        );
        m.observed = Some(content.map_err(|e| e.to_string()));

        let claim_done = m.holds_lock && m.pending.is_some();
        if claim_done {
            if let Some((_, Some(nonce))) = m.pending.take() {
                control::remove_claim_request(&ks.claim_path, &nonce);
            }
        }
        let reason = if claim_done {
            ChangeReason::Claimed
        } else if leader {
            match took {
                Some(r) if r.is_takeover() => ChangeReason::Failover,
                // A record naming us that we did not write: handed to us.
                Some(TakeReason::Ours) if !held_before && eval != Eval::Initial => {
                    ChangeReason::HandedOver
                }
                Some(_) => ChangeReason::Acquired,
                None if m.holds_lock && !held_before => ChangeReason::HandedOver,
                None if m.holds_lock => ChangeReason::Acquired,
                None => ChangeReason::FailSafe,
            }
        } else if eval == Eval::Initial {
            ChangeReason::Observer
        } else {
            ChangeReason::Lost
        };
        self.set_view(ks, m, leader, reason, eval == Eval::Initial || claim_done);
    }

    /// Updates the cache and notifies subscribers when it changed (or when
    /// `always`).
    fn set_view(
        &self,
        ks: &KeyState,
        m: &KeyMut,
        leader: bool,
        reason: ChangeReason,
        always: bool,
    ) {
        let was = ks.leader.swap(leader, Ordering::AcqRel);
        self.notify(ks, m, was, leader, reason, always);
    }

    /// Stops acting as leader *before* the file is released, so that no
    /// moment exists where a successor and we both lead; then releases and
    /// reports. Returns whether a claim of ours was released.
    fn stop_and_release(
        &self,
        ks: &KeyState,
        m: &mut KeyMut,
        reason: ChangeReason,
        always: bool,
        target: Option<&str>,
    ) -> bool {
        let was = ks.leader.swap(false, Ordering::AcqRel);
        let released = self.release_file(ks, m, target);
        self.notify(ks, m, was, false, reason, always);
        released
    }

    fn notify(
        &self,
        ks: &KeyState,
        m: &KeyMut,
        was: bool,
        leader: bool,
        reason: ChangeReason,
        always: bool,
    ) {
        if was == leader && !always {
            return;
        }
        let change = LeadershipChange {
            pubkey: ks.pubkey,
            is_leader: leader,
            reason,
            leader_instance_id: holder_id(m),
            epoch: match &m.observed {
                Some(Ok(LockContent::Record(r))) => r.epoch,
                _ => None,
            },
            at_ms: unix_ms(SystemTime::now()),
        };
        tracing::debug!(?change, "leadership change");
        let _ = self.events.send(change);
    }

    fn status_of(&self, ks: &KeyState, now: SystemTime) -> ElectionStatus {
        let m = lock(&ks.m);
        let now_i = Instant::now();
        let (lock_state, holder) = match &m.observed {
            None => ("absent", None),
            Some(Err(_)) => ("unreadable", None),
            Some(Ok(c)) => (
                c.kind(),
                c.record().map(|r| HolderStatus {
                    instance_id: r.instance_id.clone(),
                    pid: r.pid,
                    claimed_at: r.claimed_at.instant().map(format_claimed_at),
                    age_ms: match claim_age(&r.claimed_at, now) {
                        ClaimAge::Past(d) => Some(d.as_millis() as i64),
                        ClaimAge::Future(d) => Some(-(d.as_millis() as i64)),
                        ClaimAge::Unparseable => None,
                    },
                    is_us: r.instance_id == self.id.as_str(),
                }),
            ),
        };
        ElectionStatus {
            pubkey: ks.pubkey,
            is_leader: ks.leader.load(Ordering::Acquire),
            lock_path: ks.lock_path.clone(),
            lock_state,
            holder,
            standing_down: m.stand_down_until.is_some_and(|u| u > now_i),
            claim_pending: m.pending.as_ref().is_some_and(|(u, _)| *u > now_i),
            last_error: m.last_error.clone(),
        }
    }
}

fn holder_id(m: &KeyMut) -> Option<String> {
    match &m.observed {
        Some(Ok(LockContent::Record(r))) => Some(r.instance_id.clone()),
        _ => None,
    }
}

/// Extension: watches the lock directory and wakes the refresh thread for
/// the key of every lock file or claim request that changes, so a foreign
/// write, a release or a claim is seen at once. Returns whether watching is
/// on; without it the refresh tick stays the bound.
///
/// On Linux this is inotify with a mask of changes only (`MODIFY`,
/// `CREATE`, `DELETE`, `MOVED_*`): reads (ours and every peer's) wake
/// nobody, so each refresh of a leader costs one wake-up per observer. The
/// `notify` crate would also subscribe to `OPEN`, making every read in the
/// directory wake every instance. Elsewhere `notify` is used.
#[cfg(target_os = "linux")]
fn watch_lock_dir(dir: &Path, wake: mpsc::Sender<Option<AgentPubkey>>) -> bool {
    use inotify::{Inotify, WatchMask};
    if let Err(e) = lockfile::ensure_dir(dir) {
        tracing::warn!("not watching {}: {e}", dir.display());
        return false;
    }
    let mut ino = match Inotify::init() {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!("directory watch unavailable: {e}");
            return false;
        }
    };
    // MODIFY, not CLOSE_WRITE: every acquire opens the lock file read-write,
    // so its close would wake everyone even when nothing was written.
    let mask = WatchMask::MODIFY
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM;
    if let Err(e) = ino.watches().add(dir, mask) {
        tracing::warn!("cannot watch {}: {e}", dir.display());
        return false;
    }
    let spawned = std::thread::Builder::new()
        .name("nip-le-watch".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                let Ok(events) = ino.read_events_blocking(&mut buf) else {
                    return;
                };
                for ev in events {
                    if let Some(k) = ev.name.and_then(|n| n.to_str()).and_then(key_of_name) {
                        // The elector is gone: stop watching.
                        if wake.send(Some(k)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    spawned.is_ok()
}

#[cfg(not(target_os = "linux"))]
fn watch_lock_dir(dir: &Path, wake: mpsc::Sender<Option<AgentPubkey>>) -> bool {
    use notify::{EventKind, RecursiveMode, Watcher};
    if let Err(e) = lockfile::ensure_dir(dir) {
        tracing::warn!("not watching {}: {e}", dir.display());
        return false;
    }
    let handler = move |res: notify::Result<notify::Event>| {
        let Ok(ev) = res else { return };
        if matches!(ev.kind, EventKind::Access(_)) {
            return;
        }
        for p in &ev.paths {
            if let Some(k) = p.file_name().and_then(|n| n.to_str()).and_then(key_of_name) {
                let _ = wake.send(Some(k));
            }
        }
    };
    let mut w = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("directory watch unavailable: {e}");
            return false;
        }
    };
    if let Err(e) = w.watch(dir, RecursiveMode::NonRecursive) {
        tracing::warn!("cannot watch {}: {e}", dir.display());
        return false;
    }
    // The watcher lives as long as the process; its callback stops sending
    // once the elector is gone.
    std::mem::forget(w);
    true
}

/// The agent key of `<pubkey>.lock` or `<pubkey>.claim`.
fn key_of_name(name: &str) -> Option<AgentPubkey> {
    let stem = name
        .strip_suffix(".lock")
        .or_else(|| name.strip_suffix(".claim"))?;
    AgentPubkey::parse(stem).ok()
}
