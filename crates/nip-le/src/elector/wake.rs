//! What wakes the writer, as owned handles it stops and closes itself:
//! commands from the facade (a mailbox and a [`mio::Waker`]), file events in
//! the lock directory, and the death of a holder we watch. The writer blocks
//! in one place, [`WakeSources::wait`], until one of them fires or its next
//! deadline comes.
//!
//! On Linux everything is one `mio::Poll`, with no helper thread:
//! * the directory watch is inotify with a mask of changes only (`MODIFY`,
//!   `CREATE`, `DELETE`, `MOVED_*`): reads (ours and every peer's) wake
//!   nobody, so each refresh of a leader wakes each observer once. The
//!   `notify` crate would also subscribe to `OPEN`, making every read in the
//!   directory wake every instance;
//! * a holder's death is a `pidfd` of the pid in its presence token: it
//!   becomes readable when that process has exited (after the kernel
//!   dropped its locks). It is opened only after the holder's presence lock
//!   was seen held, so the pid cannot have been recycled.
//!
//! Elsewhere (and on a Linux without `pidfd_open`) the directory watch is the
//! `notify` crate's watcher, owned and dropped by the writer, and a holder's
//! death is a thread blocked on a shared lock of its presence file. Such a
//! thread cannot be interrupted: when the watch is dropped it is cancelled
//! and ends (without waking anyone) when that holder exits.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::Duration;

#[cfg(target_os = "linux")]
use mio::Interest;
use mio::{Events, Poll, Token};

use crate::lockfile;
use crate::presence::{self, PeerPresence};
use crate::pubkey::AgentPubkey;

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
    /// A presence file was removed (reported by the `notify` watcher).
    #[cfg_attr(target_os = "linux", allow(dead_code))]
    PresenceGone(AgentPubkey, String),
}

/// How the facade and helper threads reach the writer. It holds the waker
/// weakly: when the writer is gone, so is its eventfd.
pub(crate) struct Mailbox<C> {
    tx: mpsc::Sender<Msg<C>>,
    waker: Weak<mio::Waker>,
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
    /// Presence files that were removed: (key, token). A participant that
    /// leaves without exiting removes its presence file, which no `pidfd`
    /// reports.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    gone: Vec<(AgentPubkey, String)>,
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
    holders: HashMap<AgentPubkey, HolderWatch>,
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    next_token: usize,
}

