//! What wakes the writer, as owned handles it stops and closes itself:
//! commands from the facade (a mailbox and a [`mio::Waker`]), file events in
//! the lock directory, and the death of a holder we watch. The writer blocks
//! in one place, [`WakeSources::wait`], until one of them fires or its next
//! deadline comes.
//!
//! On Linux everything is one `mio::Poll`, with no helper thread:
//! * the watch is inotify, with masks of changes only: `MODIFY` on the lock
//!   file of each joined key, and `DELETE` and `MOVED_*` on the directory
//!   (a lead request renamed into place or removed, a presence file
//!   removed). Reads (ours and every peer's) wake nobody, a leader's refresh
//!   wakes only the observers of that key, once, and a peer creating or
//!   rewriting its presence file wakes nobody. The `notify` crate would also
//!   subscribe to `OPEN`, making every read in the directory wake every
//!   instance;
//! * a holder's death is a `pidfd` of the pid in its presence token: it
//!   becomes readable when that process has exited (after the kernel
//!   dropped its locks). It is opened only after the holder's presence lock
//!   was seen held, so the pid cannot have been recycled.
//!
//! On macOS the directory watch is the `notify` crate's watcher
//! (FSEvents), on Windows a `ReadDirectoryChangesW` of our own
//! (`windows_watch`: notify's wakes every 100 ms; run under Wine by the
//! test command), each owned and dropped by the writer; Linux with
//! [`Backend::Portable`] (the rest of their code, so that it is tested
//! here) watches what those report, changes and no opens, from a thread of
//! its own ([`change_watch`]). There a holder's death is a thread blocked on the holder process's exit
//! ([`holder_exit`]: a `pidfd`, `kqueue`'s `NOTE_EXIT`, the process handle),
//! stopped and joined when the watch is dropped. Where that cannot be had
//! (another platform, a pid that is not a process here, no `pidfd_open`),
//! a thread polls the holder's presence lock instead ([`holder_poll`]).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Weak};
use std::time::Duration;

#[cfg(target_os = "linux")]
use mio::Interest;
use mio::{Events, Poll, Token};

use crate::config::Backend;
use crate::lockfile;
use crate::presence;
use crate::pubkey::AgentPubkey;

#[cfg(target_os = "linux")]
mod change_watch;
mod dir_watch;
#[cfg(any(target_os = "linux", target_os = "macos", windows))]
mod holder_exit;
mod holder_poll;
#[cfg(windows)]
mod windows_watch;

use dir_watch::DirWatch;
#[cfg(any(target_os = "linux", target_os = "macos", windows))]
use holder_exit::{HolderExit, Started};
use holder_poll::HolderPoll;

const MAILBOX: Token = Token(0);
#[cfg(target_os = "linux")]
const DIR_WATCH: Token = Token(1);
/// Tokens of holder watches start here.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const FIRST_HOLDER: usize = 2;

/// A message to the writer.
#[derive(Debug)]
pub(crate) enum Msg<C> {
    /// A command from the facade.
    Command(C),
    /// Look at this key again (a file event or a holder's death reported by
    /// a helper thread).
    Key(AgentPubkey),
    /// Events were lost (the directory watch failed or asks for a
    /// rescan): look at every key.
    All,
    /// A holder is gone: its presence file was removed (reported by the
    /// directory watch) or its holder poll found it gone.
    PresenceGone(String),
}

/// How the facade and helper threads reach the writer. It holds the waker
/// weakly: when the writer is gone, so is its eventfd.
pub(crate) struct Mailbox<C> {
    tx: mpsc::Sender<Msg<C>>,
    waker: Weak<mio::Waker>,
}

impl<C> std::fmt::Debug for Mailbox<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").finish_non_exhaustive()
    }
}

impl<C> Clone for Mailbox<C> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            waker: Weak::clone(&self.waker),
        }
    }
}

impl<C> Mailbox<C> {
    /// Queues `msg` and wakes the writer. Fails once the writer is gone.
    pub(crate) fn send(&self, msg: Msg<C>) -> Result<(), ()> {
        self.tx.send(msg).map_err(|_| ())?;
        // The queue holds the message; a failed wake-up only means the
        // writer is gone, and then nobody reads the queue either.
        if let Some(w) = self.waker.upgrade() {
            let _ = w.wake();
        }
        Ok(())
    }
}

