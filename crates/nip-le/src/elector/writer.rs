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
//! store and the wake sources. The machine calls neither.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::broadcast;

use crate::config::Config;
use crate::control::{self, LeadRequest};
use crate::error::{Error, Result};
use crate::liveness::{self, Liveness};
use crate::lockfile;
use crate::presence::{self, HolderPresence, PeerPresence, Presence, Sibling};
use crate::pubkey::AgentPubkey;
use crate::record::{LockContent, LockRecord};

use super::cache::{self, KeyCell, Published, Snapshot};
use super::machine::{
    Cause, Conclusion, KeyMachine, Look, Now, Observed, Probes, Rules, Seen, Validity,
};
use super::store::LockStore;
use super::types::{
    ChangeReason, ClaimOutcome, ElectionStatus, GlobalStatus, HolderStatus, LeadershipChange,
    LockState, QueuedEvent, TakeOutcome,
};
use super::upper::{UpperLevel, UpperNews};
use super::wake::WakeSources;
use crate::ledger::{self, Ledger, Op, Verdict};

/// Where a command's answer goes.
pub(crate) type Reply<T> = mpsc::SyncSender<Result<T>>;

/// What the facade asks of the writer.
pub(crate) enum Command {
    Join(Vec<AgentPubkey>, Reply<Vec<bool>>),
    Leave(AgentPubkey, Reply<()>),
    Claim(AgentPubkey, Reply<ClaimOutcome>),
    Release(AgentPubkey, Reply<bool>),
    StandDown(AgentPubkey, Reply<()>),
    Resume(AgentPubkey, Reply<bool>),
    /// A `claim_leadership` frame naming this target.
    ClaimFrame(AgentPubkey, String, Reply<bool>),
    RefreshNow(Reply<()>),
    Shutdown(Reply<()>),
    /// A work-ledger operation on a key.
    Work(AgentPubkey, WorkOp, WorkReply),
    /// News from the level above the host.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Upper(AgentPubkey, UpperNews),
}

/// A work-ledger operation (see [`crate::Work`]).
pub(crate) enum WorkOp {
    Take(String),
    Done(String),
    GiveBack(String),
    Owed(Vec<QueuedEvent>),
}

/// Where a work-ledger answer goes.
pub(crate) enum WorkReply {
    Take(Reply<TakeOutcome>),
    Flag(Reply<bool>),
    Owed(Reply<Vec<String>>),
}

impl WorkReply {
    fn fail(self, e: Error) {
        match self {
            WorkReply::Take(r) => drop(r.send(Err(e))),
            WorkReply::Flag(r) => drop(r.send(Err(e))),
            WorkReply::Owed(r) => drop(r.send(Err(e))),
        }
    }
}

/// Extension: what the holder knows of its work ledger, for the epoch it
/// holds the lock at.
struct WorkState {
    epoch: u64,
    /// The predecessor kept no ledger (its record had no epoch: spec mode
    /// or the harness): events published before we led may be answered.
    ledgerless_before: bool,
    /// `None`: the ledger cannot be read; we dispatch without it.
    ledger: Option<Ledger>,
}

/// Makes the store of a newly joined key.
pub(crate) type StoreFactory = Box<dyn Fn(&AgentPubkey) -> Box<dyn LockStore> + Send>;

/// What the writer and the facade share: the readers' snapshot and the
/// change events.
#[derive(Debug)]
pub(crate) struct Shared {
    pub snapshot: Snapshot,
    pub events: broadcast::Sender<LeadershipChange>,
}

/// Everything the writer owns besides the keys.
struct Ctx {
    config: Config,
    rules: Rules,
    our_id: Arc<str>,
    pid: u32,
    shared: Arc<Shared>,
    sources: WakeSources<Command>,
    new_store: StoreFactory,
    /// Extension: our presence lock, listing the keys we take part in
    /// (none in spec mode, or while it cannot be created: then the NIP's
    /// rules apply to us).
    presence: Option<Presence>,
    /// Whether a failure to create the presence was logged already.
    presence_warned: bool,
    /// The keys our presence must list.
    joined: BTreeSet<AgentPubkey>,
    /// Whether the presence file lags behind `joined`.
    presence_dirty: bool,
    /// Holders probed since the last answer: a holder of several keys is
    /// probed once per command, not once per key.
    probed: RefCell<HashMap<String, HolderPresence>>,
    /// The level above the host (etcd), when configured.
    upper: Option<Box<dyn UpperLevel>>,
}

impl Ctx {
    fn token(&self) -> Option<&str> {
        self.presence.as_ref().map(Presence::token)
    }

    /// Extension: makes sure we have a presence file listing exactly the
    /// joined keys. Without one (full disk, read-only directory) we still
    /// take part, by the NIP's rules: our records carry no token and peers
    /// judge them by pid and claimed_at. Called on join and leave, before
    /// any write of our record, and after each command (to retry a
    /// presence that could not be created).
    fn flush_presence(&mut self) {
        if !self.rules.extended || !(self.presence_dirty || self.presence.is_none()) {
            return;
        }
        if self.presence.is_none() && self.joined.is_empty() {
            return;
        }
        if self.presence.is_none() {
            match Presence::create(&self.config.lock_dir, &self.our_id) {
                Ok(p) => self.presence = Some(p),
                Err(e) => {
                    if !std::mem::replace(&mut self.presence_warned, true) {
                        tracing::warn!("no presence lock, NIP rules only: {e}");
                    }
                    return;
                }
            }
        }
        if let Some(p) = self.presence.as_mut() {
            match p.set_keys(self.joined.iter().copied()) {
                Ok(()) => self.presence_dirty = false,
                Err(e) => tracing::warn!("cannot update the presence file: {e}"),
            }
        }
    }
}

