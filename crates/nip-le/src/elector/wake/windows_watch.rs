//! Windows' directory watch: `ReadDirectoryChangesW` on the lock directory,
//! from a thread that blocks until a change or its stop event, and posts
//! to the mailbox as the portable watches do. An idle watch never wakes.
//!
//! Not the `notify` crate's watcher: its thread waits for its commands with
//! a timeout of 100 ms (`WaitForSingleObjectEx(.., 100, ..)`, notify 8.2
//! `src/windows.rs`), so every window of an idle app woke ten times a
//! second for nothing (measured under Wine: 14 to 17 wake-ups a second on
//! that thread alone).

use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::path::Path;
use std::thread::JoinHandle;

use windows_sys::Win32::Foundation::{ERROR_OPERATION_ABORTED, HANDLE, WAIT_OBJECT_0};
use windows_sys::Win32::Storage::FileSystem::{
    CreateFileW, ReadDirectoryChangesW, FILE_ACTION_REMOVED, FILE_ACTION_RENAMED_OLD_NAME,
    FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OVERLAPPED, FILE_LIST_DIRECTORY,
    FILE_NOTIFY_CHANGE_ATTRIBUTES, FILE_NOTIFY_CHANGE_CREATION, FILE_NOTIFY_CHANGE_FILE_NAME,
    FILE_NOTIFY_CHANGE_LAST_WRITE, FILE_NOTIFY_CHANGE_SIZE, FILE_SHARE_DELETE, FILE_SHARE_READ,
    FILE_SHARE_WRITE, OPEN_EXISTING,
};
use windows_sys::Win32::System::Threading::{
    CreateEventW, ResetEvent, SetEvent, WaitForMultipleObjects, INFINITE,
};
use windows_sys::Win32::System::IO::{CancelIoEx, GetOverlappedResult, OVERLAPPED};

use super::{post_name, Mailbox, Msg};

/// What is reported: names created, removed or renamed, and files written
/// (size, last write, attributes, creation). Never an open or a read.
const FILTER: u32 = FILE_NOTIFY_CHANGE_FILE_NAME
    | FILE_NOTIFY_CHANGE_ATTRIBUTES
    | FILE_NOTIFY_CHANGE_SIZE
    | FILE_NOTIFY_CHANGE_LAST_WRITE
    | FILE_NOTIFY_CHANGE_CREATION;

/// The buffer the changes are written into, in `u32`s (64 KiB: the most a
/// watch over the network takes; DWORD-aligned, as the call requires).
const BUFFER_WORDS: usize = 16 * 1024;

/// The running watch; dropping it stops and joins its thread.
pub(super) struct WindowsWatch {
    stop: OwnedHandle,
    thread: Option<JoinHandle<()>>,
}

/// A manual-reset event, unset.
fn event() -> io::Result<OwnedHandle> {
    // SAFETY: an unnamed event; a null return is an error.
    let h = unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) };
    if h.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new handle, owned here only.
    Ok(unsafe { OwnedHandle::from_raw_handle(h) })
}

fn raw(h: &OwnedHandle) -> HANDLE {
    h.as_raw_handle()
}

