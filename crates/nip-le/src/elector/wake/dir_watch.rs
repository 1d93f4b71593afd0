//! The directory watch, per backend: inotify on native Linux, the `notify`
//! crate on macOS, `ReadDirectoryChangesW` on Windows, and on portable
//! Linux a watch of what those report (`change_watch`).

use super::*;

/// The directory watch of the configured backend.
pub(super) enum DirWatch {
    /// Native Linux.
    #[cfg(target_os = "linux")]
    Inotify(InotifyWatch),
    /// Portable Linux.
    #[cfg(target_os = "linux")]
    Changes(super::change_watch::ChangeWatch),
    /// Windows.
    #[cfg(windows)]
    Windows(super::windows_watch::WindowsWatch),
    /// macOS and the rest.
    #[cfg(not(any(target_os = "linux", windows)))]
    Notify(NotifyWatch),
}

impl DirWatch {
    pub(super) fn start<C: Send + 'static>(
        dir: &Path,
        poll: &Poll,
        mailbox: Mailbox<C>,
        backend: Backend,
    ) -> std::io::Result<Self> {
        #[cfg(target_os = "linux")]
        return if backend.linux_fast_paths() {
            InotifyWatch::start(dir, poll).map(DirWatch::Inotify)
        } else {
            super::change_watch::ChangeWatch::start(dir, mailbox).map(DirWatch::Changes)
        };
        #[cfg(windows)]
        {
            let _ = (poll, backend);
            super::windows_watch::WindowsWatch::start(dir, mailbox).map(DirWatch::Windows)
        }
        #[cfg(not(any(target_os = "linux", windows)))]
        {
            let _ = (poll, backend);
            NotifyWatch::start(dir, mailbox).map(DirWatch::Notify)
        }
    }

    /// Watches `pubkey`'s lock file for writes (inotify; the `notify`
    /// watch of the directory sees them already).
    pub(super) fn watch_file(&mut self, pubkey: &AgentPubkey, path: &Path) {
        match self {
            #[cfg(target_os = "linux")]
            DirWatch::Inotify(w) => w.watch_file(pubkey, path),
            #[cfg(target_os = "linux")]
            DirWatch::Changes(_) => {}
            #[cfg(windows)]
            DirWatch::Windows(_) => {
                let _ = (pubkey, path);
            }
            #[cfg(not(any(target_os = "linux", windows)))]
            DirWatch::Notify(_) => {
                let _ = (pubkey, path);
            }
        }
    }

    /// Stops watching `pubkey`'s lock file.
    pub(super) fn unwatch_file(&mut self, pubkey: &AgentPubkey) {
        match self {
            #[cfg(target_os = "linux")]
            DirWatch::Inotify(w) => w.unwatch_file(pubkey),
            #[cfg(target_os = "linux")]
            DirWatch::Changes(_) => {}
            #[cfg(windows)]
            DirWatch::Windows(_) => {
                let _ = pubkey;
            }
            #[cfg(not(any(target_os = "linux", windows)))]
            DirWatch::Notify(_) => {
                let _ = pubkey;
            }
        }
    }

    /// Reads what is queued on the watch's fd (inotify; the `notify`
    /// watcher posts to the mailbox from its own thread).
    #[cfg(target_os = "linux")]
    pub(super) fn read<C>(&mut self, out: &mut Woken<C>) {
        if let DirWatch::Inotify(w) = self {
            w.read(out);
        }
    }

    /// Stops the watch (dropping the `notify` watcher stops its thread).
    pub(super) fn stop(self, poll: &Poll) {
        match self {
            #[cfg(target_os = "linux")]
            DirWatch::Inotify(w) => w.stop(poll),
            #[cfg(target_os = "linux")]
            DirWatch::Changes(w) => {
                let _ = poll;
                drop(w);
            }
            #[cfg(windows)]
            DirWatch::Windows(w) => {
                let _ = poll;
                drop(w);
            }
            #[cfg(not(any(target_os = "linux", windows)))]
            DirWatch::Notify(w) => {
                let _ = poll;
                drop(w);
            }
        }
    }
}

/// The inotify watch of the directory, and a watch of each joined key's
/// lock file.
#[cfg(target_os = "linux")]
pub(super) struct InotifyWatch {
    ino: inotify::Inotify,
    buf: Vec<u8>,
    files: HashMap<AgentPubkey, inotify::WatchDescriptor>,
}