/// One joined key.
struct Key {
    pubkey: AgentPubkey,
    m: KeyMachine,
    cell: Arc<KeyCell>,
    store: Box<dyn LockStore>,
    lock_path: PathBuf,
    request_path: PathBuf,
    next_tick: Instant,
    /// The holder to watch, decided by the last look and not carried out
    /// yet (`Some(None)`: watch no holder).
    watch: Option<Option<String>>,
    /// Since when (unix ms) we lead, while we do.
    leader_since: Option<u64>,
    /// What our last write replaced (to tell a predecessor that kept a
    /// ledger from one that did not).
    replaced: Option<LockContent>,
    /// Extension: the work ledger, while we hold the lock at an epoch.
    work: Option<WorkState>,
    /// Whether the last change we announced said we act as leader: what
    /// `is_leader` answered then, self-fencing included.
    reported: bool,
    /// The reason of a gain we could not announce yet because we were
    /// fenced (a handed-over record we could not confirm), told when a
    /// write of ours unfences us.
    withheld: Option<ChangeReason>,
    /// Whether the upper level was last told that we lead our host.
    told_upper: bool,
    /// The upper level's view, when one is configured.
    global: Option<GlobalStatus>,
    /// Since when (unix ms) we act after taking the agent from another
    /// host, whose work ledger we cannot read: as after a predecessor that
    /// kept no ledger, only what was published since is owed.
    global_since: Option<u64>,
}

/// The writer.
pub(crate) struct Writer {
    ctx: Ctx,
    keys: BTreeMap<AgentPubkey, Key>,
    /// When the last round of the loop began (see [`Writer::notice_pause`]).
    last_round: Instant,
}