impl<C: Send + 'static> WakeSources<C> {
    /// The mailbox only (spec mode: the tick is the only other clock).
    pub(crate) fn new(dir: &Path) -> std::io::Result<Self> {
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
            next_token: FIRST_HOLDER,
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
        match DirWatch::start(&self.dir, &self.poll, self.mailbox.clone()) {
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
                t => self.holder_gone(t, &mut out),
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
                Msg::PresenceGone(k, token) => out.gone.push((k, token)),
            }
        }
        // A watched holder that left without exiting: stop trusting the
        // watch (its pid lives on) and look again.
        for (k, token) in std::mem::take(&mut out.gone) {
            if self.watching(&k, &token) {
                if let Some(w) = self.holders.remove(&k) {
                    w.stop(&self.poll);
                }
                out.keys.insert(k);
            }
        }
        out
    }

    /// Watches the holder of `pubkey`'s lock (its presence `token`) for its
    /// death, replacing any earlier watch of that key; `None` stops
    /// watching.
    pub(crate) fn watch_holder(&mut self, pubkey: &AgentPubkey, token: Option<&str>) {
        if self.holders.get(pubkey).and_then(HolderWatch::token) == token {
            return;
        }
        if let Some(old) = self.holders.remove(pubkey) {
            old.stop(&self.poll);
        }
        let Some(token) = token.filter(|t| presence::valid_token(t)) else {
            return;
        };
        match self.start_holder_watch(pubkey, token) {
            Some(w) => {
                self.holders.insert(*pubkey, w);
            }
            None => {
                tracing::warn!("cannot watch a holder; the refresh tick remains the bound");
            }
        }
        // The holder may have gone between the look and the watch: if so,
        // look again now (the watch itself may never fire).
        if presence::probe(&self.dir, pubkey, token) == PeerPresence::Gone {
            let _ = self.mailbox.send(Msg::Key(*pubkey));
        }
    }

    /// Whether `token` is the holder being watched for `pubkey` (its death
    /// will wake us, so it is alive until then).
    pub(crate) fn watching(&self, pubkey: &AgentPubkey, token: &str) -> bool {
        self.holders
            .get(pubkey)
            .is_some_and(|w| w.token() == Some(token))
    }

    #[cfg(target_os = "linux")]
    fn start_holder_watch(&mut self, pubkey: &AgentPubkey, token: &str) -> Option<HolderWatch> {
        if let Some(pid) = token_pid(token) {
            match pidfd::open(pid) {
                Ok(fd) => {
                    let t = Token(self.next_token);
                    self.next_token += 1;
                    use std::os::fd::AsRawFd;
                    let raw = fd.as_raw_fd();
                    if self
                        .poll
                        .registry()
                        .register(&mut mio::unix::SourceFd(&raw), t, Interest::READABLE)
                        .is_ok()
                    {
                        return Some(HolderWatch::Pidfd {
                            token: token.to_owned(),
                            mio: t,
                            fd,
                        });
                    }
                }
                // The process is gone already: the probe after this says so.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return None,
                Err(_) => {}
            }
        }
        self.start_holder_thread(pubkey, token)
    }

    #[cfg(not(target_os = "linux"))]
    fn start_holder_watch(&mut self, pubkey: &AgentPubkey, token: &str) -> Option<HolderWatch> {
        self.start_holder_thread(pubkey, token)
    }

    fn start_holder_thread(&mut self, pubkey: &AgentPubkey, token: &str) -> Option<HolderWatch> {
        let cancelled = Arc::new(AtomicBool::new(false));
        let (dir, pk, t, mailbox, c) = (
            self.dir.clone(),
            *pubkey,
            token.to_owned(),
            self.mailbox.clone(),
            Arc::clone(&cancelled),
        );
        std::thread::Builder::new()
            .name("nip-le-holder".into())
            .spawn(move || {
                presence::wait_gone(&dir, &pk, &t);
                if !c.load(Ordering::Acquire) {
                    let _ = mailbox.send(Msg::Key(pk));
                }
            })
            .ok()?;
        Some(HolderWatch::Thread {
            token: token.to_owned(),
            cancelled,
        })
    }

    #[cfg(target_os = "linux")]
    fn holder_gone(&mut self, t: Token, out: &mut Woken<C>) {
        let key = self
            .holders
            .iter()
            .find(|(_, w)| matches!(w, HolderWatch::Pidfd { mio, .. } if *mio == t))
            .map(|(k, _)| *k);
        if let Some(k) = key {
            if let Some(w) = self.holders.remove(&k) {
                w.stop(&self.poll);
            }
            out.keys.insert(k);
        }
    }

    /// Stops every holder watch and the directory watch.
    pub(crate) fn stop_all(&mut self) {
        for (_, w) in self.holders.drain() {
            w.stop(&self.poll);
        }
        if let Some(w) = self.dir_watch.take() {
            w.stop(&self.poll);
        }
    }
}

/// The pid in a presence token `<pid>-<16 hex>`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn token_pid(token: &str) -> Option<u32> {
    token.split_once('-')?.0.parse().ok()
}

/// A watch on one holder's death.
enum HolderWatch {
    #[cfg(target_os = "linux")]
    Pidfd {
        token: String,
        mio: Token,
        fd: std::os::fd::OwnedFd,
    },
    Thread {
        token: String,
        cancelled: Arc<AtomicBool>,
    },
}

impl HolderWatch {
    fn token(&self) -> Option<&str> {
        match self {
            #[cfg(target_os = "linux")]
            HolderWatch::Pidfd { token, .. } => Some(token),
            HolderWatch::Thread { token, .. } => Some(token),
        }
    }

