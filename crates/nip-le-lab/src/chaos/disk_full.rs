//! The lock directories' filesystem full now and then (`--fill-locks-fs`):
//! a file takes every free byte of it for a while, so that every lock
//! write, ledger line and presence update there meets ENOSPC (a short
//! write first), as on a full disk. What is left free is less than a
//! page: an append into a file's last page may still land, as on a real
//! disk's last block.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::outcome::Outcome;

/// Fills `dir`'s filesystem for `full_for` every `every`.
pub struct DiskFiller {
    file: PathBuf,
    full_for: Duration,
    every: Duration,
    next: Instant,
    /// While full: until when, and since when (unix ms).
    until: Option<(Instant, u64)>,
}

impl DiskFiller {
    /// The first fill comes after `every`.
    pub fn new(dir: PathBuf, full_for: Duration, every: Duration) -> Self {
        Self {
            file: dir.join("chaos-fill"),
            full_for,
            every,
            next: Instant::now() + every,
            until: None,
        }
    }

    /// Fills or frees when its time has come; each span goes to `out`.
    pub fn tick(&mut self, out: &mut Outcome) {
        let now = Instant::now();
        match self.until {
            Some((until, _)) if now >= until => self.free(out),
            None if now >= self.next => {
                let since = nip_le_cli::unix_ms();
                fill(&self.file);
                self.until = Some((now + self.full_for, since));
                *out.counts.entry("disk full").or_default() += 1;
            }
            _ => {}
        }
    }

    /// Frees the filesystem (at once, at the end of the faults).
    pub fn free(&mut self, out: &mut Outcome) {
        let _ = std::fs::remove_file(&self.file);
        if let Some((_, since)) = self.until.take() {
            out.disk_full.push((since, nip_le_cli::unix_ms()));
        }
        self.next = Instant::now() + self.every;
    }
}

/// Writes zeros into `file` until the filesystem refuses, in ever smaller
/// pieces.
fn fill(file: &PathBuf) {
    let Ok(mut f) = std::fs::File::create(file) else {
        return;
    };
    for size in [1 << 20, 1 << 12, 1 << 8] {
        let chunk = vec![0u8; size];
        while f.write_all(&chunk).is_ok() {}
    }
}