enum Flow {
    Go,
    Stop,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Now {
    pub(crate) fn system() -> Self {
        Self {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

impl Writer {
    pub(crate) fn new(
        config: Config,
        our_id: Arc<str>,
        shared: Arc<Shared>,
        sources: WakeSources<Command>,
        new_store: StoreFactory,
        upper: Option<Box<dyn UpperLevel>>,
    ) -> Self {
        let rules = Rules {
            extended: config.mode == crate::Mode::Extended,
            refresh: config.refresh,
            stale: config.stale,
            stand_down: config.stand_down,
        };
        Self {
            ctx: Ctx {
                config,
                rules,
                our_id,
                pid: liveness::current_pid(),
                shared,
                sources,
                new_store,
                presence: None,
                presence_warned: false,
                joined: BTreeSet::new(),
                presence_dirty: false,
                probed: RefCell::new(HashMap::new()),
                upper,
            },
            keys: BTreeMap::new(),
            last_round: Instant::now(),
        }
    }

    /// Runs until a `Shutdown` command (or until every handle to the
    /// mailbox is gone).
    pub(crate) fn run(mut self) {
        loop {
            let timeout = self
                .next_tick()
                .map(|t| t.saturating_duration_since(Instant::now()));
            let woken = self.ctx.sources.wait(timeout);
            self.notice_pause();
            for c in woken.commands {
                // A panic in a command drops its reply (the caller gets an
                // error) and leaves the task running.
                let flow =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.command(c)));
                match flow {
                    Ok(Flow::Stop) => return,
                    Ok(Flow::Go) => {}
                    Err(panic) => {
                        tracing::error!("a command panicked: {}", panic_message(&panic));
                    }
                }
                // What waited for the answer: our presence, the watches.
                self.after_answer();
            }
            self.refresh_due(&woken.keys, woken.all);
            for key in self.keys.values_mut() {
                key.announce_fencing(&self.ctx);
            }
            self.after_answer();
        }
    }

    /// Extension: the loop wakes at least once per refresh, so a round that
    /// begins much later than that means we were paused (or starved) and
    /// could not look: every hang timer starts again, so that a cluster
    /// paused and resumed together, in any order, keeps its leader. The
    /// slack is half the margin between refresh and stale: any pause long
    /// enough to make a live holder look hung is noticed.
    fn notice_pause(&mut self) {
        let now = Instant::now();
        let gap = now.saturating_duration_since(std::mem::replace(&mut self.last_round, now));
        let rules = &self.ctx.rules;
        if !rules.extended || self.keys.is_empty() {
            return;
        }
        let slack = rules.stale.saturating_sub(rules.refresh) / 2;
        if gap > rules.refresh + slack {
            tracing::info!(
                ?gap,
                "the election task was paused: hang timers start again"
            );
            for key in self.keys.values_mut() {
                key.m.restart_hang_timer(now);
            }
        }
    }

    /// The work no answer needs to wait for: the presence file and the
    /// watches of the keys whose view changed.
    fn after_answer(&mut self) {
        self.ctx.probed.get_mut().clear();
        self.ctx.flush_presence();
        for key in self.keys.values_mut() {
            key.compact_ledger();
            if let Some(watch) = key.watch.take() {
                self.ctx.sources.watch_holder(&key.pubkey, watch.as_deref());
                self.ctx
                    .sources
                    .watch_lock_file(&key.pubkey, &key.lock_path);
            }
        }
    }

    /// When the loop must wake next: the earliest tick, the moment a
    /// holder we watch would count as hung, or the moment a key we
    /// announced as led fences itself (each judged then, not at the next
    /// tick).
    fn next_tick(&self) -> Option<Instant> {
        let now = Instant::now();
        self.keys.values().map(|k| k.next_wake(now)).min()
    }

    /// Ticks every key that is due (or nearly: ticks are coalesced, a
    /// refresh a little early is harmless) and looks again at the keys a
    /// file event or a holder's death named.
    fn refresh_due(&mut self, woken: &BTreeSet<AgentPubkey>, all: bool) {
        // Ticks due within a few milliseconds are coalesced; never much
        // earlier, or a spec claimant would tick just before the holder
        // releases and wait a whole interval more.
        let now = Instant::now();
        let due = now + (self.ctx.rules.refresh / 16).min(Duration::from_millis(10));
        for key in self.keys.values_mut() {
            if key.next_tick <= due {
                // Before the look: the look may bring its next one closer.
                key.next_tick = Instant::now() + self.ctx.rules.refresh;
                key.evaluate(&mut self.ctx, Cause::Tick);
            } else if all
                || woken.contains(&key.pubkey)
                || key.m.hang_deadline().is_some_and(|d| d <= now)
            {
                key.evaluate(&mut self.ctx, Cause::Wake);
            }
        }
    }

    fn key(&mut self, pubkey: &AgentPubkey) -> Result<&mut Key> {
        self.keys.get_mut(pubkey).ok_or(Error::NotJoined(*pubkey))
    }

    fn command(&mut self, c: Command) -> Flow {
        match c {
            Command::Join(keys, r) => {
                let _ = r.send(Ok(self.join(&keys)));
            }
            Command::Leave(pk, r) => {
                let _ = r.send(self.leave(&pk));
            }
            Command::Claim(pk, r) => {
                let out = match self.keys.get_mut(&pk) {
                    Some(k) => k
                        .claim(&mut self.ctx)
                        .map(|o| k.claim_above(&mut self.ctx, o)),
                    None => Err(Error::NotJoined(pk)),
                };
                let _ = r.send(out);
            }
            Command::Release(pk, r) => {
                let ctx = &mut self.ctx;
                let out = self
                    .keys
                    .get_mut(&pk)
                    .ok_or(Error::NotJoined(pk))
                    .map(|k| k.step_down(ctx, ChangeReason::Released, None, false));
                let _ = r.send(out);
            }
            Command::StandDown(pk, r) => {
                let ctx = &mut self.ctx;
                let out = self.keys.get_mut(&pk).ok_or(Error::NotJoined(pk)).map(|k| {
                    k.step_down(ctx, ChangeReason::StoodDown, None, false);
                });
                let _ = r.send(out);
            }
            Command::Resume(pk, r) => {
                let out = self.key(&pk).map(|_| ()).map(|()| {
                    let ctx = &mut self.ctx;
                    let k = self.keys.get_mut(&pk).expect("checked above");
                    k.m.resume();
                    k.evaluate(ctx, Cause::Tick);
                    k.cell.is_leader()
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
                // Stop whatever happens: a panic while releasing must not
                // keep the task (and the caller of `shutdown`) waiting.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.shutdown()));
                let _ = r.send(Ok(()));
                return Flow::Stop;
            }
            Command::Work(pk, op, reply) => match self.keys.get_mut(&pk) {
                Some(k) => k.work(&self.ctx, op, reply),
                None => reply.fail(Error::NotJoined(pk)),
            },
            Command::Upper(pk, news) => {
                if let Some(k) = self.keys.get_mut(&pk) {
                    k.upper_news(&self.ctx, news);
                }
            }
        }
        Flow::Go
    }

    /// Joins `keys` and claims each at once (auto-claim on launch). Returns
    /// the resulting leadership of each; joining a key twice is a no-op.
    fn join(&mut self, keys: &[AgentPubkey]) -> Vec<bool> {
        let dir = self.ctx.config.lock_dir.clone();
        // A lock directory we cannot create is the NIP's fail-safe case (we
        // lead, and say why in `last_error`), not a reason to refuse to run.
        if let Err(e) = lockfile::ensure_dir(&dir) {
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
        keys.iter().map(|pk| self.join_one(*pk, &dir)).collect()
    }

    fn join_one(&mut self, pk: AgentPubkey, dir: &Path) -> bool {
        if let Some(k) = self.keys.get(&pk) {
            return k.cell.is_leader();
        }
        let mut key = Key {
            pubkey: pk,
            m: KeyMachine::new(self.ctx.rules, Arc::clone(&self.ctx.our_id), self.ctx.pid),
            cell: Arc::new(KeyCell::new(
                self.ctx.rules.extended,
                Published::initial(pk),
            )),
            store: (self.ctx.new_store)(&pk),
            lock_path: lockfile::lock_path(dir, &pk),
            request_path: control::lead_request_path(dir, &pk),
            next_tick: Instant::now() + self.ctx.rules.refresh,
            watch: None,
            leader_since: None,
            replaced: None,
            work: None,
            reported: false,
            withheld: None,
            told_upper: false,
            global: None,
            global_since: None,
        };
        if let Some(u) = &self.ctx.upper {
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
        cell.is_leader()
    }

    /// Leaves `pk`, releasing the lock if we hold it.
    fn leave(&mut self, pk: &AgentPubkey) -> Result<()> {
        let mut key = self.keys.remove(pk).ok_or(Error::NotJoined(*pk))?;
        key.step_down(&mut self.ctx, ChangeReason::Released, None, true);
        self.forget(key);
        Ok(())
    }

    /// Drops a key that has stepped down: its watches, its place in the
    /// snapshot and in our presence file.
    fn forget(&mut self, key: Key) {
        self.ctx.sources.watch_holder(&key.pubkey, None);
        self.ctx.sources.unwatch_lock_file(&key.pubkey);
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
            return Ok(key.claim_above(ctx, local) != ClaimOutcome::Pending);
        }
        if key.m.holds_lock() {
            // Across hosts the relay fans the frame out to every host, but
            // only the claimant's host must give its lock up: elsewhere
            // the claim travels through etcd and the host keeps its leader.
            if ctx.upper.is_some() && key.heir(ctx, Some(target)).is_none() {
                return Ok(false);
            }
            key.step_down(ctx, ChangeReason::StoodDown, Some(target), false);
        }
        Ok(false)
    }

    /// Releases every lock we hold and stops every wake source.
    fn shutdown(&mut self) {
        let keys = std::mem::take(&mut self.keys);
        for (_, mut key) in keys {
            key.step_down(&mut self.ctx, ChangeReason::Released, None, false);
            self.forget(key);
        }
        if let Some(u) = self.ctx.upper.as_mut() {
            u.shutdown();
        }
        self.ctx.sources.stop_all();
        self.ctx.presence = None;
    }
}

/// Probes with real I/O. Between ticks, a holder whose death we are
/// watching (for any key it holds) is alive until the watch fires: no need
/// to open its presence file again. Ticks always probe, so a missed event
/// (or a holder that left one key without writing it) costs at most a
/// refresh interval.
struct FileProbes<'a> {
    dir: &'a Path,
    pubkey: &'a AgentPubkey,
    sources: &'a WakeSources<Command>,
    trust_watch: bool,
    probed: &'a RefCell<HashMap<String, HolderPresence>>,
}

impl<'a> FileProbes<'a> {
    fn new(ctx: &'a Ctx, pubkey: &'a AgentPubkey, trust_watch: bool) -> Self {
        Self {
            dir: &ctx.config.lock_dir,
            pubkey,
            sources: &ctx.sources,
            trust_watch,
            probed: &ctx.probed,
        }
    }
}

impl Probes for FileProbes<'_> {
    fn pid(&self, pid: u32) -> Liveness {
        liveness::probe(pid)
    }
    fn presence(&self, token: &str) -> PeerPresence {
        if self.trust_watch && self.sources.watching(token) {
            return PeerPresence::Alive;
        }
        let mut probed = self.probed.borrow_mut();
        probed
            .entry(token.to_owned())
            .or_insert_with(|| presence::probe_holder(self.dir, token))
            .in_election(self.pubkey)
    }
}

impl Key {
    /// When this key needs the loop next (see [`Writer::next_tick`]).
    fn next_wake(&self, now: Instant) -> Instant {
        // The coarse clock may lag the loop's by a tick of its own.
        let fenced_at = self
            .reported
            .then(|| self.cell.fences_in())
            .flatten()
            .map(|d| now + d + Duration::from_millis(5));
        [self.m.hang_deadline(), fenced_at]
            .into_iter()
            .flatten()
            .fold(self.next_tick, Instant::min)
    }

    /// One evaluation (see [`Key::evaluate_once`]). A panic in it (a bug,
    /// or content no check foresaw) costs this key this look, never the
    /// election task: the other keys, the commands and the next tick go on,
    /// and the key's status says what happened. (An app built with
    /// `panic = "abort"` aborts instead, as it would anywhere.)
    fn evaluate(&mut self, ctx: &mut Ctx, cause: Cause) {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.evaluate_once(ctx, cause)
        }));
        if let Err(panic) = run {
            let what = panic_message(&panic);
            tracing::error!(pubkey = %self.pubkey, "evaluation panicked: {what}");
            self.m
                .note_error(format!("internal error while evaluating: {what}"));
            self.publish();
        }
    }

