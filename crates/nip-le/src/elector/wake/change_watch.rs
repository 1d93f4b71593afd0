//! Portable Linux's directory watch: what FSEvents and
//! `ReadDirectoryChangesW` report through `notify` on macOS and Windows
//! (files created, written, removed or renamed in the directory; never an
//! open or a read), from a thread of its own that posts to the mailbox as
//! `notify`'s watchers do. `notify`'s own Linux backend also watches opens
//! (`IN_OPEN`, notify 8.2 `src/inotify.rs`), which neither of those
//! reports: every read in the directory woke every watcher, and portable
//! Linux measured costs that macOS and Windows do not have (64 × 8
//! electors started in 550 ms instead of 313, an idle observer woke 0.6
//! times a second instead of 0.2; `nip-le-lab bench`, docs/platforms.md).

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::{Events, Interest, Poll, Token, Waker};

use super::{post_name, Mailbox, Msg};

const INOTIFY: Token = Token(0);
const STOP: Token = Token(1);

/// The running watch; dropping it stops and joins its thread.
pub(super) struct ChangeWatch {
    stop: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
}

impl ChangeWatch {
    pub(super) fn start<C: Send + 'static>(
        dir: &Path,
        mailbox: Mailbox<C>,
    ) -> std::io::Result<Self> {
        use inotify::{Inotify, WatchMask};
        let mut ino = Inotify::init()?;
        // notify's mask without OPEN and CLOSE_WRITE (and without the
        // directory's own removal, which ends every watch alike): neither
        // FSEvents nor `ReadDirectoryChangesW` reports a file opened or
        // closed, only its changes, and MODIFY reports every write.
        let mask = WatchMask::ATTRIB
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MODIFY
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::ONLYDIR;
        ino.watches().add(dir, mask)?;
        let mut poll = Poll::new()?;
        let raw = ino.as_raw_fd();
        (poll.registry()).register(&mut mio::unix::SourceFd(&raw), INOTIFY, Interest::READABLE)?;
        let stop = Arc::new(Waker::new(poll.registry(), STOP)?);
        let thread = std::thread::Builder::new()
            .name("nip-le-dirwatch".into())
            .spawn(move || {
                let mut events = Events::with_capacity(4);
                let mut buf = vec![0u8; 4096];
                loop {
                    if let Err(e) = poll.poll(&mut events, None) {
                        if e.kind() == std::io::ErrorKind::Interrupted {
                            continue;
                        }
                        let _ = mailbox.send(Msg::All);
                        return;
                    }
                    if events.iter().any(|e| e.token() == STOP) {
                        return;
                    }
                    if !read_all(&mut ino, &mut buf, &mailbox) {
                        return;
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

/// Posts every queued event; `false` once the watch failed (after asking
/// the writer to look at every key).
fn read_all<C>(ino: &mut inotify::Inotify, buf: &mut [u8], mailbox: &Mailbox<C>) -> bool {
    use inotify::EventMask;
    loop {
        match ino.read_events(buf) {
            Ok(events) => {
                for ev in events {
                    if ev.mask.contains(EventMask::Q_OVERFLOW) {
                        let _ = mailbox.send(Msg::All);
                        continue;
                    }
                    let removed = ev
                        .mask
                        .intersects(EventMask::DELETE | EventMask::MOVED_FROM);
                    if let Some(name) = ev.name.and_then(|n| n.to_str()) {
                        post_name(mailbox, name, removed);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!("directory watch failed: {e}");
                let _ = mailbox.send(Msg::All);
                return false;
            }
        }
    }
}

impl Drop for ChangeWatch {
    fn drop(&mut self) {
        let _ = self.stop.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
