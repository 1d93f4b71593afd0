//! The contender: for the keys this instance leads on its host, it holds,
//! renews, hands over and watches the agents' etcd keys (see the module
//! docs of [`crate::global`]).
//!
//! One concept per file: [`task`] is the machine (its state, what it does
//! on each input, on an injected clock, no thread), `moves` (take and keep
//! a key), `claims` (across hosts), `leaving` (give a key up), `changes`
//! (what the watch brings) and `fallback` (etcd's silence) its decisions,
//! `calls` the one place their calls on an [`Etcd`] behind a trait are
//! made, [`watch`] how a watch stream becomes inputs; this file is the
//! shell an app runs: one thread for the
//! task, one watch per agent the writer told of (its keys only: no
//! window reads another agent's work records), all fed through one
//! channel, the watches' share of it bounded, and a [`renewer`] that
//! keeps the leases alive while the task is busy with work records. Each
//! kind of thread has a connection of its own. Every etcd
//! call is bounded by a timeout, and a permit ends on its own at the
//! lease's deadline whether or not a thread is running. The task only
//! tells the writer: the writer alone sets permits.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::elector::global_level::{GlobalLevel, Tell, TellRenewed};
use crate::elector::GlobalHolder;
use crate::pubkey::AgentPubkey;

use super::etcd::{Change, Etcd, Kv};
use super::grpc::Grpc;
use super::EtcdConfig;

mod calls;
mod changes;
mod claims;
mod entry;
mod fallback;
mod leaving;
mod losses;
mod moves;
mod outbox;
// The phases named, with what each allows: read by the simulator's phase
// check (H3) and the unit tests.
#[cfg(any(test, feature = "sim"))]
mod phase;
pub(crate) mod renewer;
pub(crate) mod task;
pub(crate) mod watch;
pub(crate) mod work;

#[cfg(feature = "sim")]
pub(crate) use task::Clock;
pub(crate) use task::{SystemClock, Task};

/// The value of a leader or claim key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Value {
    host_id: String,
    instance_id: String,
}

/// The holder a key names; a value we cannot read names nobody we know.
pub(crate) fn holder_of(kv: &Kv) -> GlobalHolder {
    let v: Option<Value> = serde_json::from_slice(&kv.value).ok();
    GlobalHolder {
        host_id: v.as_ref().map_or_else(String::new, |v| v.host_id.clone()),
        instance_id: v.map_or_else(String::new, |v| v.instance_id),
        revision: kv.mod_revision,
    }
}

/// One input of the task.
#[derive(Debug)]
pub(crate) enum Inbox {
    /// The writer leads its host for the key now, or stopped (see
    /// [`GlobalLevel::host_leader`]).
    Lead {
        pk: AgentPubkey,
        leads: bool,
        /// We hold the host's lock file: a fail-safe host leader (no lock)
        /// never continues a sibling's key.
        locked: bool,
        revoke: bool,
        tenure: u64,
    },
    /// The user claims the key for this window.
    Claim(AgentPubkey),
    /// The writer closed the permit it was asked to confirm.
    Withdrawn(AgentPubkey),
    /// The writer granted a take of event `id`.
    Took { pk: AgentPubkey, id: String },
    /// A take of ours ended: done, or given back.
    Settled {
        pk: AgentPubkey,
        id: String,
        done: bool,
    },
    /// The watch (re)started without a known revision: look again.
    Synced,
    /// A change the watch saw.
    Change(Change),
}

/// What the writer keeps: the channel to the task's thread.
pub(crate) struct Contender {
    host_id: String,
    tx: mpsc::Sender<Message>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    cfg: EtcdConfig,
    /// The client the watches use.
    watches: Arc<dyn Etcd>,
    /// The agents a watch follows.
    watched: HashSet<AgentPubkey>,
    /// Watch inputs sent and not yet taken by the task.
    backlog: Arc<AtomicUsize>,
}

