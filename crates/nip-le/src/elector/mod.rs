//! The elector: this process's part in the elections of many agent keys.
//!
//! One concept per file:
//! * [`types`]: the public vocabulary (changes, reasons, claim outcomes,
//!   status);
//! * `machine`: the per-key state machine, pure, tested with an injected
//!   clock;
//! * `store`: the `LockStore` seam and the lock file behind it;
//! * `wake`: what wakes the writer (commands, file events, holder deaths),
//!   as owned handles;
//! * `cache`: the hot path readers use (`is_leader`, `status`);
//! * `writer`: the one task that owns all key state and does all file I/O;
//! * `upper`: the seam for a level above the host (etcd, feature `etcd`);
//! * this file: the facade, [`Elector`], whose calls are messages to the
//!   writer or reads of the published snapshot.

pub(crate) mod cache;
mod machine;
mod store;
pub mod types;
pub(crate) mod upper;
mod wake;
mod world;
mod writer;

use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::broadcast;

use crate::config::Config;
use crate::control::{ControlFrame, ControlResult};
use crate::error::{Error, Result};
use crate::identity::InstanceId;
use crate::lockfile;
use crate::pubkey::AgentPubkey;

pub use cache::LeaderFlag;
pub use types::{
    ChangeReason, ClaimOutcome, ElectionStatus, GlobalHolder, GlobalStatus, HolderStatus,
    LeadershipChange, Level, LockState, QueuedEvent, TakeOutcome,
};

use store::FileStore;
use wake::{Mailbox, Msg, WakeSources};
use writer::StoreFactory;

// The seam the simulator drives the real writer through.
pub(crate) use machine::{Now, Write};
pub(crate) use store::{LockStore, Updated};
pub(crate) use wake::Woken as Wake;
pub(crate) use world::{PresenceLock, World};
pub(crate) use writer::{Command, Reply, Shared, WorkOp, WorkReply, Writer};

/// This process's participation in the elections of many agent keys.
///
/// Calls that change something (`join`, `claim`, `release`, …) are
/// messages to the elector's one writer thread, which does all file I/O;
/// they block the caller until it answered (each file operation is bounded
/// by the configured lock wait). Reads (`is_leader`, `leader_flag`,
/// `status`, `joined`) never wait: they load the snapshot the writer
/// published.
///
/// Dropping it (or calling [`Elector::shutdown`]) releases every lock it
/// holds.
pub struct Elector {
    config: Config,
    id: InstanceId,
    shared: Arc<Shared>,
    mailbox: Mailbox<Command>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The network filesystem under the lock directory, if any.
    network_fs: Option<&'static str>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("instance_id", &self.id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// Validates `config` and starts the writer thread. `id` is this
    /// window's election id (see [`InstanceId::from_env_or_random`]).
    pub fn start(config: Config, id: InstanceId) -> Result<Self> {
        config.validate()?;
        let (dir, wait) = (config.lock_dir.clone(), config.lock_wait);
        let extended = config.mode == crate::Mode::Extended;
        let stores: StoreFactory = Box::new(move |pk| {
            let floor = extended.then(|| crate::epoch::epoch_path(&dir, pk));
            Box::new(FileStore::new(
                &dir,
                lockfile::lock_path(&dir, pk),
                wait,
                floor,
            )) as Box<dyn LockStore>
        });
        Self::start_with(config, id, stores)
    }