    /// One evaluation: honour a local lead request, look at the lock, and
    /// carry out what the machine concludes.
    fn evaluate_once(&mut self, ctx: &mut Ctx, cause: Cause) {
        let now = Now::system();
        // Spec mode touches nothing but the lock file: claims reach the
        // holder as relay frames only.
        let request = ctx
            .rules
            .extended
            .then(|| control::read_lead_request(&self.request_path))
            .flatten();
        let begin = self.m.begin(now, request.as_ref());
        if let Some(sd) = begin.step_down.clone() {
            tracing::info!(pubkey = %self.pubkey, target = ?sd.target, "standing down for a local claim");
            self.step_down(ctx, sd.reason, sd.target.as_deref(), false);
            self.m.serve_request(sd.nonce);
        }
        let look = self.m.look(now, cause, request.as_ref(), &begin);
        let (seen, locked_at) = self.look(ctx, look, cause);
        let (wrote, busy) = (seen.took.is_some(), seen.busy);
        let c = self.m.conclude(cause, &begin, look, seen);
        tracing::debug!(pubkey = %self.pubkey, ?cause, ?c, "evaluated");
        self.apply(ctx, c, locked_at);
        if busy && ctx.rules.extended {
            self.while_a_peer_holds_the_lock(ctx);
            return;
        }
        // Ticks keep their own cadence (`Writer::refresh_due`): a command's
        // look does not move the next tick, or a claimant would always wait
        // a whole interval after its claim. In extended mode an observer's
        // look (prompted by the holder's refresh) is as good as a tick, and
        // so is a write of our record: the tick waits another interval, so
        // that at rest an observer wakes once per refresh of the holder,
        // like a spec instance.
        if ctx.rules.extended && (wrote || !self.m.holds_lock()) {
            self.next_tick = Instant::now() + ctx.rules.refresh;
        }
    }