/// The most watch inputs waiting for the task: past it a watch stops
/// reading (etcd keeps the rest, or ends the watch, which resumes from
/// where it left off), so a burst of changes never grows memory without
/// bound while the task is busy.
const MAX_WATCH_BACKLOG: usize = 1024;

/// The clients of a contender's threads: one each, so that no kind of
/// call waits behind another's on one connection.
pub(crate) struct Clients {
    /// The task's.
    pub calls: Arc<dyn Etcd>,
    /// The watches'.
    pub watches: Arc<dyn Etcd>,
    /// The renewer's (`None`: no renewer runs).
    pub renewals: Option<Arc<dyn Etcd>>,
}

/// The longest [`GlobalLevel::shutdown`] waits for the leases to be given up.
pub(crate) const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);

/// What the task's thread receives.
enum Message {
    In(Inbox),
    /// From a watch (counted in the backlog).
    Watched(Inbox),
    Shutdown(mpsc::SyncSender<()>),
}

impl Contender {
    /// Starts the contender and its watch for `cfg` (validated), on etcd's
    /// gRPC API.
    /// `retention`: how long etcd keeps the agent's done records.
    /// `lock_dir`: where the host keeps what its windows saw of etcd.
    pub(crate) fn start(
        cfg: EtcdConfig,
        our_id: &str,
        (stand_down, retention): (Duration, Duration),
        tell: (Tell, TellRenewed),
        lock_dir: &std::path::Path,
    ) -> std::io::Result<Self> {
        let timeout = (cfg.ttl / 4).min(Duration::from_secs(1));
        let clients = Clients {
            calls: Arc::new(Grpc::new(&cfg, timeout)),
            watches: Arc::new(Grpc::new(&cfg, Duration::from_secs(1))),
            renewals: Some(Arc::new(Grpc::new(&cfg, timeout))),
        };
        let seen = Some(super::seen::path_in(lock_dir));
        Self::start_on(cfg, our_id, (stand_down, retention), tell, clients, seen)
    }

    /// [`Contender::start`] on any etcd clients; what was seen of etcd
    /// kept in `seen` (`None`: not kept).
    pub(crate) fn start_on(
        cfg: EtcdConfig,
        our_id: &str,
        (stand_down, retention): (Duration, Duration),
        (tell, renewed): (Tell, TellRenewed),
        clients: Clients,
        seen: Option<std::path::PathBuf>,
    ) -> std::io::Result<Self> {
        let Clients {
            calls,
            watches,
            renewals,
        } = clients;
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let mut task = Task::new(
            cfg.clone(),
            our_id,
            stand_down,
            calls,
            tell,
            Box::new(SystemClock),
        );
        task.retention = retention;
        if let Some(p) = &seen {
            task.remember(super::seen::read(p));
        }
        if let Some(etcd) = renewals {
            let leases = Arc::new(renewer::Leases::default());
            task.leases = Some(Arc::clone(&leases));
            let (cfg, our_id, stop) = (cfg.clone(), our_id.to_owned(), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("nip-le-etcd-renew".into())
                .spawn(move || renewer::run(&leases, &*etcd, (&cfg, &our_id), &renewed, &stop))?;
        }
        let backlog = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&backlog);
        let thread = std::thread::Builder::new()
            .name("nip-le-etcd".into())
            .spawn(move || run(task, &rx, &counted, seen.as_deref()))?;
        Ok(Self {
            host_id: cfg.host_id.clone(),
            tx,
            thread: Some(thread),
            stop,
            cfg,
            watches,
            watched: HashSet::new(),
            backlog,
        })
    }

    /// Follows `pk`'s keys from now on (once per agent).
    fn watch(&mut self, pk: AgentPubkey) {
        if !self.watched.insert(pk) {
            return;
        }
        let (tx, stop, backlog) = (
            self.tx.clone(),
            Arc::clone(&self.stop),
            Arc::clone(&self.backlog),
        );
        let (cfg, gw) = (self.cfg.clone(), Arc::clone(&self.watches));
        let spawned = std::thread::Builder::new()
            .name("nip-le-etcd-watch".into())
            .spawn(move || {
                let prefix = format!("{}/{pk}/", cfg.prefix);
                watch::follow(&*gw, &prefix, &stop, |i| {
                    room(&backlog, &stop) && tx.send(Message::Watched(i)).is_ok()
                })
            });
        if let Err(e) = spawned {
            // Without a watch the task still looks at etcd every half TTL.
            tracing::warn!(pubkey = %pk, "etcd watch: no thread: {e}");
            self.watched.remove(&pk);
        }
    }

