//! The one validated configuration every timing comes from.
//!
//! Defaults are the NIP's: refresh 5 s, stale 10 s, stand-down 10 s. Tests
//! shorten them through this same type, so the validation applies to them too.

#[cfg(feature = "etcd")]
pub mod etcd;

use std::path::PathBuf;
use std::time::Duration;

/// Environment variable that overrides the default lock directory.
pub const LOCK_DIR_ENV: &str = "BUZZ_LEADER_LOCK_DIR";

/// NIP-LE refresh interval: each instance re-attempts its claim and re-reads.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(5);
/// NIP-LE staleness bound for `claimed_at` (comfortably above the refresh).
pub const DEFAULT_STALE: Duration = Duration::from_secs(10);
/// NIP-LE stand-down auto-expiry (2 × refresh).
pub const DEFAULT_STAND_DOWN: Duration = Duration::from_secs(10);
/// Extension: how long the work ledger remembers a taken or done event.
pub const DEFAULT_WORK_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long one acquire waits for the exclusive file lock before giving up.
/// Peers hold it for microseconds; a peer that hangs while holding it must not
/// hang us.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_millis(250);

/// Which behaviour the elector follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Every extension on (presence locks, directory watch, direct handoff,
    /// fencing epoch, self-fencing), byte-compatible with spec instances.
    #[default]
    Extended,
    /// Exactly the NIP: the refresh tick is the only clock, release truncates,
    /// records carry the three NIP fields only. For comparison and for
    /// environments where the extensions cannot run.
    Spec,
}

impl Mode {
    /// `extended` or `spec`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Extended => "extended",
            Mode::Spec => "spec",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "extended" => Ok(Mode::Extended),
            "spec" => Ok(Mode::Spec),
            other => Err(format!("unknown mode {other:?} (extended or spec)")),
        }
    }
}

/// Why a configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A duration that must be positive is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// The stale bound does not exceed the refresh interval, so a live
    /// leader could be evicted between two of its own refreshes.
    #[error("stale ({stale:?}) must exceed refresh ({refresh:?})")]
    StaleNotAboveRefresh {
        /// Configured stale bound.
        stale: Duration,
        /// Configured refresh interval.
        refresh: Duration,
    },
    /// The lock wait is not shorter than the refresh, so one blocked acquire
    /// could swallow whole ticks.
    #[error("lock wait ({lock_wait:?}) must be shorter than refresh ({refresh:?})")]
    LockWaitNotBelowRefresh {
        /// Configured lock wait.
        lock_wait: Duration,
        /// Configured refresh interval.
        refresh: Duration,
    },
    /// The lock directory is empty or relative.
    #[error("lock directory must be an absolute path, got {0:?}")]
    LockDir(PathBuf),
    /// The cross-host configuration is not usable.
    #[error("{0}")]
    Etcd(String),
    /// No home directory to derive the default lock directory from.
    #[error("cannot determine the home directory; set {LOCK_DIR_ENV} or a lock dir")]
    NoHome,
}

/// Election configuration. Build it with [`Config::default_from_env`] or
/// [`Config::new`], adjust the public fields, then [`Config::validate`]
/// (the [`crate::Elector`] validates again on start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Directory holding `<pubkey>.lock` files.
    pub lock_dir: PathBuf,
    /// Refresh interval (re-claim and re-read).
    pub refresh: Duration,
    /// A claim whose `claimed_at` is further than this from now is stale.
    pub stale: Duration,
    /// How long a stand-down suppresses acquiring before it expires.
    pub stand_down: Duration,
    /// Upper bound on waiting for the exclusive file lock.
    pub lock_wait: Duration,
    /// Extensions on (default) or the plain NIP.
    pub mode: Mode,
    /// Extension: how long the work ledger remembers a taken or done event
    /// (24 h by default). An event older than this is owed again if it is
    /// still queued: keep it above the age of the oldest event a window
    /// fetches when it connects.
    pub work_retention: Duration,
    /// Extension (feature `etcd`): contend across hosts on etcd; `None`
    /// (the default) keeps leadership host-local, as the NIP has it.
    #[cfg(feature = "etcd")]
    pub etcd: Option<etcd::EtcdConfig>,
}

impl Config {
    /// NIP defaults with an explicit lock directory.
    pub fn new(lock_dir: impl Into<PathBuf>) -> Self {
        Self {
            lock_dir: lock_dir.into(),
            refresh: DEFAULT_REFRESH,
            stale: DEFAULT_STALE,
            stand_down: DEFAULT_STAND_DOWN,
            lock_wait: DEFAULT_LOCK_WAIT,
            mode: Mode::default(),
            work_retention: DEFAULT_WORK_RETENTION,
            #[cfg(feature = "etcd")]
            etcd: None,
        }
    }

    /// NIP defaults with the lock directory from `BUZZ_LEADER_LOCK_DIR`, or
    /// `<home>/.buzz/leader-locks`.
    pub fn default_from_env() -> Result<Self, ConfigError> {
        Ok(Self::new(default_lock_dir()?))
    }

    /// Checks every invariant; tests and the CLI go through this too.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, d) in [
            ("refresh", self.refresh),
            ("stale", self.stale),
            ("stand_down", self.stand_down),
            ("lock_wait", self.lock_wait),
            ("work_retention", self.work_retention),
        ] {
            if d.is_zero() {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.stale <= self.refresh {
            return Err(ConfigError::StaleNotAboveRefresh {
                stale: self.stale,
                refresh: self.refresh,
            });
        }
        if self.lock_wait >= self.refresh {
            return Err(ConfigError::LockWaitNotBelowRefresh {
                lock_wait: self.lock_wait,
                refresh: self.refresh,
            });
        }
        if self.lock_dir.as_os_str().is_empty() || !self.lock_dir.is_absolute() {
            return Err(ConfigError::LockDir(self.lock_dir.clone()));
        }
        #[cfg(feature = "etcd")]
        if let Some(etcd) = &self.etcd {
            etcd.validate().map_err(ConfigError::Etcd)?;
        }
        Ok(())
    }
}

/// `BUZZ_LEADER_LOCK_DIR` when set and non-empty, else
/// `<home>/.buzz/leader-locks` (the platform's home on Windows).
pub fn default_lock_dir() -> Result<PathBuf, ConfigError> {
    if let Some(dir) = std::env::var_os(LOCK_DIR_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    dirs::home_dir()
        .map(|h| h.join(".buzz").join("leader-locks"))
        .ok_or(ConfigError::NoHome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nip_defaults_are_valid() {
        let c = Config::new("/tmp/x");
        assert_eq!(c.refresh, Duration::from_secs(5));
        assert_eq!(c.stale, Duration::from_secs(10));
        assert_eq!(c.stand_down, Duration::from_secs(10));
        c.validate().unwrap();
    }

    #[test]
    fn rejects_bad_timings_and_dirs() {
        let mut c = Config::new("/tmp/x");
        c.stale = c.refresh;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::StaleNotAboveRefresh { .. })
        ));
        let mut c = Config::new("/tmp/x");
        c.refresh = Duration::ZERO;
        assert_eq!(c.validate(), Err(ConfigError::Zero("refresh")));
        let mut c = Config::new("/tmp/x");
        c.lock_wait = c.refresh;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::LockWaitNotBelowRefresh { .. })
        ));
        assert!(matches!(
            Config::new("relative/dir").validate(),
            Err(ConfigError::LockDir(_))
        ));
        assert!(matches!(
            Config::new("").validate(),
            Err(ConfigError::LockDir(_))
        ));
    }
}
