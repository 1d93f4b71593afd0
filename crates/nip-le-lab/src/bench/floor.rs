//! The OS's own share of a crash's failover: how long after a holder is
//! killed another process can take the exclusive lock it held, with nothing
//! else running. It is the floor under the "SIGKILL of the leader" row on
//! this platform (under Wine: the wineserver's cleanup of the dead process),
//! printed beside it so a figure is read against what the OS allows.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

/// Options of the hidden `hold-lock` command.
#[derive(Args, Debug)]
pub struct HoldLockArgs {
    /// The file to lock.
    path: PathBuf,
}

/// Takes an exclusive lock on the file (as a presence lock is taken: `flock`,
/// `LockFileEx` on Windows), says `locked`, and holds it until killed.
pub fn hold_lock(a: HoldLockArgs) -> std::process::ExitCode {
    let locked = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&a.path)
        .and_then(|f| fs4::FileExt::lock(&f).map(|()| f));
    match locked {
        Ok(_f) => {
            println!("locked");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Err(e) => {
            eprintln!("hold-lock: {}: {e}", a.path.display());
            std::process::ExitCode::FAILURE
        }
    }
}

/// `runs` times: a child holds the lock, is killed, and this process spins
/// on a non-blocking attempt until it has the lock. Milliseconds from the
/// kill, sorted.
pub(super) fn lock_release(runs: usize) -> std::io::Result<Vec<f64>> {
    let exe = std::env::current_exe()?;
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("floor.lock");
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut child = Command::new(&exe)
            .arg("hold-lock")
            .arg(&path)
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        if line.trim() != "locked" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("hold-lock did not lock"));
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        let t0 = Instant::now();
        child.kill()?;
        let deadline = t0 + Duration::from_secs(10);
        loop {
            match fs4::FileExt::try_lock(&f) {
                Ok(()) => break,
                Err(fs4::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::yield_now()
                }
                Err(fs4::TryLockError::WouldBlock) => {
                    return Err(std::io::Error::other("the lock stayed held"))
                }
                Err(fs4::TryLockError::Error(e)) => return Err(e),
            }
        }
        samples.push(t0.elapsed().as_secs_f64() * 1e3);
        fs4::FileExt::unlock(&f)?;
        child.wait()?;
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}

/// The unit cost of a file call on this platform: an open and a close of
/// an existing file, `runs` × 10 times, microseconds, sorted. Under Wine
/// each is a round trip to the wineserver.
pub(super) fn open_close(runs: usize) -> std::io::Result<Vec<f64>> {
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("unit");
    std::fs::write(&path, b"x")?;
    let mut samples = Vec::with_capacity(runs * 10);
    for _ in 0..runs * 10 {
        let t0 = Instant::now();
        drop(std::fs::File::open(&path)?);
        samples.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}
