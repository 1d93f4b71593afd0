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
//! * `global_level`: the seam for the global level (etcd, feature `etcd`);
//! * this file: the facade, [`Elector`], whose calls are messages to the
//!   writer or reads of the published snapshot.

pub(crate) mod agent_hold;
pub(crate) mod cache;
mod command;
pub(crate) mod global_level;
mod machine;
mod profile;
pub(crate) mod store;
pub mod types;
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

use profile::Profile;
use store::StoreFactory;
use store::{FileStore, LockStore};
use wake::{Mailbox, Msg, WakeSources};

pub(crate) use writer::{Command, Reply, Shared, WorkOp, Writer};

// The seam the simulator drives the real writer through.
#[cfg(feature = "sim")]
pub(crate) use machine::{Now, Write};
#[cfg(feature = "sim")]
pub(crate) use store::Updated;
#[cfg(feature = "sim")]
pub(crate) use wake::Woken as Wake;
#[cfg(feature = "sim")]
pub(crate) use world::{PresenceLock, World};
pub(crate) use writer::unix_ms as writer_unix_ms;
#[cfg(feature = "sim")]
pub(crate) use writer::WorkReply;

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
    /// The lock files of `config`'s directory as the store of each key.
    pub(crate) fn file_stores(config: &Config) -> StoreFactory {
        let (dir, wait) = (config.lock_dir.clone(), config.lock_wait);
        let epochs = Profile::of(config.mode).epochs;
        Box::new(move |pk| {
            let floor = epochs.then(|| crate::epoch::epoch_path(&dir, pk));
            Box::new(FileStore::new(
                &dir,
                lockfile::lock_path(&dir, pk),
                wait,
                floor,
            )) as Box<dyn LockStore>
        })
    }

    /// Validates `config` and starts the writer thread with `stores` and
    /// the global level that `global_level` builds (see `crate::start`).
    pub(crate) fn start_with(
        config: Config,
        id: InstanceId,
        stores: StoreFactory,
        global_level: global_level::GlobalBuilder,
    ) -> Result<Self> {
        config.validate()?;
        let mut sources = WakeSources::new(&config.lock_dir, config.backend, config.holder_poll())
            .map_err(|e| Error::io("<poll>", e))?;
        if Profile::of(config.mode).watch {
            sources.watch_dir();
        }
        let mailbox = sources.mailbox();
        let shared = Arc::new(Shared::new());
        let tell_mailbox = mailbox.clone();
        let tell: global_level::Tell = Box::new(move |pk, news| {
            let _ = tell_mailbox.send(Msg::Command(Command::Global(pk, news)));
        });
        let renewed_mailbox = std::sync::Mutex::new(mailbox.clone());
        let renewed: global_level::TellRenewed = Arc::new(move |pk, r| {
            let tx = renewed_mailbox.lock().unwrap_or_else(|p| p.into_inner());
            let _ = tx.send(Msg::Command(Command::Renewed(pk, r)));
        });
        let global_level = global_level(tell, renewed)?;
        let world = Box::new(world::SystemWorld::new(&config, sources, stores));
        let writer = Writer::new(
            config.clone(),
            Arc::from(id.as_str()),
            Arc::clone(&shared),
            world,
            global_level,
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

    /// Sends a command and waits for the writer's answer.
    fn call<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.mailbox
            .send(Msg::Command(command(tx)))
            .map_err(|()| Error::ShutDown)?;
        answer(&rx)
    }

    /// This window's instance id: pass it to spawned agent processes in
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

    /// Whether we lead `pubkey` now, looked up on every call: unlike a
    /// [`LeaderFlag`] it follows the key across a leave and a new join.
    pub(crate) fn leader_view(&self, pubkey: &AgentPubkey) -> LeaderView {
        LeaderView {
            shared: Arc::clone(&self.shared),
            pubkey: *pubkey,
        }
    }

    /// The mark a runner of `pubkey`'s agent keeps while its agent runs
    /// (see [`agent_hold`]).
    pub(crate) fn agent_hold(&self, pubkey: &AgentPubkey) -> agent_hold::AgentHold {
        agent_hold::AgentHold::new(
            *pubkey,
            self.shared.agents.mark(pubkey),
            self.mailbox.clone(),
        )
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
    /// epoch, and only if the event is neither done nor taken now, once
    /// its line is on disk ([`TakeOutcome::Unavailable`] while the disk
    /// refuses it: ask again in a moment). Prefer [`Work::take_event`],
    /// which says when the event was published.
    pub fn take(&self, id: &str) -> Result<TakeOutcome> {
        self.take_published(id, None)
    }

    /// [`Work::take`] of a queued event, with when it was published: the
    /// ledger can then mark it settled once answered instead of keeping
    /// its id (a busy agent's ledger stays bounded without forgetting an
    /// answer), and an event published before that mark is
    /// [`TakeOutcome::Done`].
    pub fn take_event(&self, event: &QueuedEvent) -> Result<TakeOutcome> {
        self.take_published(&event.id, event.published_ms)
    }

    fn take_published(&self, id: &str, published_ms: Option<u64>) -> Result<TakeOutcome> {
        crate::ledger::validate_event_id(id)?;
        if !self.may_act() {
            return Ok(TakeOutcome::NotLeader);
        }
        let op = WorkOp::Take(id.to_owned(), published_ms);
        self.call(op, writer::WorkReply::Take)
    }

    /// Records that the reply to `id` was sent (one append). Accepted from
    /// the window that took `id` whatever its leadership is by now (its
    /// reply may have been on its way while leadership moved: the take is
    /// fenced, not the done), and from the leader; refused (`false`)
    /// otherwise.
    pub fn done(&self, id: &str) -> Result<bool> {
        crate::ledger::validate_event_id(id)?;
        self.call(WorkOp::Done(id.to_owned()), writer::WorkReply::Flag)
    }

    /// Gives `id` back (its turn was cancelled): owed again, to whoever
    /// leads. Accepted from the window that took it, whatever its
    /// leadership; until then (or until that window ends) the event stays
    /// in flight there and nobody else is owed it.
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
    /// out: it may have answered them; but not those queued after the
    /// first call while it acts (a `published_ms` is the sender's clock),
    /// nor those the ledger shows taken by a window that is gone, or given
    /// back. Pass the whole queue every time.
    pub fn owed(&self, queue: &[QueuedEvent]) -> Result<Vec<String>> {
        if !self.may_act() {
            return Ok(Vec::new());
        }
        let queue = std::sync::Arc::new(queue.to_vec());
        self.call(WorkOp::Owed(queue), writer::WorkReply::Owed)
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
mod tests;

/// See [`Elector::leader_view`].
#[derive(Debug, Clone)]
pub(crate) struct LeaderView {
    shared: Arc<Shared>,
    pubkey: AgentPubkey,
}

impl LeaderView {
    /// Whether we may act for the key now (false while it is not joined).
    pub(crate) fn is_leader(&self) -> bool {
        self.shared.snapshot.is_leader(&self.pubkey)
    }

    /// Whether we lead our host for the key, whatever the global level says
    /// (false while it is not joined, and while we step down).
    pub(crate) fn leads_host(&self) -> bool {
        self.shared
            .snapshot
            .get(&self.pubkey)
            .is_some_and(|c| c.is_set_leader())
    }
}