/// Everything one `wait` returned.
#[derive(Debug)]
pub(crate) struct Woken<C> {
    /// Commands, in the order they were sent.
    pub commands: Vec<C>,
    /// Keys to look at again.
    pub keys: BTreeSet<AgentPubkey>,
    /// Events were lost (the watch overflowed): look at every key.
    pub all: bool,
    /// Tokens of presence files that were removed. An elector that shuts
    /// down without its process exiting removes its presence file, which no
    /// `pidfd` reports.
    gone: Vec<String>,
}

impl<C> Woken<C> {
    /// Commands and keys to look at, as a world other than `mio` (the
    /// simulator's) hands them over.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn of(commands: Vec<C>, keys: BTreeSet<AgentPubkey>) -> Self {
        Self {
            commands,
            keys,
            ..Self::default()
        }
    }
}

impl<C> Default for Woken<C> {
    fn default() -> Self {
        Self {
            commands: Vec::new(),
            keys: BTreeSet::new(),
            all: false,
            gone: Vec::new(),
        }
    }
}

/// The writer's wake sources.
pub(crate) struct WakeSources<C> {
    poll: Poll,
    _waker: Arc<mio::Waker>,
    events: Events,
    rx: mpsc::Receiver<Msg<C>>,
    mailbox: Mailbox<C>,
    dir: PathBuf,
    dir_watch: Option<DirWatch>,
    /// One watch per holder (a holder usually holds several keys), with the
    /// keys it holds in our view.
    holders: HashMap<String, Watched>,
    /// The holder token each key is watching.
    holder_of: HashMap<AgentPubkey, String>,
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    next_token: usize,
    /// Which platform code runs.
    backend: Backend,
    /// How often a holder poll probes.
    holder_poll: Duration,
}