    fn stop(self, poll: &Poll) {
        match self {
            #[cfg(target_os = "linux")]
            HolderWatch::Pidfd { fd, .. } => {
                use std::os::fd::AsRawFd;
                let raw = fd.as_raw_fd();
                let _ = poll.registry().deregister(&mut mio::unix::SourceFd(&raw));
                drop(fd);
            }
            HolderWatch::Thread { cancelled, .. } => {
                let _ = poll;
                cancelled.store(true, Ordering::Release);
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

/// The directory watch.
#[cfg(target_os = "linux")]
struct DirWatch {
    ino: inotify::Inotify,
    buf: Vec<u8>,
}

#[cfg(target_os = "linux")]
impl DirWatch {
    fn start<C>(dir: &Path, poll: &Poll, _mailbox: Mailbox<C>) -> std::io::Result<Self> {
        use inotify::{Inotify, WatchMask};
        use std::os::fd::AsRawFd;
        let ino = Inotify::init()?;
        // MODIFY, not CLOSE_WRITE: every acquire opens the lock file
        // read-write, so its close would wake everyone even when nothing was
        // written.
        let mask = WatchMask::MODIFY
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MOVED_TO
            | WatchMask::MOVED_FROM;
        ino.watches().add(dir, mask)?;
        let raw = ino.as_raw_fd();
        poll.registry().register(
            &mut mio::unix::SourceFd(&raw),
            DIR_WATCH,
            Interest::READABLE,
        )?;
        Ok(Self {
            ino,
            buf: vec![0; 4096],
        })
    }

    /// Reads every queued event (the fd is non-blocking).
    fn read<C>(&mut self, out: &mut Woken<C>) {
        loop {
            match self.ino.read_events(&mut self.buf) {
                Ok(events) => {
                    for ev in events {
                        use inotify::EventMask;
                        if ev.mask.contains(EventMask::Q_OVERFLOW) {
                            out.all = true;
                        }
                        let removed = ev
                            .mask
                            .intersects(EventMask::DELETE | EventMask::MOVED_FROM);
                        match ev.name.and_then(|n| n.to_str()).and_then(name_event) {
                            Some(NameEvent::Key(k)) => {
                                out.keys.insert(k);
                            }
                            Some(NameEvent::Presence(k, token)) if removed => {
                                out.gone.push((k, token));
                            }
                            _ => {}
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("directory watch failed: {e}");
                    out.all = true;
                    return;
                }
            }
        }
    }

    fn stop(self, poll: &Poll) {
        use std::os::fd::AsRawFd;
        let raw = self.ino.as_raw_fd();
        let _ = poll.registry().deregister(&mut mio::unix::SourceFd(&raw));
    }
}

/// The directory watch: the `notify` crate's watcher, whose callback posts
/// keys to the mailbox. Dropping it stops its thread.
#[cfg(not(target_os = "linux"))]
struct DirWatch {
    _watcher: notify::RecommendedWatcher,
}

#[cfg(not(target_os = "linux"))]
impl DirWatch {
    fn start<C: Send + 'static>(
        dir: &Path,
        _poll: &Poll,
        mailbox: Mailbox<C>,
    ) -> std::io::Result<Self> {
        use notify::{EventKind, RecursiveMode, Watcher};
        let handler = move |res: notify::Result<notify::Event>| {
            let Ok(ev) = res else { return };
            if matches!(ev.kind, EventKind::Access(_)) {
                return;
            }
            let removed = matches!(ev.kind, EventKind::Remove(_));
            for p in &ev.paths {
                match p.file_name().and_then(|n| n.to_str()).and_then(name_event) {
                    Some(NameEvent::Key(k)) => {
                        let _ = mailbox.send(Msg::Key(k));
                    }
                    Some(NameEvent::Presence(k, token)) if removed => {
                        let _ = mailbox.send(Msg::PresenceGone(k, token));
                    }
                    _ => {}
                }
            }
        };
        let mut w = notify::recommended_watcher(handler).map_err(std::io::Error::other)?;
        w.watch(dir, RecursiveMode::NonRecursive)
            .map_err(std::io::Error::other)?;
        Ok(Self { _watcher: w })
    }

    fn stop(self, _poll: &Poll) {}
}

/// What a file name in the lock directory is about.
#[derive(Debug, PartialEq, Eq)]
enum NameEvent {
    /// `<pubkey>.lock` or `<pubkey>.claim`.
    Key(AgentPubkey),
    /// `<pubkey>.<token>.live`.
    Presence(AgentPubkey, String),
}

fn name_event(name: &str) -> Option<NameEvent> {
    if let Some(stem) = name.strip_suffix(".live") {
        let (pk, token) = stem.split_once('.')?;
        return presence::valid_token(token)
            .then(|| AgentPubkey::parse(pk).ok())
            .flatten()
            .map(|k| NameEvent::Presence(k, token.to_owned()));
    }
    let stem = name
        .strip_suffix(".lock")
        .or_else(|| name.strip_suffix(".claim"))?;
    AgentPubkey::parse(stem).ok().map(NameEvent::Key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_the_lock_dir() {
        let pk = "ab".repeat(32);
        let k = AgentPubkey::parse(&pk).unwrap();
        assert_eq!(name_event(&format!("{pk}.lock")), Some(NameEvent::Key(k)));
        assert_eq!(name_event(&format!("{pk}.claim")), Some(NameEvent::Key(k)));
        assert_eq!(
            name_event(&format!("{pk}.12-0123456789abcdef.live")),
            Some(NameEvent::Presence(k, "12-0123456789abcdef".into()))
        );
        for other in [
            format!("{pk}.../x.live"),
            format!("{pk}.lock.tmp"),
            ".claim-123".to_owned(),
            "x.lock".to_owned(),
        ] {
            assert_eq!(name_event(&other), None, "{other}");
        }
    }
}