    fn start_with(config: Config, id: InstanceId, stores: StoreFactory) -> Result<Self> {
        let mut sources = WakeSources::new(&config.lock_dir).map_err(|e| Error::io("<poll>", e))?;
        if config.mode == crate::Mode::Extended {
            sources.watch_dir();
        }
        let mailbox = sources.mailbox();
        let shared = Arc::new(Shared {
            snapshot: Default::default(),
            events: broadcast::channel(1024).0,
        });
        let upper = Self::upper_level(&config, &id, &mailbox)?;
        let world = Box::new(world::SystemWorld::new(&config, sources, stores));
        let writer = Writer::new(
            config.clone(),
            Arc::from(id.as_str()),
            Arc::clone(&shared),
            world,
            upper,
        );
        let thread = std::thread::Builder::new()
            .name("nip-le-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| Error::io("<writer thread>", e))?;
        let network_fs = crate::host::network_fs(&config.lock_dir);
        if let Some(fs) = network_fs {
            tracing::warn!(
                lock_dir = %config.lock_dir.display(),
                "the lock directory is on a network filesystem ({fs}): flock may not exclude \
                 across hosts, and instances of other hosts are judged only by their records"
            );
        }
        Ok(Self {
            config,
            id,
            network_fs,
            shared,
            mailbox,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The level above the host, when one is configured.
    #[cfg(feature = "etcd")]
    fn upper_level(
        config: &Config,
        id: &InstanceId,
        mailbox: &Mailbox<Command>,
    ) -> Result<Option<Box<dyn upper::UpperLevel>>> {
        let Some(etcd) = config.etcd.clone() else {
            return Ok(None);
        };
        let mailbox = mailbox.clone();
        let tell = Box::new(move |pk, news| {
            let _ = mailbox.send(Msg::Command(Command::Upper(pk, news)));
        });
        let contender = crate::global::Contender::start(etcd, id.as_str(), config.stand_down, tell)
            .map_err(|e| Error::io("<etcd thread>", e))?;
        Ok(Some(Box::new(contender)))
    }

    #[cfg(not(feature = "etcd"))]
    fn upper_level(
        _: &Config,
        _: &InstanceId,
        _: &Mailbox<Command>,
    ) -> Result<Option<Box<dyn upper::UpperLevel>>> {
        Ok(None)
    }

    /// Sends a command and waits for the writer's answer.
    fn call<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.mailbox
            .send(Msg::Command(command(tx)))
            .map_err(|()| Error::ShutDown)?;
        answer(&rx)
    }

    /// This window's election id: pass it to spawned agent processes in
    /// `BUZZ_INSTANCE_ELECTION_ID`.
    pub fn instance_id(&self) -> &InstanceId {
        &self.id
    }

    /// The validated configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Extension: the network filesystem the lock directory sits on (NFS,
    /// SMB, …), if it does, as found at start (Linux). `flock` there may not
    /// exclude across hosts: tell the user (the plugin's status carries it,
    /// and a warning was logged).
    pub fn network_fs(&self) -> Option<&'static str> {
        self.network_fs
    }

    /// Subscribes to every later [`LeadershipChange`]. A receiver that falls
    /// more than 1024 changes behind gets `Lagged` and should re-read
    /// [`Elector::status`].
    pub fn subscribe(&self) -> broadcast::Receiver<LeadershipChange> {
        self.shared.events.subscribe()
    }

    /// Joins the election for `pubkey` and claims at once (auto-claim on
    /// launch). Returns the resulting leadership. Joining twice is a no-op.
    pub fn join(&self, pubkey: &AgentPubkey) -> Result<bool> {
        let led = self.call(|r| Command::Join(vec![*pubkey], r))?;
        Ok(led.first().copied().unwrap_or(false))
    }

    /// Joins several elections at once (the agents a window runs at
    /// launch): one message to the writer and, in extended mode, one update
    /// of our presence file for them all. Returns each key's leadership, in
    /// order.
    pub fn join_all(&self, pubkeys: &[AgentPubkey]) -> Result<Vec<bool>> {
        self.call(|r| Command::Join(pubkeys.to_vec(), r))
    }

    /// Leaves the election for `pubkey`, releasing the lock if we hold it.
    /// When it returns, nothing of ours for that key will be written again.
    pub fn leave(&self, pubkey: &AgentPubkey) -> Result<()> {
        self.call(|r| Command::Leave(*pubkey, r))
    }

    /// The keys joined, ordered.
    pub fn joined(&self) -> Vec<AgentPubkey> {
        self.shared.snapshot.keys()
    }

    /// The cached answer for `pubkey`: no syscall, no allocation, no lock.
    /// `false` for a key that was never joined (use
    /// [`Elector::leader_flag`] on hot paths to skip even the map lookup).
    #[inline]
    pub fn is_leader(&self, pubkey: &AgentPubkey) -> bool {
        self.shared.snapshot.is_leader(pubkey)
    }

    /// A handle whose [`LeaderFlag::is_leader`] is one or two atomic loads.
    pub fn leader_flag(&self, pubkey: &AgentPubkey) -> Result<LeaderFlag> {
        self.shared
            .snapshot
            .get(pubkey)
            .map(LeaderFlag)
            .ok_or(Error::NotJoined(*pubkey))
    }

    /// The user's claim: "this instance wants to lead" (the sidebar's
    /// claim). In extended mode co-located instances learn it through the
    /// local lead request, without a relay: the holder stands down on its
    /// next look and we take the lock on ours. In spec mode (the plain NIP,
    /// which touches nothing but the lock file) only the relay's
    /// `claim_leadership` frame reaches the holder: send it, and the claim
    /// completes when we take the lock the holder releases (`Pending` until
    /// then, for at most the stand-down timeout). Never evicts a live
    /// leader by force.
    pub fn claim(&self, pubkey: &AgentPubkey) -> Result<ClaimOutcome> {
        self.call(|r| Command::Claim(*pubkey, r))
    }

    /// Releases the lock if the file names us (never a successor's record)
    /// and stands down, so our own next tick does not take it straight back.
    /// Returns whether a record of ours was released. The stand-down
    /// expires like any other.
    pub fn release(&self, pubkey: &AgentPubkey) -> Result<bool> {
        self.call(|r| Command::Release(*pubkey, r))
    }

    /// NIP-LE `stand_down()` + `release()`: stop leading now (hard-steal:
    /// the change says cancel the in-flight turn) and suppress acquiring
    /// until [`Elector::resume`] or the stand-down timeout.
    pub fn stand_down(&self, pubkey: &AgentPubkey) -> Result<()> {
        self.call(|r| Command::StandDown(*pubkey, r))
    }

    /// Ends a stand-down and re-claims at once.
    pub fn resume(&self, pubkey: &AgentPubkey) -> Result<bool> {
        self.call(|r| Command::Resume(*pubkey, r))
    }

    /// Handles a relay-delivered control frame (decrypted JSON content) for
    /// `pubkey`. Authorisation (NIP-AO: only the agent's owner may send
    /// control frames) is the caller's job. Returns the `control_result` to
    /// send, if any:
    /// * we are the target → claim; `Some(claimed)` once we hold the lock,
    ///   else `None` and later looks retry (a [`ChangeReason::Claimed`]
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
        let claimed = self.call(|r| Command::ClaimFrame(*pubkey, target, r))?;
        Ok(claimed.then(ControlResult::claimed))
    }

    /// The work ledger of `pubkey`'s election (see [`Work`]).
    pub fn work(&self, pubkey: &AgentPubkey) -> Result<Work> {
        let cell = self
            .shared
            .snapshot
            .get(pubkey)
            .ok_or(Error::NotJoined(*pubkey))?;
        Ok(Work {
            pubkey: *pubkey,
            flag: LeaderFlag(cell),
            mailbox: self.mailbox.clone(),
        })
    }

    /// Runs one refresh of every key now, without waiting for the tick.
    pub fn refresh_now(&self) {
        let _ = self.call(Command::RefreshNow);
    }

    /// A snapshot of every joined key, ordered by pubkey. Never touches a
    /// file and never waits for the writer.
    pub fn status(&self) -> Vec<ElectionStatus> {
        self.shared.snapshot.statuses()
    }

    /// Releases every lock we hold and stops the writer and every wake
    /// source. Idempotent; when it returns, nothing of ours will be written
    /// again, and later calls that would touch files return
    /// [`Error::ShutDown`].
    pub fn shutdown(&self) {
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = thread.take() {
            let _ = self.call(Command::Shutdown);
            let _ = t.join();
        }
    }
}

/// Exactly-once work for one agent: which queued events this window must
/// dispatch, and the record of what it took and completed (see
/// [`crate::ledger`]). Every window queues every event; only the leader
/// takes.
///
/// ```no_run
/// # fn f(elector: &nip_le::Elector, agent: &nip_le::AgentPubkey) -> nip_le::Result<()> {
/// let work = elector.work(agent)?;
/// if work.take("event-id")?.granted() {
///     // run the agent turn; if `mustCancelTurn` arrives: work.give_back("event-id")
///     // send the reply, then at once:
///     work.done("event-id")?;
/// }
/// # Ok(()) }
/// ```
///
/// Calls wait for the writer (file I/O) except [`Work::may_act`]; each
/// first checks the leadership flag, so a window that is not (or no longer)
/// the leader gets its answer without any I/O.
#[derive(Debug, Clone)]
pub struct Work {
    pubkey: AgentPubkey,
    flag: LeaderFlag,
    mailbox: Mailbox<Command>,
}

impl Work {
    fn call<T>(&self, op: WorkOp, reply: impl FnOnce(Reply<T>) -> writer::WorkReply) -> Result<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.mailbox
            .send(Msg::Command(Command::Work(self.pubkey, op, reply(tx))))
            .map_err(|()| Error::ShutDown)?;
        answer(&rx)
    }

