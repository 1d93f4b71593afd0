//! The scale rows: many processes, each joined to many keys, on one host
//! (`--processes`, `--keys`; 100 agents × 10 windows, say). Once the
//! cluster settled: the largest resident memory of one process, and the
//! CPU the whole idle cluster uses. Linux only (read from `/proc`).

use std::time::Duration;

use super::scenarios::Bench;
use super::{Row, Variant};

/// A process's resident memory, KiB (`VmRSS`).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let v = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    v.trim().trim_end_matches("kB").trim().parse().ok()
}

/// A process's CPU time so far (user and system), clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Clock ticks per second.
fn ticks_per_s() -> f64 {
    #[cfg(unix)]
    // SAFETY: sysconf reads a constant of the running system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[cfg(not(unix))]
    let t = 100;
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

impl Bench {
    /// Settled: the largest resident memory of one process (MiB).
    pub fn scale_memory(
        &self,
        v: &Variant,
        procs: usize,
        keys: usize,
        row: &mut Row,
    ) -> std::io::Result<()> {
        let Some((_tmp, insts)) = self.settled_cluster(v, procs, keys, row)? else {
            return Ok(());
        };
        // A refresh later, every key has been refreshed once.
        std::thread::sleep(self.cfg.refresh);
        match insts.iter().filter_map(|i| rss_kib(i.pid)).max() {
            Some(kib) => row.samples.push(kib as f64 / 1024.0),
            None => row.violations.push("no /proc/PID/status to read".into()),
        }
        Ok(())
    }

    /// Settled and idle for two refreshes: the CPU every process used in
    /// all, in percent of one core.
    pub fn scale_cpu(
        &self,
        v: &Variant,
        procs: usize,
        keys: usize,
        row: &mut Row,
    ) -> std::io::Result<()> {
        let Some((_tmp, insts)) = self.settled_cluster(v, procs, keys, row)? else {
            return Ok(());
        };
        let total = || -> Option<u64> { insts.iter().map(|i| cpu_ticks(i.pid)).sum() };
        std::thread::sleep(self.cfg.refresh);
        let window = self.cfg.refresh * 2;
        let (Some(before), t0) = (total(), std::time::Instant::now()) else {
            row.violations.push("no /proc/PID/stat to read".into());
            return Ok(());
        };
        std::thread::sleep(window);
        let after = total().unwrap_or(before);
        let secs = t0.elapsed().max(Duration::from_millis(1)).as_secs_f64();
        let used = after.saturating_sub(before) as f64 / ticks_per_s();
        row.samples.push(100.0 * used / secs);
        Ok(())
    }
}
