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

/// Idle threads of the floor's app-sized holder.
pub(super) const APP_THREADS: usize = 32;

/// Options of the hidden `hold-lock` command.
#[derive(Args, Debug)]
pub struct HoldLockArgs {
    /// The file to lock.
    path: PathBuf,
    /// Idle threads to start first (a process the size of an app's).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// Takes an exclusive lock on the file (as a presence lock is taken: `flock`,
/// `LockFileEx` on Windows), says `locked`, and holds it until killed.
pub fn hold_lock(a: HoldLockArgs) -> std::process::ExitCode {
    for _ in 0..a.threads {
        if let Err(e) =
            std::thread::Builder::new().spawn(|| std::thread::sleep(Duration::from_secs(86_400)))
        {
            eprintln!("hold-lock: no thread: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
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

/// `runs` times: a child (with `threads` idle threads beside its main
/// one) holds the lock, is killed, and this process spins on a
/// non-blocking attempt until it has the lock. Milliseconds from the kill,
/// sorted.
pub(super) fn lock_release(runs: usize, threads: usize) -> std::io::Result<Vec<f64>> {
    let exe = std::env::current_exe()?;
    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("floor.lock");
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut child = Command::new(&exe)
            .arg("hold-lock")
            .arg(&path)
            .arg(format!("--threads={threads}"))
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

/// What a killed *instance* costs the OS, beside [`lock_release`]'s minimal
/// holder: a real `run` on the portable backend (its threads, its
/// directory watch, its files) leads a key and is killed; this process
/// waits for it to exit and then probes its presence lock until it reads
/// free, as a survivor's exit watch does.
pub(super) struct InstanceRelease {
    /// From the kill until the process is reaped (its handle signalled), ms.
    pub reaped_ms: Vec<f64>,
    /// From the kill until its presence lock reads free, ms.
    pub free_ms: Vec<f64>,
    /// The slowest single probe of each run, µs.
    pub slowest_probe_us: Vec<f64>,
}

/// `runs` times: an instance leads, is killed and reaped, and its presence
/// lock is probed until free. Each list sorted.
pub(super) fn instance_release(runs: usize) -> std::io::Result<InstanceRelease> {
    use nip_le::presence::{probe_holder, HolderPresence};
    use nip_le_cli::drive::cluster::{random_pubkey, wait_until, Instance, RunOptions};

    let exe = std::env::current_exe()?;
    let mut out = InstanceRelease {
        reaped_ms: Vec::with_capacity(runs),
        free_ms: Vec::with_capacity(runs),
        slowest_probe_us: Vec::with_capacity(runs),
    };
    for _ in 0..runs {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("locks");
        let pk = random_pubkey();
        let mut opts = RunOptions::new(&exe, &dir, pk);
        opts.extra_args = vec!["--backend".into(), "portable".into()];
        let mut inst = Instance::spawn("holder", opts.command(None), Duration::from_secs(10))?;
        if !wait_until(Duration::from_secs(10), || {
            inst.is_leader_of(pk.as_str()) == Some(true)
        }) {
            // Dropping an Instance kills and reaps it.
            return Err(std::io::Error::other("the instance did not lead"));
        }
        let record = std::fs::read(nip_le::lockfile::lock_path(&dir, &pk))?;
        let token = serde_json::from_slice::<serde_json::Value>(&record)
            .ok()
            .and_then(|v| v.get("live")?.as_str().map(str::to_owned))
            .ok_or_else(|| std::io::Error::other("the lock record names no presence"))?;
        if !matches!(probe_holder(&dir, &token), HolderPresence::Alive(_)) {
            return Err(std::io::Error::other(
                "the leader's presence does not read held",
            ));
        }
        // As a survivor's exit watch does: wait on the process, then probe.
        // (Probing while it dies would compete with its teardown for the
        // wineserver under Wine, and measure that instead.)
        let t0 = Instant::now();
        inst.kill_and_reap()?;
        out.reaped_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        let deadline = t0 + Duration::from_secs(10);
        let mut slowest = 0f64;
        loop {
            let p0 = Instant::now();
            let gone = probe_holder(&dir, &token) == HolderPresence::Gone;
            slowest = slowest.max(p0.elapsed().as_secs_f64() * 1e6);
            if gone {
                break;
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other("the presence lock stayed held"));
            }
            std::thread::yield_now();
        }
        out.free_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        out.slowest_probe_us.push(slowest);
    }
    for v in [
        &mut out.reaped_ms,
        &mut out.free_ms,
        &mut out.slowest_probe_us,
    ] {
        v.sort_by(f64::total_cmp);
    }
    Ok(out)
}