    /// Whether this window may act for the agent now: the hot-path fence
    /// (atomic loads and a coarse clock read, no allocation). Check it
    /// again right before sending a reply.
    #[inline]
    pub fn may_act(&self) -> bool {
        self.flag.is_leader()
    }

    /// Takes `id` for a turn: granted only to the leader, at its current
    /// epoch, and only if the event is neither done nor taken now.
    pub fn take(&self, id: &str) -> Result<TakeOutcome> {
        crate::ledger::validate_event_id(id)?;
        if !self.may_act() {
            return Ok(TakeOutcome::NotLeader);
        }
        self.call(WorkOp::Take(id.to_owned()), writer::WorkReply::Take)
    }

    /// Records that the reply to `id` was sent (one append). Refused
    /// (`false`) when this window no longer leads: the event is owed to
    /// the leader then.
    pub fn done(&self, id: &str) -> Result<bool> {
        crate::ledger::validate_event_id(id)?;
        if !self.may_act() {
            return Ok(false);
        }
        self.call(WorkOp::Done(id.to_owned()), writer::WorkReply::Flag)
    }

    /// Gives `id` back (its turn was cancelled): owed again, to whoever
    /// leads.
    pub fn give_back(&self, id: &str) -> Result<()> {
        crate::ledger::validate_event_id(id)?;
        self.call(WorkOp::GiveBack(id.to_owned()), writer::WorkReply::Flag)
            .map(|_| ())
    }