    fn send(&self, i: Inbox) {
        let _ = self.tx.send(Message::In(i));
    }
}

/// Waits until the watches' backlog is under [`MAX_WATCH_BACKLOG`] and
/// counts one more input in it; `false`: stopping.
fn room(backlog: &AtomicUsize, stop: &AtomicBool) -> bool {
    while backlog.load(Ordering::Acquire) >= MAX_WATCH_BACKLOG {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    backlog.fetch_add(1, Ordering::AcqRel);
    true
}

/// The task's thread: each input, then whatever is due, until shutdown.
fn run(
    mut task: Task,
    rx: &mpsc::Receiver<Message>,
    backlog: &AtomicUsize,
    seen: Option<&std::path::Path>,
) {
    let keep = |task: &mut Task| {
        if let (Some(p), Some(s)) = (seen, task.seen_to_keep()) {
            if let Err(e) = super::seen::keep(p, s) {
                tracing::debug!("{}: {e}", p.display());
            }
        }
    };
    loop {
        keep(&mut task);
        let wait = task.wait();
        let first = match rx.recv_timeout(wait) {
            Ok(m) => Some(m),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        // Everything that waited is taken in together (see
        // `Task::step_all`), up to a shutdown.
        let (mut inputs, mut shutdown) = (Vec::new(), None);
        for m in first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        {
            match m {
                Message::Shutdown(done) => {
                    shutdown = Some(done);
                    break;
                }
                Message::In(i) => inputs.push(i),
                Message::Watched(i) => {
                    backlog.fetch_sub(1, Ordering::AcqRel);
                    inputs.push(i);
                }
            }
        }
        task.step_all(inputs);
        task.list_leases();
        if let Some(done) = shutdown {
            task.give_up_all();
            keep(&mut task);
            let _ = done.send(());
            return;
        }
    }
}

impl GlobalLevel for Contender {
    fn host_id(&self) -> &str {
        &self.host_id
    }

    fn host_leader(
        &mut self,
        pk: AgentPubkey,
        leads: bool,
        locked: bool,
        revoke: bool,
        tenure: u64,
    ) {
        self.watch(pk);
        self.send(Inbox::Lead {
            pk,
            leads,
            locked,
            revoke,
            tenure,
        });
    }

    fn claim(&mut self, pk: AgentPubkey) {
        self.send(Inbox::Claim(pk));
    }

    fn withdrawn(&mut self, pk: AgentPubkey) {
        self.send(Inbox::Withdrawn(pk));
    }

    fn took(&mut self, pk: AgentPubkey, id: &str) {
        let id = id.to_owned();
        self.send(Inbox::Took { pk, id });
    }

    fn settled(&mut self, pk: AgentPubkey, id: &str, done: bool) {
        let id = id.to_owned();
        self.send(Inbox::Settled { pk, id, done });
    }

    /// Gives every lease up, waiting at most [`SHUTDOWN_WAIT`]: an app's
    /// exit never hangs on etcd. A lease not given up in time runs out on
    /// its own (one TTL), and the writer closed every permit before this.
    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        let (tx, rx) = mpsc::sync_channel(1);
        let done =
            self.tx.send(Message::Shutdown(tx)).is_ok() && rx.recv_timeout(SHUTDOWN_WAIT).is_ok();
        let Some(t) = self.thread.take() else {
            return;
        };
        if done || t.is_finished() {
            let _ = t.join();
        } else {
            tracing::warn!("etcd contender: giving the leases up took too long; they will expire");
        }
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

#[cfg(test)]
mod tests;
