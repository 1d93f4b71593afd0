//! The commands users and outside tools run: `run` and `status`, and the
//! timing flags every command shares.

pub mod run;
pub mod status;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nip_le::Config;

/// The NIP timings as flags, shared by `run`, `demo` and `bench`.
#[derive(Args, Debug, Clone, Default)]
pub struct TimingArgs {
    /// Refresh interval in milliseconds [default: 5000].
    #[arg(long)]
    pub refresh_ms: Option<u64>,
    /// Stale bound for claimed_at in milliseconds [default: 10000].
    #[arg(long)]
    pub stale_ms: Option<u64>,
    /// Stand-down timeout in milliseconds [default: 10000].
    #[arg(long)]
    pub stand_down_ms: Option<u64>,
    /// `extended` (presence locks, directory watch, handoff, epoch,
    /// self-fencing) or `spec` (exactly the NIP) [default: extended].
    #[arg(long)]
    pub mode: Option<nip_le::Mode>,
}

/// Builds the validated config from the flags (shared by every command).
pub fn config_from(
    lock_dir: Option<PathBuf>,
    t: &TimingArgs,
    lock_wait_ms: Option<u64>,
) -> Result<Config, nip_le::Error> {
    let mut c = match lock_dir {
        Some(d) => Config::new(
            std::path::absolute(&d).map_err(|e| nip_le::Error::Io { path: d, source: e })?,
        ),
        None => Config::default_from_env()?,
    };
    let ms = Duration::from_millis;
    if let Some(v) = t.refresh_ms {
        c.refresh = ms(v);
        // Keep the default lock wait valid for short test refreshes.
        c.lock_wait = c.lock_wait.min(c.refresh / 2);
    }
    if let Some(v) = t.stale_ms {
        c.stale = ms(v);
    }
    if let Some(v) = t.stand_down_ms {
        c.stand_down = ms(v);
    }
    if let Some(v) = lock_wait_ms {
        c.lock_wait = ms(v);
    }
    if let Some(m) = t.mode {
        c.mode = m;
    }
    c.validate()?;
    Ok(c)
}