impl WindowsWatch {
    pub(super) fn start<C: Send + 'static>(dir: &Path, mailbox: Mailbox<C>) -> io::Result<Self> {
        let wide: Vec<u16> = dir.as_os_str().encode_wide().chain([0]).collect();
        // SAFETY: a NUL-terminated path; the directory is opened for
        // listing only, sharing everything, so it blocks no rename or
        // removal in it.
        let h = unsafe {
            CreateFileW(
                wide.as_ptr(),
                FILE_LIST_DIRECTORY,
                FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                std::ptr::null(),
                OPEN_EXISTING,
                FILE_FLAG_BACKUP_SEMANTICS | FILE_FLAG_OVERLAPPED,
                std::ptr::null_mut(),
            )
        };
        if h.is_null() || h == windows_sys::Win32::Foundation::INVALID_HANDLE_VALUE {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new handle, owned here only.
        let dir = unsafe { OwnedHandle::from_raw_handle(h) };
        let (stop, changed) = (event()?, event()?);
        let stopped = stop.try_clone()?;
        let thread = std::thread::Builder::new()
            .name("nip-le-dirwatch".into())
            .spawn(move || {
                if let Err(e) = watch(&dir, &stopped, &changed, &mailbox) {
                    tracing::warn!("directory watch failed: {e}");
                    let _ = mailbox.send(Msg::All);
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

/// Reads changes until `stopped` is set (`Ok`) or a read fails.
fn watch<C>(
    dir: &OwnedHandle,
    stopped: &OwnedHandle,
    changed: &OwnedHandle,
    mailbox: &Mailbox<C>,
) -> io::Result<()> {
    let mut buf = vec![0u32; BUFFER_WORDS];
    let bytes = u32::try_from(BUFFER_WORDS * 4).unwrap_or(u32::MAX);
    loop {
        // SAFETY: a zeroed OVERLAPPED is valid; it and `buf` outlive the
        // read: every path below waits for it to complete or be cancelled.
        let mut ov: OVERLAPPED = unsafe { std::mem::zeroed() };
        ov.hEvent = raw(changed);
        // SAFETY: valid handles and buffer (see above).
        let ok = unsafe {
            ResetEvent(raw(changed));
            ReadDirectoryChangesW(
                raw(dir),
                buf.as_mut_ptr().cast(),
                bytes,
                0,
                FILTER,
                std::ptr::null_mut(),
                &mut ov,
                None,
            )
        };
        if ok == 0 {
            return Err(io::Error::last_os_error());
        }
        let handles = [raw(stopped), raw(changed)];
        // SAFETY: two valid event handles.
        let woke = unsafe { WaitForMultipleObjects(2, handles.as_ptr(), 0, INFINITE) };
        let mut n = 0u32;
        if woke == WAIT_OBJECT_0 {
            // SAFETY: cancel our read and wait until it is over, so that
            // nothing writes into `buf` after it is freed.
            unsafe {
                CancelIoEx(raw(dir), &ov);
                GetOverlappedResult(raw(dir), &ov, &mut n, 1);
            }
            return Ok(());
        }
        // SAFETY: the read completed (its event is set).
        if unsafe { GetOverlappedResult(raw(dir), &ov, &mut n, 1) } == 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(ERROR_OPERATION_ABORTED as i32) {
                return Ok(());
            }
            return Err(e);
        }
        if n == 0 {
            // More changes than the buffer held: look at every key.
            let _ = mailbox.send(Msg::All);
            continue;
        }
        let len = usize::try_from(n).unwrap_or(0).min(BUFFER_WORDS * 4);
        // SAFETY: the first `len` bytes of `buf` were written by the read.
        let written = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len) };
        for (name, removed) in changes(written) {
            post_name(mailbox, &name, removed);
        }
    }
}

/// The changes a read returned (`FILE_NOTIFY_INFORMATION` records): each
/// file name and whether it was removed (or renamed away). A record that
/// runs past the end ends the list.
fn changes(buf: &[u8]) -> Vec<(String, bool)> {
    let word = |at: usize| -> Option<u32> {
        let b = buf.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut out = Vec::new();
    let mut at = 0usize;
    while let (Some(next), Some(action), Some(name_len)) = (word(at), word(at + 4), word(at + 8)) {
        let start = at + 12;
        let Some(name) = usize::try_from(name_len)
            .ok()
            .and_then(|l| buf.get(start..start.checked_add(l)?))
        else {
            break;
        };
        let wide: Vec<u16> = name
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let removed = action == FILE_ACTION_REMOVED || action == FILE_ACTION_RENAMED_OLD_NAME;
        out.push((String::from_utf16_lossy(&wide), removed));
        if next == 0 {
            break;
        }
        match usize::try_from(next).ok().and_then(|n| at.checked_add(n)) {
            Some(n) => at = n,
            None => break,
        }
    }
    out
}

impl Drop for WindowsWatch {
    fn drop(&mut self) {
        // SAFETY: a valid event handle.
        unsafe { SetEvent(raw(&self.stop)) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(next: u32, action: u32, name: &str) -> Vec<u8> {
        let wide: Vec<u8> = name.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let mut r = Vec::new();
        r.extend(next.to_le_bytes());
        r.extend(action.to_le_bytes());
        r.extend(u32::try_from(wide.len()).unwrap().to_le_bytes());
        r.extend(wide);
        r
    }

    #[test]
    fn records_are_read_and_hostile_ones_end_the_list() {
        let mut buf = record(0, 3, "k.lock");
        let step = u32::try_from(buf.len()).unwrap();
        buf[0..4].copy_from_slice(&step.to_le_bytes());
        buf.extend(record(0, FILE_ACTION_REMOVED, "a.live"));
        assert_eq!(
            changes(&buf),
            vec![("k.lock".into(), false), ("a.live".into(), true)]
        );
        // A name longer than the buffer, an offset past it, a short tail.
        let mut long = record(0, 1, "x");
        long[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(changes(&long).is_empty());
        let mut past = record(u32::MAX, 1, "y");
        past.extend([0u8; 3]);
        assert_eq!(changes(&past), vec![("y".into(), false)]);
        assert!(changes(&[1, 2, 3]).is_empty());
    }
}