    /// Extension: a peer hangs holding the lock file's `flock`. The holder
    /// tries again soon (its write must land as soon as the hold ends, before
    /// anyone judges it hung); an observer gives the holder a fresh stale
    /// window, since it could not have written either.
    fn while_a_peer_holds_the_lock(&mut self, ctx: &Ctx) {
        let now = Instant::now();
        if self.m.holds_lock() {
            let retry = (ctx.config.lock_wait + Duration::from_millis(50)).min(ctx.rules.refresh);
            self.next_tick = self.next_tick.min(now + retry);
        } else {
            self.m.restart_hang_timer(now);
        }
    }

    /// Looks at the lock as `look` says. Returns what was seen and, when we
    /// wrote, the monotonic instant taken under the exclusion before the
    /// write (our validity counts from there).
    fn look(&mut self, ctx: &mut Ctx, look: Look, cause: Cause) -> (Seen, Option<u64>) {
        if look == Look::Read {
            let seen = Seen {
                content: guarded(|| self.store.read()).map_err(|e| e.to_string()),
                took: None,
                locked: false,
                busy: false,
                error: None,
            };
            return (seen, None);
        }
        let trust_watch = cause != Cause::Tick;
        // Extension: read first. The exclusion is needed only to write; when
        // the read shows a record we would leave alone (a live holder, or
        // ours on a wake-up), the locked look would decide the same.
        if ctx.rules.extended && (cause == Cause::Wake || !self.m.holds_lock()) {
            if let Ok(content) = guarded(|| self.store.read()) {
                let probes = FileProbes::new(ctx, &self.pubkey, trust_watch);
                if !self.m.would_write(&content, Now::system(), look, &probes) {
                    let seen = Seen {
                        content: Ok(content),
                        took: None,
                        locked: false,
                        busy: false,
                        error: self.m.last_error().map(str::to_owned),
                    };
                    return (seen, None);
                }
            }
        }
        // A record of ours names our presence, which must list this key
        // before anyone can read the record.
        ctx.flush_presence();
        let token = ctx.token().map(str::to_owned);
        let probes = FileProbes::new(ctx, &self.pubkey, trust_watch);
        let (mut took, mut locked_at, mut before) = (None, None, None);
        let (m, store) = (&mut self.m, &mut self.store);
        let result = guarded(|| {
            store.update(&mut |content, floor| {
                locked_at = Some(cache::mono_nanos());
                m.raise_epoch_floor(floor);
                let (w, t) = m.decide(content, Now::system(), look, token.as_deref(), &probes);
                if t.is_some() {
                    before = Some(content.clone());
                }
                took = t;
                w
            })
        });
        if before.is_some() {
            self.replaced = before;
        }
        match result {
            Ok(u) => (
                Seen {
                    content: Ok(u.content),
                    took,
                    locked: true,
                    busy: false,
                    error: None,
                },
                locked_at,
            ),
            Err(e) => {
                tracing::debug!(pubkey = %self.pubkey, "acquire failed: {e}");
                let seen = Seen {
                    content: guarded(|| self.store.read()).map_err(|e| e.to_string()),
                    took: None,
                    locked: false,
                    busy: matches!(e, Error::LockTimeout { .. }),
                    error: Some(e.to_string()),
                };
                (seen, None)
            }
        }
    }

    /// Carries out a conclusion: the validity, the new view (and its change
    /// event) and the status, so readers and subscribers learn it at once;
    /// then the request removal. The watches follow after the answer
    /// (`Writer::after_answer`).
    fn apply(&mut self, ctx: &mut Ctx, c: Conclusion, locked_at: Option<u64>) {
        // A validity that ran out while we could not say so (the process
        // was stopped, or starved past the deadline) is announced before a
        // lead this look concludes: others may have acted meanwhile, so a
        // lead regained now is a new tenure, not a continuation. (A look
        // that concludes we lost says so itself.)
        if c.leader {
            self.announce_fencing(ctx);
        }
        match c.validity {
            Validity::Keep => {}
            Validity::Always => self.cell.never_fence(),
            Validity::Fenced => self.cell.fence(),
            Validity::Renew => self.cell.renew_from(
                locked_at.unwrap_or_else(cache::mono_nanos),
                ctx.rules.validity(),
            ),
        }
        let held = self.cell.set_leader(c.leader);
        self.track_work(ctx, c.leader);
        self.tell_upper(ctx, c.leader, false);
        // What readers see from now on: the flag, self-fencing included.
        let acting = self.cell.is_leader();
        let reason = match (self.reported, acting) {
            (true, false) if c.leader => ChangeReason::Fenced,
            (false, true) if held && c.reason == ChangeReason::Acquired => {
                self.withheld.take().unwrap_or(ChangeReason::Unfenced)
            }
            _ => c.reason,
        };
        if c.leader && !acting && !self.reported && c.reason != ChangeReason::Acquired {
            self.withheld = Some(c.reason);
        } else if acting || !c.leader {
            self.withheld = None;
        }
        self.notify(ctx, acting, reason, c.always);
        self.publish();
        self.watch = Some(c.watch);
        if let Some(nonce) = &c.remove_request {
            control::remove_lead_request(&self.request_path, nonce);
        }
    }

