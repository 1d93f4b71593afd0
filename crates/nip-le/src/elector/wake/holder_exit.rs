//! The portable watch on a holder's death, without polling: a thread that
//! blocks on the holder process's exit (Linux: a `pidfd`; macOS: `kqueue`'s
//! `EVFILT_PROC`/`NOTE_EXIT`; Windows: the process handle) or on its own
//! stop signal (an `eventfd`, `EVFILT_USER`, an event), whichever fires
//! first. An idle watch never wakes.
//!
//! Pid reuse: the handle is opened while the holder's presence lock is
//! held (the writer saw it held before asking, and the thread probes it
//! again after opening), so it names the holder, not a later process with
//! its pid. A token whose pid is not a process here (another host's, over
//! a shared directory) falls back to the poll.
//!
//! An exit is reported once the holder's presence lock reads free: the OS
//! may drop a dead process's locks a moment after it signals its exit
//! (Windows says so), and a report before that would only make the writer
//! look, find the lock held, and watch again.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Mailbox, Msg};
use crate::presence::{self, HolderPresence};

/// What [`HolderExit::start`] found.
pub(super) enum Started {
    /// The watch runs.
    Watching(HolderExit),
    /// The holder is gone already: look again.
    Gone,
    /// This platform or this pid cannot be watched: poll instead.
    Unsupported,
}

/// A running watch of one holder's exit.
pub(super) struct HolderExit {
    stop: imp::Stopper,
    thread: JoinHandle<()>,
}