#[cfg(target_os = "linux")]
impl InotifyWatch {
    fn start(dir: &Path, poll: &Poll) -> std::io::Result<Self> {
        use inotify::{Inotify, WatchMask};
        use std::os::fd::AsRawFd;
        let ino = Inotify::init()?;
        // Neither MODIFY nor CREATE on the directory: presence files are
        // created when an elector starts and rewritten when it joins or
        // leaves a key, and that must wake nobody (64 windows starting
        // together would wake each other 4,000 times). Lock files are
        // watched one by one (`watch_file`) once our first look has made
        // sure they exist; lead requests are renamed into place (MOVED_TO);
        // a removed presence file means its elector left (DELETE).
        let mask =
            WatchMask::DELETE | WatchMask::MOVED_TO | WatchMask::MOVED_FROM | WatchMask::ONLYDIR;
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
            files: HashMap::new(),
        })
    }

    /// MODIFY, not CLOSE_WRITE: every acquire opens the lock file
    /// read-write, so its close would wake everyone even when nothing was
    /// written. A file that does not exist yet (our acquire could not
    /// create it) is watched from a later look; the tick is the bound
    /// meanwhile.
    fn watch_file(&mut self, pubkey: &AgentPubkey, path: &Path) {
        use inotify::WatchMask;
        if self.files.contains_key(pubkey) {
            return;
        }
        let mask = WatchMask::MODIFY | WatchMask::DONT_FOLLOW;
        if let Ok(wd) = self.ino.watches().add(path, mask) {
            self.files.insert(*pubkey, wd);
        }
    }

    fn unwatch_file(&mut self, pubkey: &AgentPubkey) {
        if let Some(wd) = self.files.remove(pubkey) {
            let _ = self.ino.watches().remove(wd);
        }
    }

    /// Reads every queued event (the fd is non-blocking).
    fn read<C>(&mut self, out: &mut Woken<C>) {
        use inotify::EventMask;
        loop {
            match self.ino.read_events(&mut self.buf) {
                Ok(events) => {
                    for ev in events {
                        if ev.mask.contains(EventMask::Q_OVERFLOW) {
                            out.all = true;
                        }
                        let name = ev.name.and_then(|n| n.to_str());
                        match name.and_then(name_event) {
                            Some(NameEvent::Key(k)) => {
                                out.keys.insert(k);
                            }
                            Some(NameEvent::Presence(token))
                                if ev
                                    .mask
                                    .intersects(EventMask::DELETE | EventMask::MOVED_FROM) =>
                            {
                                out.gone.push(token);
                            }
                            Some(NameEvent::Presence(_)) => {}
                            None if name.is_none() => {
                                // A watched lock file: written, or its watch
                                // is gone (the file was removed or replaced).
                                let key = self
                                    .files
                                    .iter()
                                    .find(|(_, wd)| **wd == ev.wd)
                                    .map(|(k, _)| *k);
                                if let Some(k) = key {
                                    if ev.mask.contains(EventMask::IGNORED) {
                                        self.files.remove(&k);
                                    }
                                    out.keys.insert(k);
                                }
                            }
                            None => {}
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

/// The `notify` crate's watcher of the directory (FSEvents on macOS),
/// whose callback posts keys to the mailbox. Dropping it stops its thread.
#[cfg(not(any(target_os = "linux", windows)))]
pub(super) struct NotifyWatch {
    _watcher: notify::RecommendedWatcher,
}

#[cfg(not(any(target_os = "linux", windows)))]
impl NotifyWatch {
    fn start<C: Send + 'static>(dir: &Path, mailbox: Mailbox<C>) -> std::io::Result<Self> {
        use notify::{EventKind, RecursiveMode, Watcher};
        let handler = move |res: notify::Result<notify::Event>| {
            // An error or a rescan (a queue overflowed, FSEvents dropped
            // events): look at every key, as inotify's overflow does.
            let ev = match res {
                Ok(ev) if !ev.need_rescan() => ev,
                _ => {
                    let _ = mailbox.send(Msg::All);
                    return;
                }
            };
            if matches!(ev.kind, EventKind::Access(_)) {
                return;
            }
            let removed = matches!(ev.kind, EventKind::Remove(_));
            for p in &ev.paths {
                if let Some(name) = p.file_name().and_then(|n| n.to_str()) {
                    post_name(&mailbox, name, removed);
                }
            }
        };
        let mut w = notify::recommended_watcher(handler).map_err(std::io::Error::other)?;
        w.watch(dir, RecursiveMode::NonRecursive)
            .map_err(std::io::Error::other)?;
        Ok(Self { _watcher: w })
    }
}