    /// The one step-down path (release, stand-down, leave, shutdown): stop
    /// acting as leader *before* the file changes, so that no moment exists
    /// where a successor and we both lead; then give the lock up iff the
    /// file names us (extension: straight to a live sibling, `target` when
    /// it has a presence) and report. Returns whether a record of ours was
    /// given up.
    fn step_down(
        &mut self,
        ctx: &mut Ctx,
        reason: ChangeReason,
        target: Option<&str>,
        always: bool,
    ) -> bool {
        self.m.step_down(Now::system());
        self.cell.set_leader(false);
        self.withheld = None;
        self.track_work(ctx, false);
        let heir = self.heir(ctx, target);
        let mut released = false;
        let (m, store) = (&mut self.m, &mut self.store);
        let result = guarded(|| {
            store.update(&mut |content, floor| {
                m.raise_epoch_floor(floor);
                let (w, r) = m.decide_release(content, Now::system(), heir.as_ref());
                released = r;
                w
            })
        });
        let result = result.map(|u| u.content).map_err(|e| {
            tracing::warn!(pubkey = %self.pubkey, "release failed: {e}");
            released = false;
            e.to_string()
        });
        if released {
            match &heir {
                Some(h) => {
                    tracing::info!(pubkey = %self.pubkey, heir = %h.instance_id, "handed the lock over")
                }
                None => tracing::info!(pubkey = %self.pubkey, "released the lock"),
            }
        }
        self.m.released(result);
        // A sibling of this host that took the lock from us continues the
        // upper level's hold; otherwise it is given up at once.
        self.tell_upper(ctx, false, !(released && heir.is_some()));
        self.notify(ctx, false, reason, always);
        self.publish();
        released
    }

    /// Tells the upper level (if any) when our host leadership changed.
    fn tell_upper(&mut self, ctx: &mut Ctx, leads: bool, revoke: bool) {
        if let Some(u) = ctx.upper.as_mut() {
            if std::mem::replace(&mut self.told_upper, leads) != leads {
                u.host_leader(self.pubkey, &self.cell, leads, revoke);
            }
        }
    }

    /// The upper level's part of a claim: it is asked to claim too, and the
    /// claim is complete only once we act.
    fn claim_above(&mut self, ctx: &mut Ctx, local: ClaimOutcome) -> ClaimOutcome {
        let Some(u) = ctx.upper.as_mut() else {
            return local;
        };
        if self.cell.is_leader() {
            return ClaimOutcome::AlreadyLeader;
        }
        u.claim(self.pubkey, &self.cell);
        ClaimOutcome::Pending
    }

    /// News from the upper level: a change of what we may do is announced
    /// (with the level it leaves us at), a view change only published.
    fn upper_news(&mut self, ctx: &Ctx, news: UpperNews) {
        self.global = Some(news.status);
        if news.from_other_host {
            self.global_since = Some(news.at_ms);
        } else if matches!(
            news.reason,
            Some(ChangeReason::Lost | ChangeReason::StoodDown | ChangeReason::Released)
        ) {
            // Given up (a fence that lifts again keeps it: nothing moved).
            self.global_since = None;
        }
        if let Some(reason) = news.reason {
            let acting = self.cell.is_leader();
            self.notify_at(ctx, acting, reason, true, news.at_ms);
        }
        self.publish();
    }

    /// Extension: the live sibling to hand the lock to (`target` when it
    /// has a presence, else any other participant).
    fn heir(&self, ctx: &Ctx, target: Option<&str>) -> Option<Sibling> {
        if !ctx.rules.extended {
            return None;
        }
        let token = ctx.token()?;
        let siblings = presence::live_siblings(&ctx.config.lock_dir, &self.pubkey, token);
        match target {
            Some(t) => siblings.into_iter().find(|s| s.instance_id == t),
            None => siblings.into_iter().find(|s| s.instance_id != *ctx.our_id),
        }
    }

    /// The user's claim. Extension: co-located instances learn it through
    /// the local lead request, without a relay; the holder stands down on
    /// its next look and we take the lock on ours. In spec mode only the
    /// relay frame carries it. Never evicts a live leader.
    fn claim(&mut self, ctx: &mut Ctx) -> Result<ClaimOutcome> {
        self.m.claim_started();
        if self.m.holds_lock() {
            self.evaluate(ctx, Cause::Tick);
            if self.m.holds_lock() {
                return Ok(ClaimOutcome::AlreadyLeader);
            }
        }
        // The lock may be free already (the holder stood down first).
        self.m.claim_pending_from(Now::system(), None);
        self.evaluate(ctx, Cause::Tick);
        if self.m.holds_lock() {
            return Ok(ClaimOutcome::Claimed);
        }
        if !ctx.rules.extended {
            // The plain NIP: the holder learns of the claim from the relay's
            // `claim_leadership` frame, and we take the lock it releases on
            // a later look, until the stand-down timeout.
            return Ok(ClaimOutcome::Pending);
        }
        let req = LeadRequest::new(&ctx.our_id);
        control::write_lead_request(&self.request_path, &req)?;
        self.m.claim_pending_from(Now::system(), Some(req.nonce));
        self.evaluate(ctx, Cause::Tick);
        Ok(if self.m.holds_lock() {
            ClaimOutcome::Claimed
        } else {
            ClaimOutcome::Pending
        })
    }