impl HolderExit {
    /// Watches the holder of `token` in `dir`; `confirm` is the longest
    /// wait between two probes of its presence lock once it has exited.
    pub(super) fn start<C: Send + 'static>(
        dir: PathBuf,
        token: String,
        confirm: Duration,
        mailbox: Mailbox<C>,
    ) -> Started {
        let Some(pid) = presence::token_pid(&token) else {
            return Started::Unsupported;
        };
        let exit = match imp::ProcessExit::open(pid) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return match presence::probe_holder(&dir, &token) {
                    HolderPresence::Gone => Started::Gone,
                    // Alive, but not a process of ours to wait on.
                    _ => Started::Unsupported,
                };
            }
            Err(_) => return Started::Unsupported,
        };
        let Ok((stop, stopped)) = imp::stop_pair(&exit) else {
            return Started::Unsupported;
        };
        let spawned = std::thread::Builder::new()
            .name("nip-le-holder".into())
            .spawn(move || {
                // Opened while it lived? If its lock is free now, the pid
                // may already name another process: report, never wait.
                if presence::probe_holder(&dir, &token) != HolderPresence::Gone
                    && !exit.wait(&stopped)
                {
                    return;
                }
                let mut pause = Duration::from_millis(1);
                while presence::probe_holder(&dir, &token) != HolderPresence::Gone {
                    if stopped.wait_timeout(pause) {
                        return;
                    }
                    pause = (pause * 2).min(confirm);
                }
                let _ = mailbox.send(Msg::PresenceGone(token));
            });
        match spawned {
            Ok(thread) => Started::Watching(Self { stop, thread }),
            Err(_) => Started::Unsupported,
        }
    }

    /// Stops the watch and joins its thread: no thread outlives it.
    pub(super) fn stop(self) {
        self.stop.stop();
        let _ = self.thread.join();
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;

    /// A `pidfd`: readable once the process has exited.
    pub(super) struct ProcessExit(OwnedFd);

    impl ProcessExit {
        pub(super) fn open(pid: u32) -> io::Result<Self> {
            super::super::pidfd::open(pid)
                .map(Self)
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ESRCH) => io::ErrorKind::NotFound.into(),
                    _ => e,
                })
        }

        /// Blocks until the process exits (true) or the stop fires (false).
        pub(super) fn wait(&self, stop: &StopWait) -> bool {
            loop {
                let mut fds = [
                    libc::pollfd {
                        fd: self.0.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: stop.0.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: two valid pollfds, owned for the call.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
                if n < 0 {
                    if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    // Cannot wait: report, and let the writer look.
                    return true;
                }
                if fds[1].revents != 0 {
                    return false;
                }
                if fds[0].revents != 0 {
                    return true;
                }
            }
        }
    }

    /// The thread's side of the stop signal: an `eventfd`.
    pub(super) struct StopWait(OwnedFd);

    impl StopWait {
        /// Waits up to `d`; true if the stop fired.
        pub(super) fn wait_timeout(&self, d: Duration) -> bool {
            let mut fd = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut fd, 1, ms) > 0 }
        }
    }

    /// The owner's side: signals the same `eventfd`.
    pub(super) struct Stopper(OwnedFd);

    impl Stopper {
        pub(super) fn stop(self) {
            let one: u64 = 1;
            // SAFETY: an 8-byte write to our eventfd.
            unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    pub(super) fn stop_pair(_: &ProcessExit) -> io::Result<(Stopper, StopWait)> {
        // SAFETY: eventfd returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the fd is new and ours; its duplicate is ours too.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let other = fd.try_clone()?;
        Ok((Stopper(fd), StopWait(other)))
    }
}

#[cfg(target_os = "macos")]
mod imp {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::Arc;
    use std::time::Duration;

    /// The stop signal's `EVFILT_USER` ident.
    const STOP: usize = 1;

    fn kevent(
        kq: &OwnedFd,
        change: Option<libc::kevent>,
        timeout: Option<Duration>,
    ) -> io::Result<Option<libc::kevent>> {
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        // SAFETY: a zeroed kevent is a valid out-buffer.
        let mut out: libc::kevent = unsafe { std::mem::zeroed() };
        let (changes, nchanges) = match &change {
            Some(c) => (c as *const libc::kevent, 1),
            None => (std::ptr::null(), 0),
        };
        let nevents = if change.is_some() { 0 } else { 1 };
        // SAFETY: the pointers are valid for the counts given.
        let n = unsafe {
            libc::kevent(
                kq.as_raw_fd(),
                changes,
                nchanges,
                &mut out,
                nevents,
                ts.as_ref().map_or(std::ptr::null(), |t| t as *const _),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((n > 0).then_some(out))
    }

    fn change(ident: usize, filter: i16, flags: u16, fflags: u32) -> libc::kevent {
        // SAFETY: a zeroed kevent is valid; the fields below say what it is.
        let mut k: libc::kevent = unsafe { std::mem::zeroed() };
        k.ident = ident;
        k.filter = filter;
        k.flags = flags;
        k.fflags = fflags;
        k
    }

    /// A `kqueue` with the process's `NOTE_EXIT` and the stop's
    /// `EVFILT_USER` on it (a kqueue is not inherited across `fork`).
    pub(super) struct ProcessExit(Arc<OwnedFd>);

    impl ProcessExit {
        pub(super) fn open(pid: u32) -> io::Result<Self> {
            // SAFETY: kqueue returns a new fd or -1.
            let fd = unsafe { libc::kqueue() };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: the fd is new and ours.
            let kq = unsafe { OwnedFd::from_raw_fd(fd) };
            let proc = change(
                pid as usize,
                libc::EVFILT_PROC,
                libc::EV_ADD | libc::EV_ONESHOT,
                libc::NOTE_EXIT,
            );
            kevent(&kq, Some(proc), None).map_err(|e| match e.raw_os_error() {
                Some(libc::ESRCH) => io::ErrorKind::NotFound.into(),
                _ => e,
            })?;
            let user = change(STOP, libc::EVFILT_USER, libc::EV_ADD | libc::EV_CLEAR, 0);
            kevent(&kq, Some(user), None)?;
            Ok(Self(Arc::new(kq)))
        }

        /// Blocks until the process exits (true) or the stop fires (false).
        pub(super) fn wait(&self, _stop: &StopWait) -> bool {
            loop {
                match kevent(&self.0, None, None) {
                    Ok(Some(ev)) if ev.filter == libc::EVFILT_USER => return false,
                    Ok(Some(_)) => return true,
                    Ok(None) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // Cannot wait: report, and let the writer look.
                    Err(_) => return true,
                }
            }
        }
    }

    /// The thread's side of the stop: the same kqueue.
    pub(super) struct StopWait(Arc<OwnedFd>);

    impl StopWait {
        /// Waits up to `d`; true if the stop fired.
        pub(super) fn wait_timeout(&self, d: Duration) -> bool {
            matches!(kevent(&self.0, None, Some(d)), Ok(Some(ev)) if ev.filter == libc::EVFILT_USER)
        }
    }

    /// The owner's side: triggers the kqueue's `EVFILT_USER`.
    pub(super) struct Stopper(Arc<OwnedFd>);

    impl Stopper {
        pub(super) fn stop(self) {
            let trigger = change(STOP, libc::EVFILT_USER, 0, libc::NOTE_TRIGGER);
            let _ = kevent(&self.0, Some(trigger), None);
        }
    }

    /// The stop rides on the kqueue `open` made.
    pub(super) fn stop_pair(exit: &ProcessExit) -> io::Result<(Stopper, StopWait)> {
        Ok((Stopper(Arc::clone(&exit.0)), StopWait(Arc::clone(&exit.0))))
    }
}

#[cfg(windows)]
mod imp {
    use std::io;
    use std::sync::Arc;
    use std::time::Duration;

    use windows_sys::Win32::Foundation::{
        CloseHandle, ERROR_INVALID_PARAMETER, HANDLE, WAIT_OBJECT_0,
    };
    use windows_sys::Win32::System::Threading::{
        CreateEventW, OpenProcess, SetEvent, WaitForMultipleObjects, WaitForSingleObject, INFINITE,
        PROCESS_SYNCHRONIZE,
    };

    /// A handle we own, closed when dropped.
    struct Owned(HANDLE);

    // SAFETY: process and event handles may be used from any thread.
    unsafe impl Send for Owned {}
    // SAFETY: waiting on and signalling a handle are thread-safe.
    unsafe impl Sync for Owned {}

    impl Drop for Owned {
        fn drop(&mut self) {
            // SAFETY: ours, closed once.
            unsafe { CloseHandle(self.0) };
        }
    }

    /// The holder's process handle (`SYNCHRONIZE`): signalled when it exits.
    pub(super) struct ProcessExit(Owned);

    impl ProcessExit {
        pub(super) fn open(pid: u32) -> io::Result<Self> {
            // SAFETY: OpenProcess returns a new handle or null.
            let h = unsafe { OpenProcess(PROCESS_SYNCHRONIZE, 0, pid) };
            if h.is_null() {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(c) if c == ERROR_INVALID_PARAMETER as i32 => {
                        io::ErrorKind::NotFound.into()
                    }
                    _ => e,
                });
            }
            Ok(Self(Owned(h)))
        }

        /// Blocks until the process exits (true) or the stop fires (false).
        pub(super) fn wait(&self, stop: &StopWait) -> bool {
            let handles = [stop.0 .0, self.0 .0];
            // SAFETY: two valid handles, alive for the call.
            let r = unsafe { WaitForMultipleObjects(2, handles.as_ptr(), 0, INFINITE) };
            r != WAIT_OBJECT_0
        }
    }

    /// The thread's side of the stop: a manual-reset event.
    pub(super) struct StopWait(Arc<Owned>);

    impl StopWait {
        /// Waits up to `d`; true if the stop fired.
        pub(super) fn wait_timeout(&self, d: Duration) -> bool {
            let ms = u32::try_from(d.as_millis()).unwrap_or(INFINITE - 1);
            // SAFETY: a valid event handle.
            unsafe { WaitForSingleObject(self.0 .0, ms) == WAIT_OBJECT_0 }
        }
    }

    /// The owner's side: sets the event.
    pub(super) struct Stopper(Arc<Owned>);

    impl Stopper {
        pub(super) fn stop(self) {
            // SAFETY: a valid event handle.
            unsafe { SetEvent(self.0 .0) };
        }
    }

    pub(super) fn stop_pair(_: &ProcessExit) -> io::Result<(Stopper, StopWait)> {
        // SAFETY: an unnamed manual-reset event, initially unset.
        let h = unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) };
        if h.is_null() {
            return Err(io::Error::last_os_error());
        }
        let ev = Arc::new(Owned(h));
        Ok((Stopper(Arc::clone(&ev)), StopWait(ev)))
    }
}