    /// Of `queue` (in order), the events this window must dispatch now:
    /// none unless it leads; otherwise those neither done nor taken now.
    /// After a predecessor that kept no ledger (a spec-mode instance or the
    /// harness), or one on another host (feature `etcd`: its ledger is not
    /// ours), events published before this window began to act are left
    /// out: it may have answered them.
    pub fn owed(&self, queue: &[QueuedEvent]) -> Result<Vec<String>> {
        if !self.may_act() {
            return Ok(Vec::new());
        }
        self.call(WorkOp::Owed(queue.to_vec()), writer::WorkReply::Owed)
    }
}

/// Waits for the writer's answer. Most answers come within tens of
/// microseconds: look for one a while before sleeping, so that the common
/// case does not pay a second thread wake-up.
fn answer<T>(rx: &mpsc::Receiver<Result<T>>) -> Result<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_micros(SPIN_MICROS);
    loop {
        match rx.try_recv() {
            Ok(r) => return r,
            Err(mpsc::TryRecvError::Disconnected) => return Err(Error::ShutDown),
            Err(mpsc::TryRecvError::Empty) if std::time::Instant::now() < deadline => {
                std::thread::yield_now()
            }
            Err(mpsc::TryRecvError::Empty) => break,
        }
    }
    rx.recv().unwrap_or(Err(Error::ShutDown))
}

/// How long a caller looks for the writer's answer before sleeping.
const SPIN_MICROS: u64 = 50;

impl Drop for Elector {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::machine::Write;
    use super::store::{FileStore, LockStore, Updated};
    use super::*;
    use crate::record::LockContent;

    /// A file store that notes the thread of every read and update.
    struct Recording {
        inner: FileStore,
        threads: Arc<Mutex<Vec<String>>>,
    }