    /// Keeps the leadership start and the work ledger in step with the
    /// view: the ledger is (re)loaded whenever we lead at a new epoch, and
    /// forgotten when we stop leading.
    fn track_work(&mut self, ctx: &Ctx, leader: bool) {
        if !leader {
            self.leader_since = None;
            self.global_since = None;
            self.work = None;
            self.replaced = None;
            return;
        }
        self.leader_since
            .get_or_insert_with(|| unix_ms(SystemTime::now()));
        let epoch = match self.m.observed().record() {
            Some(r) if ctx.rules.extended && self.m.holds_lock() => r.epoch,
            _ => None,
        };
        let Some(epoch) = epoch else {
            self.work = None;
            return;
        };
        if self.work.as_ref().is_some_and(|w| w.epoch == epoch) {
            return;
        }
        let ledgerless_before = matches!(
            &self.replaced,
            Some(LockContent::Record(r)) if r.epoch.is_none() && r.instance_id != ctx.our_id.as_ref()
        );
        let path = ledger::ledger_path(&ctx.config.lock_dir, &self.pubkey);
        let ledger = match Ledger::load(path, unix_ms(SystemTime::now()), ctx.config.work_retention)
        {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(pubkey = %self.pubkey, "dispatching without the work ledger: {e}");
                None
            }
        };
        self.work = Some(WorkState {
            epoch,
            ledgerless_before,
            ledger,
        });
    }

    /// Rewrites a ledger that has grown to twice its live entries.
    fn compact_ledger(&mut self) {
        let Some(l) = self.work.as_mut().and_then(|w| w.ledger.as_mut()) else {
            return;
        };
        if l.index.wants_compaction() {
            if let Err(e) = l.compact() {
                tracing::warn!(pubkey = %self.pubkey, "cannot compact the work ledger: {e}");
            }
        }
    }

    /// One work-ledger operation. Every one first checks that we lead (and
    /// are not fenced): a displaced or fenced leader neither takes nor
    /// completes.
    fn work(&mut self, ctx: &Ctx, op: WorkOp, reply: WorkReply) {
        let leads = self.cell.is_leader();
        let our_id = ctx.our_id.to_string();
        let now_ms = unix_ms(SystemTime::now());
        match (op, reply) {
            (WorkOp::Take(id), WorkReply::Take(r)) => {
                let _ = r.send(Ok(self.take(&id, leads, &our_id, now_ms)));
            }
            (WorkOp::Done(id), WorkReply::Flag(r)) => {
                let _ = r.send(Ok(leads
                    && self.append(Op::Done {
                        id,
                        epoch: 0,
                        at_ms: now_ms,
                    })));
            }
            (WorkOp::GiveBack(id), WorkReply::Flag(r)) => {
                let mine = self.work.as_ref().and_then(|w| {
                    let taken = w.ledger.as_ref()?.index.state(&id);
                    (taken == Some(ledger::State::Taken(w.epoch))).then_some(())
                });
                let ok = mine.is_some()
                    && self.append(Op::GiveBack {
                        id,
                        epoch: 0,
                        at_ms: now_ms,
                    });
                let _ = r.send(Ok(ok));
            }
            (WorkOp::Owed(queue), WorkReply::Owed(r)) => {
                let _ = r.send(Ok(if leads { self.owed(&queue) } else { Vec::new() }));
            }
            (_, reply) => reply.fail(Error::ShutDown),
        }
    }

    fn take(&mut self, id: &str, leads: bool, our_id: &str, now_ms: u64) -> TakeOutcome {
        if !leads {
            return TakeOutcome::NotLeader;
        }
        let Some(w) = self.work.as_mut() else {
            // Spec mode, or a fail-safe leader: no ledger applies.
            return TakeOutcome::Granted { epoch: None };
        };
        let epoch = w.epoch;
        let Some(l) = w.ledger.as_mut() else {
            return TakeOutcome::Granted { epoch: Some(epoch) };
        };
        match l.index.verdict(id, epoch) {
            Verdict::Done => TakeOutcome::Done,
            Verdict::TakenNow => TakeOutcome::AlreadyTaken,
            Verdict::Owed => {
                let op = Op::Take {
                    id: id.to_owned(),
                    epoch,
                    by: our_id.to_owned(),
                    at_ms: now_ms,
                };
                if let Err(e) = l.append(&op) {
                    // Never silent: dispatch, and say why it is unrecorded.
                    tracing::warn!(pubkey = %self.pubkey, "cannot record a take: {e}");
                }
                TakeOutcome::Granted { epoch: Some(epoch) }
            }
        }
    }

    /// Appends `op` at our epoch (its `epoch` field is ours); `true` when
    /// recorded or when no ledger applies.
    fn append(&mut self, mut op: Op) -> bool {
        let Some(w) = self.work.as_mut() else {
            return true;
        };
        match &mut op {
            Op::Take { epoch, .. } | Op::Done { epoch, .. } | Op::GiveBack { epoch, .. } => {
                *epoch = w.epoch
            }
        }
        let Some(l) = w.ledger.as_mut() else {
            return true;
        };
        match l.append(&op) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(pubkey = %self.pubkey, "cannot append to the work ledger: {e}");
                false
            }
        }
    }

    /// The queued events we must dispatch now, in order.
    fn owed(&self, queue: &[QueuedEvent]) -> Vec<String> {
        let since = self
            .leader_since
            .unwrap_or(0)
            .max(self.global_since.unwrap_or(0));
        // Without a ledger that covers the predecessor, events published
        // before we led may have been answered by it.
        let published_since = |e: &QueuedEvent| e.published_ms.is_none_or(|p| p >= since);
        match self.work.as_ref() {
            Some(w) => {
                let fallback =
                    w.ledgerless_before || w.ledger.is_none() || self.global_since.is_some();
                queue
                    .iter()
                    .filter(|e| !fallback || published_since(e))
                    .filter(|e| {
                        w.ledger
                            .as_ref()
                            .is_none_or(|l| l.index.verdict(&e.id, w.epoch) == Verdict::Owed)
                    })
                    .map(|e| e.id.clone())
                    .collect()
            }
            None => queue
                .iter()
                .filter(|e| published_since(e))
                .map(|e| e.id.clone())
                .collect(),
        }
    }

    /// Extension: a key we announced as led whose validity ran out without
    /// a successful write is announced as fenced at once, so the app's gate
    /// closes when `is_leader` turns false, not at our next tick.
    fn announce_fencing(&mut self, ctx: &Ctx) {
        if self.reported && !self.cell.is_leader() {
            tracing::warn!(pubkey = %self.pubkey, "no successful write within the stale bound: fenced");
            self.notify(ctx, false, ChangeReason::Fenced, false);
            self.publish();
        }
    }

    /// Announces what readers now see (`leader`: the flag, fencing
    /// included) when it differs from the last announcement, or `always`.
    fn notify(&mut self, ctx: &Ctx, leader: bool, reason: ChangeReason, always: bool) {
        self.notify_at(ctx, leader, reason, always, unix_ms(SystemTime::now()));
    }

    /// [`Key::notify`] for a change that happened at `at_ms`.
    fn notify_at(
        &mut self,
        ctx: &Ctx,
        leader: bool,
        reason: ChangeReason,
        always: bool,
        at_ms: u64,
    ) {
        let was = std::mem::replace(&mut self.reported, leader);
        if was == leader && !always {
            return;
        }
        let record = self.m.observed().record();
        let change = LeadershipChange {
            pubkey: self.pubkey,
            is_leader: leader,
            leader_instance_id: record.map(|r| r.instance_id.clone()),
            reason,
            must_cancel_turn: was && !leader && reason.must_cancel_turn(),
            epoch: record.and_then(|r| r.epoch),
            at_ms,
            level: self.cell.level(),
            global_holder: self.global.as_ref().and_then(|g| g.holder.clone()),
        };
        tracing::debug!(?change, "leadership change");
        let _ = ctx.shared.events.send(change);
    }

    /// Publishes the status snapshot readers see.
    fn publish(&self) {
        let (lock_state, record) = match self.m.observed() {
            Observed::Nothing => (LockState::Absent, None),
            Observed::Unreadable(_) => (LockState::Unreadable, None),
            Observed::Content(c) => (lock_state(c), c.record()),
        };
        let our_id = self.m.our_id();
        self.cell.publish(Published {
            status: ElectionStatus {
                pubkey: self.pubkey,
                is_leader: false,
                lock_state,
                holder: record.map(|r| holder_status(r, our_id)),
                standing_down: false,
                claim_pending: false,
                last_error: self.m.last_error().map(str::to_owned),
                level: super::types::Level::None,
                global: self.global.clone(),
            },
            claimed_at: record.and_then(|r| r.claimed_at.instant()),
            standing_down_until: self.m.stand_down_until(),
            claim_pending_until: self.m.pending_until(),
        });
    }
}

/// Runs a store call; a panic in it becomes an error (the store is where
/// foreign content and the platform meet, so that is where one is most
/// likely).
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        Err(Error::io(
            "<store>",
            std::io::Error::other(format!("internal error: {}", panic_message(&panic))),
        ))
    })
}

/// The text of a caught panic.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned())
}

fn lock_state(c: &LockContent) -> LockState {
    match c {
        LockContent::Absent => LockState::Absent,
        LockContent::Empty => LockState::Empty,
        LockContent::Oversized => LockState::Oversized,
        LockContent::Malformed(_) => LockState::Malformed,
        LockContent::Record(_) => LockState::Record,
    }
}

fn holder_status(r: &LockRecord, our_id: &str) -> HolderStatus {
    HolderStatus {
        instance_id: r.instance_id.clone(),
        pid: r.pid,
        claimed_at: r.claimed_at.instant().map(crate::record::format_claimed_at),
        age_ms: None,
        epoch: r.epoch,
        is_us: r.instance_id == our_id,
    }
}