impl<C: Send + 'static> WakeSources<C> {
    /// The mailbox only (spec mode: the tick is the only other clock);
    /// the watches, when asked for, run `backend`'s code and poll a
    /// holder every `holder_poll` where they poll.
    pub(crate) fn new(
        dir: &Path,
        backend: Backend,
        holder_poll: Duration,
    ) -> std::io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), MAILBOX)?);
        let (tx, rx) = mpsc::channel();
        let mailbox = Mailbox {
            tx,
            waker: Arc::downgrade(&waker),
        };
        Ok(Self {
            poll,
            _waker: waker,
            events: Events::with_capacity(64),
            rx,
            mailbox,
            dir: dir.to_owned(),
            dir_watch: None,
            holders: HashMap::new(),
            holder_of: HashMap::new(),
            next_token: FIRST_HOLDER,
            backend,
            holder_poll,
        })
    }

    /// A handle that reaches the writer.
    pub(crate) fn mailbox(&self) -> Mailbox<C> {
        self.mailbox.clone()
    }

    /// Extension: watch the lock directory, so any write to a lock file or
    /// lead request is seen at once. Returns whether watching is on; without
    /// it the refresh tick stays the bound.
    pub(crate) fn watch_dir(&mut self) -> bool {
        if let Err(e) = lockfile::ensure_dir(&self.dir) {
            tracing::warn!("not watching {}: {e}", self.dir.display());
            return false;
        }
        match DirWatch::start(&self.dir, &self.poll, self.mailbox.clone(), self.backend) {
            Ok(w) => {
                self.dir_watch = Some(w);
                true
            }
            Err(e) => {
                tracing::warn!("directory watch unavailable, the tick is the bound: {e}");
                false
            }
        }
    }

    /// Blocks until something arrives or `timeout` passes (`None`: no
    /// deadline), then returns everything that is there.
    pub(crate) fn wait(&mut self, timeout: Option<Duration>) -> Woken<C> {
        let mut out = Woken::default();
        if let Err(e) = self.poll.poll(&mut self.events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!("poll failed: {e}");
                // Never spin: behave as if the deadline came.
                std::thread::sleep(
                    timeout
                        .unwrap_or(Duration::from_millis(100))
                        .min(Duration::from_millis(100)),
                );
            }
        }
        let ready: Vec<Token> = self.events.iter().map(|e| e.token()).collect();
        for token in ready {
            match token {
                MAILBOX => {}
                #[cfg(target_os = "linux")]
                DIR_WATCH => {
                    if let Some(w) = self.dir_watch.as_mut() {
                        w.read(&mut out);
                    }
                }
                #[cfg(target_os = "linux")]
                t => self.pidfd_ready(t, &mut out),
                #[cfg(not(target_os = "linux"))]
                _ => {}
            }
        }
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                Msg::Command(c) => out.commands.push(c),
                Msg::Key(k) => {
                    out.keys.insert(k);
                }
                Msg::PresenceGone(token) => out.gone.push(token),
                Msg::All => out.all = true,
            }
        }
        // A watched holder that left without exiting (or whose holder poll
        // returned): stop trusting the watch and look again.
        for token in std::mem::take(&mut out.gone) {
            self.holder_gone(&token, &mut out);
        }
        out
    }

    /// Wakes every key `token` held and drops its watch.
    fn holder_gone(&mut self, token: &str, out: &mut Woken<C>) {
        if let Some(w) = self.holders.remove(token) {
            for k in &w.keys {
                self.holder_of.remove(k);
                out.keys.insert(*k);
            }
            w.watch.stop(&self.poll);
        }
    }

    /// Watches `pubkey`'s lock file for writes, if it exists and is not
    /// watched yet (Linux; elsewhere the directory watch sees everything).
    pub(crate) fn watch_lock_file(&mut self, pubkey: &AgentPubkey, path: &Path) {
        if let Some(w) = self.dir_watch.as_mut() {
            w.watch_file(pubkey, path);
        }
    }

    /// Stops watching `pubkey`'s lock file.
    pub(crate) fn unwatch_lock_file(&mut self, pubkey: &AgentPubkey) {
        if let Some(w) = self.dir_watch.as_mut() {
            w.unwatch_file(pubkey);
        }
    }

    /// Watches the holder of `pubkey`'s lock (its presence `token`) for its
    /// death, replacing any earlier watch of that key; `None` stops
    /// watching. Keys held by the same holder share one watch.
    pub(crate) fn watch_holder(&mut self, pubkey: &AgentPubkey, token: Option<&str>) {
        if self.holder_of.get(pubkey).map(String::as_str) == token {
            return;
        }
        if let Some(old) = self.holder_of.remove(pubkey) {
            let empty = self.holders.get_mut(&old).is_some_and(|w| {
                w.keys.remove(pubkey);
                w.keys.is_empty()
            });
            if empty {
                if let Some(w) = self.holders.remove(&old) {
                    w.watch.stop(&self.poll);
                }
            }
        }
        let Some(token) = token.filter(|t| presence::valid_token(t)) else {
            return;
        };
        if !self.holders.contains_key(token) {
            // The holder may be gone since the look: a pidfd of an exited
            // process is readable at once, a poll reports it at its first probe,
            // and a process already reaped makes the watch fail: look again
            // then.
            match self.start_holder_watch(token) {
                Some(watch) => {
                    let keys = BTreeSet::new();
                    self.holders
                        .insert(token.to_owned(), Watched { watch, keys });
                }
                None => {
                    let _ = self.mailbox.send(Msg::Key(*pubkey));
                    return;
                }
            }
        }
        if let Some(w) = self.holders.get_mut(token) {
            w.keys.insert(*pubkey);
            self.holder_of.insert(*pubkey, token.to_owned());
        }
    }

    /// Whether the holder with `token` is watched (for any key): its death
    /// will wake us, so it is alive until then.
    pub(crate) fn watching(&self, token: &str) -> bool {
        self.holders.contains_key(token)
    }

    /// A watch on the death of the holder of `token`; `None` if it is gone
    /// already (look again).
    fn start_holder_watch(&mut self, token: &str) -> Option<HolderWatch> {
        #[cfg(target_os = "linux")]
        if self.backend.linux_fast_paths() {
            match self.start_pidfd(token) {
                Ok(w) => return Some(w),
                Err(Gone) => return None,
                Err(Unwatchable) => return self.start_holder_poll(token),
            }
        }
        #[cfg(any(target_os = "linux", target_os = "macos", windows))]
        match HolderExit::start(
            self.dir.clone(),
            token.to_owned(),
            self.holder_poll,
            self.mailbox.clone(),
        ) {
            Started::Watching(w) => return Some(HolderWatch::Exit(w)),
            Started::Gone => return None,
            Started::Unsupported => {}
        }
        self.start_holder_poll(token)
    }

    /// Native Linux: the holder's `pidfd` in our own `mio::Poll`.
    #[cfg(target_os = "linux")]
    fn start_pidfd(&mut self, token: &str) -> Result<HolderWatch, NoPidfd> {
        let pid = presence::token_pid(token).ok_or(Unwatchable)?;
        match pidfd::open(pid) {
            Ok(fd) => {
                let t = Token(self.next_token);
                self.next_token += 1;
                use std::os::fd::AsRawFd;
                let raw = fd.as_raw_fd();
                self.poll
                    .registry()
                    .register(&mut mio::unix::SourceFd(&raw), t, Interest::READABLE)
                    .map_err(|_| Unwatchable)?;
                Ok(HolderWatch::Pidfd { mio: t, fd })
            }
            // The process is gone already.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(Gone),
            Err(_) => Err(Unwatchable),
        }
    }

    fn start_holder_poll(&mut self, token: &str) -> Option<HolderWatch> {
        let poll = HolderPoll::start(
            self.dir.clone(),
            token.to_owned(),
            self.holder_poll,
            self.mailbox.clone(),
        );
        if poll.is_none() {
            tracing::warn!(
                "cannot start a holder watch thread; the refresh tick remains the bound"
            );
        }
        poll.map(HolderWatch::Poll)
    }

    /// The pidfd with this mio token became readable: its process exited.
    #[cfg(target_os = "linux")]
    fn pidfd_ready(&mut self, t: Token, out: &mut Woken<C>) {
        let token = self
            .holders
            .iter()
            .find(|(_, w)| matches!(w.watch, HolderWatch::Pidfd { mio, .. } if mio == t))
            .map(|(k, _)| k.clone());
        if let Some(token) = token {
            self.holder_gone(&token, out);
        }
    }

    /// Stops every holder watch and the directory watch.
    pub(crate) fn stop_all(&mut self) {
        self.holder_of.clear();
        for (_, w) in self.holders.drain() {
            w.watch.stop(&self.poll);
        }
        if let Some(w) = self.dir_watch.take() {
            w.stop(&self.poll);
        }
    }
}