    impl Recording {
        fn note(&self) {
            let name = std::thread::current().name().unwrap_or("?").to_owned();
            self.threads.lock().unwrap().push(name);
        }
    }

    impl LockStore for Recording {
        fn read(&self) -> Result<LockContent> {
            self.note();
            self.inner.read()
        }
        fn update(
            &mut self,
            decide: &mut dyn FnMut(&LockContent, u64) -> Write,
        ) -> Result<Updated> {
            self.note();
            self.inner.update(decide)
        }
    }

    #[test]
    fn lock_file_io_happens_on_the_writer_thread_only() {
        for mode in [crate::Mode::Extended, crate::Mode::Spec] {
            let tmp = tempfile::tempdir().unwrap();
            let mut c = Config::new(tmp.path());
            c.mode = mode;
            c.refresh = Duration::from_millis(50);
            c.stale = Duration::from_millis(500);
            c.lock_wait = Duration::from_millis(20);
            let threads = Arc::new(Mutex::new(Vec::new()));
            let (dir, t) = (tmp.path().to_owned(), Arc::clone(&threads));
            let stores: StoreFactory = Box::new(move |pk| {
                Box::new(Recording {
                    inner: FileStore::new(&dir, lockfile::lock_path(&dir, pk), c.lock_wait, None),
                    threads: Arc::clone(&t),
                }) as Box<dyn LockStore>
            });
            let e = Elector::start_with(c, InstanceId::new("me").unwrap(), stores).unwrap();
            let k = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
            // Every call the API has, from this (the "main") thread.
            e.join(&k).unwrap();
            e.join_all(&[k]).unwrap();
            let _ = (e.is_leader(&k), e.status(), e.joined(), e.leader_flag(&k));
            e.claim(&k).unwrap();
            e.release(&k).unwrap();
            e.resume(&k).unwrap();
            e.stand_down(&k).unwrap();
            e.handle_control_frame(&k, r#"{"type":"claim_leadership","targetInstanceId":"me"}"#)
                .unwrap();
            e.refresh_now();
            std::thread::sleep(Duration::from_millis(120)); // a few ticks
            e.leave(&k).unwrap();
            e.shutdown();
            let seen = threads.lock().unwrap().clone();
            assert!(
                seen.len() >= 8,
                "[{mode:?}] the store was used: {}",
                seen.len()
            );
            assert!(
                seen.iter().all(|n| n == "nip-le-writer"),
                "[{mode:?}] lock file I/O off the writer thread: {seen:?}"
            );
        }
    }

    /// A file store whose updates fail while `failing` is set, as on a
    /// disk that returns EIO: no write of ours can succeed.
    struct Failing {
        inner: FileStore,
        failing: Arc<std::sync::atomic::AtomicBool>,
    }

    impl LockStore for Failing {
        fn read(&self) -> Result<LockContent> {
            self.inner.read()
        }
        fn update(
            &mut self,
            decide: &mut dyn FnMut(&LockContent, u64) -> Write,
        ) -> Result<Updated> {
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::io("lock", std::io::Error::other("injected EIO")));
            }
            self.inner.update(decide)
        }
    }

    /// Whether `f` holds within `within`.
    fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
        let end = std::time::Instant::now() + within;
        while std::time::Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// The next change within `within`, if any.
    fn next_change(
        rx: &mut broadcast::Receiver<LeadershipChange>,
        within: Duration,
    ) -> Option<LeadershipChange> {
        let end = std::time::Instant::now() + within;
        while std::time::Instant::now() < end {
            if let Ok(c) = rx.try_recv() {
                return Some(c);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    #[test]
    fn fencing_and_unfencing_are_announced_and_agree_with_status() {
        let tmp = tempfile::tempdir().unwrap();
        // The validity (2.45 s after the last write) runs out half a
        // refresh before the next tick: only a wake-up at the deadline
        // itself announces the fencing in time.
        let mut c = Config::new(tmp.path());
        c.refresh = Duration::from_millis(1_000);
        c.stale = Duration::from_millis(2_500);
        c.lock_wait = Duration::from_millis(10);
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (dir, f) = (tmp.path().to_owned(), Arc::clone(&failing));
        let stores: StoreFactory = Box::new(move |pk| {
            Box::new(Failing {
                inner: FileStore::new(&dir, lockfile::lock_path(&dir, pk), c.lock_wait, None),
                failing: Arc::clone(&f),
            }) as Box<dyn LockStore>
        });
        let e = Elector::start_with(c, InstanceId::new("me").unwrap(), stores).unwrap();
        let k = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
        let mut rx = e.subscribe();
        assert!(e.join(&k).unwrap());
        let first = next_change(&mut rx, Duration::from_secs(1)).expect("join change");
        assert!(first.is_leader);
        failing.store(true, std::sync::atomic::Ordering::SeqCst);
        let flag = e.leader_flag(&k).unwrap();
        assert!(
            wait_for(Duration::from_secs(4), || !flag.is_leader()),
            "never fenced"
        );
        let fenced_at = std::time::Instant::now();
        let fenced = next_change(&mut rx, Duration::from_secs(2)).expect("no fenced change");
        let lag = fenced_at.elapsed();
        assert!(
            lag < Duration::from_millis(300),
            "fencing announced {lag:?} after is_leader turned false (at a tick, not at the deadline)"
        );
        assert_eq!(
            (fenced.is_leader, fenced.reason, fenced.must_cancel_turn),
            (false, ChangeReason::Fenced, true),
            "{fenced:?}"
        );
        assert!(!e.is_leader(&k));
        assert!(!e.status()[0].is_leader, "status and is_leader disagree");
        failing.store(false, std::sync::atomic::Ordering::SeqCst);
        let back = next_change(&mut rx, Duration::from_secs(3)).expect("no unfenced change");
        assert_eq!(
            (back.is_leader, back.reason, back.must_cancel_turn),
            (true, ChangeReason::Unfenced, false),
            "{back:?}"
        );
        assert!(e.is_leader(&k) && e.status()[0].is_leader);
        // Nothing else: one change each way.
        assert!(next_change(&mut rx, Duration::from_millis(300)).is_none());
    }

    /// A store whose every look panics, as a bug would.
    struct Panicking;

    impl LockStore for Panicking {
        fn read(&self) -> Result<LockContent> {
            panic!("a bug in the store");
        }
        fn update(
            &mut self,
            _decide: &mut dyn FnMut(&LockContent, u64) -> Write,
        ) -> Result<Updated> {
            panic!("a bug in the store");
        }
    }

    #[test]
    fn a_panic_in_one_key_costs_that_key_a_look_never_the_election_task() {
        let tmp = tempfile::tempdir().unwrap();
        let mut c = Config::new(tmp.path());
        c.refresh = Duration::from_millis(50);
        c.stale = Duration::from_millis(300);
        c.lock_wait = Duration::from_millis(10);
        let bad = AgentPubkey::parse(&"bd".repeat(32)).unwrap();
        let good = AgentPubkey::parse(&"60".repeat(32)).unwrap();
        let dir = tmp.path().to_owned();
        let stores: StoreFactory = Box::new(move |pk| {
            if *pk == bad {
                Box::new(Panicking) as Box<dyn LockStore>
            } else {
                Box::new(FileStore::new(
                    &dir,
                    lockfile::lock_path(&dir, pk),
                    c.lock_wait,
                    None,
                ))
            }
        });
        let e = Elector::start_with(c, InstanceId::new("me").unwrap(), stores).unwrap();
        e.join(&bad).unwrap();
        assert!(e.join(&good).unwrap(), "the healthy key leads");
        // Several ticks of the panicking key later, everything still answers.
        std::thread::sleep(Duration::from_millis(200));
        e.refresh_now();
        assert!(e.is_leader(&good));
        assert_eq!(e.claim(&good).unwrap(), ClaimOutcome::AlreadyLeader);
        let status = e.status();
        let bad_status = status.iter().find(|s| s.pubkey == bad).unwrap();
        assert!(
            bad_status
                .last_error
                .as_deref()
                .is_some_and(|m| m.contains("a bug in the store")),
            "{bad_status:?}"
        );
        e.leave(&good).unwrap();
        e.shutdown();
    }
}