/// A watch on one holder's death, and the keys it holds in our view.
struct Watched {
    watch: HolderWatch,
    keys: BTreeSet<AgentPubkey>,
}

/// Why native Linux has no `pidfd` of a holder.
#[cfg(target_os = "linux")]
enum NoPidfd {
    /// Its process is gone already.
    Gone,
    /// No `pidfd_open`, or no pid in the token: poll.
    Unwatchable,
}
#[cfg(target_os = "linux")]
use NoPidfd::{Gone, Unwatchable};

/// A watch on one holder's death.
enum HolderWatch {
    #[cfg(target_os = "linux")]
    Pidfd {
        mio: Token,
        fd: std::os::fd::OwnedFd,
    },
    #[cfg(any(target_os = "linux", target_os = "macos", windows))]
    Exit(HolderExit),
    Poll(HolderPoll),
}

impl HolderWatch {
    fn stop(self, poll: &Poll) {
        match self {
            #[cfg(target_os = "linux")]
            HolderWatch::Pidfd { fd, .. } => {
                use std::os::fd::AsRawFd;
                let raw = fd.as_raw_fd();
                let _ = poll.registry().deregister(&mut mio::unix::SourceFd(&raw));
                drop(fd);
            }
            #[cfg(any(target_os = "linux", target_os = "macos", windows))]
            HolderWatch::Exit(w) => {
                let _ = poll;
                w.stop();
            }
            HolderWatch::Poll(p) => {
                let _ = poll;
                p.stop();
            }
        }
    }
}

#[cfg(target_os = "linux")]
mod pidfd {
    use std::os::fd::{FromRawFd, OwnedFd};

    /// `pidfd_open(pid, 0)`: an fd that becomes readable when `pid` exits.
    pub(super) fn open(pid: u32) -> std::io::Result<OwnedFd> {
        let pid = libc::pid_t::try_from(pid)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: a plain syscall with integer arguments; on success it
        // returns a new fd that we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the syscall just returned this fd to us alone.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }
}

/// What a file name in the lock directory is about.
#[derive(Debug, PartialEq, Eq)]
enum NameEvent {
    /// `<pubkey>.lock` or `<pubkey>.claim`.
    Key(AgentPubkey),
    /// `<token>.live`.
    Presence(String),
}

/// Posts what a change to `name` in the lock directory means, from a
/// watcher's own thread: a key to look at, or a departed elector.
fn post_name<C>(mailbox: &Mailbox<C>, name: &str, removed: bool) {
    match name_event(name) {
        Some(NameEvent::Key(k)) => {
            let _ = mailbox.send(Msg::Key(k));
        }
        Some(NameEvent::Presence(token)) if removed => {
            let _ = mailbox.send(Msg::PresenceGone(token));
        }
        _ => {}
    }
}

fn name_event(name: &str) -> Option<NameEvent> {
    if let Some(token) = presence::departed_token_of_name(name) {
        return Some(NameEvent::Presence(token.to_owned()));
    }
    let stem = name
        .strip_suffix(".lock")
        .or_else(|| name.strip_suffix(".claim"))?;
    AgentPubkey::parse(stem).ok().map(NameEvent::Key)
}

#[cfg(test)]
mod tests;
