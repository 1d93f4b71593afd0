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
/// Extension: how long a reply sent while a leader may act can take to
/// reach the relay.
pub const DEFAULT_REPLY_FLIGHT: Duration = Duration::from_secs(1);
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

/// Environment variable that selects the [`Backend`] of
/// [`Config::default_from_env`] (`native` or `portable`).
pub const BACKEND_ENV: &str = "NIP_LE_BACKEND";

/// Which platform code an extended elector runs. Both speak the same files
/// and interoperate in one lock directory; only how an elector announces
/// itself and learns of changes differs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The platform's fast paths. On Linux: one shared presence file with a
    /// byte-range (OFD) lock per elector, inotify with change-only masks,
    /// a `pidfd` per watched holder and the kernel's boot id. On macOS and
    /// Windows this is the same code as [`Backend::Portable`] (plus the
    /// boot id on macOS).
    #[default]
    Native,
    /// What macOS and Windows run, selectable on Linux so that it is tested
    /// there: one presence file per elector (an exclusive `flock` and a
    /// `.info` body), a directory watch of changes from a thread of its own
    /// (the `notify` crate on macOS and Windows), one thread per watched
    /// holder blocked on its process's exit (stopped when the key is left),
    /// no boot id in records (as on Windows; macOS writes its
    /// own), and supervised agents that are not killed with their window
    /// but stopped by its successor ([`crate::agent`]).
    Portable,
}

impl Backend {
    /// `native` or `portable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Native => "native",
            Backend::Portable => "portable",
        }
    }

    /// Whether this build runs the Linux fast paths for this choice.
    pub(crate) fn linux_fast_paths(self) -> bool {
        cfg!(target_os = "linux") && self == Backend::Native
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "native" => Ok(Backend::Native),
            "portable" => Ok(Backend::Portable),
            other => Err(format!("unknown backend {other:?} (native or portable)")),
        }
    }
}

/// Why a configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// `NIP_LE_BACKEND` names no backend.
    #[error("{BACKEND_ENV}: {0}")]
    Backend(String),
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
    /// The platform code of extended mode ([`Backend::Native`] by default;
    /// spec mode uses none of it).
    pub backend: Backend,
    /// Extension: how long the work ledger remembers a taken or done event
    /// (24 h by default). An event older than this is owed again if it is
    /// still queued: keep it above the age of the oldest event a window
    /// fetches when it connects.
    pub work_retention: Duration,
    /// Extension: how long a reply the app sent while it could act may take
    /// to reach the relay (1 s by default). A leader that cannot write its
    /// record stops acting this long before anyone may take over from it
    /// (at least 50 ms, at most a quarter of the gap between `refresh` and
    /// `stale`), so such a reply, and its `done`, land before a successor
    /// owes the event.
    pub reply_flight: Duration,
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
            backend: Backend::default(),
            work_retention: DEFAULT_WORK_RETENTION,
            reply_flight: DEFAULT_REPLY_FLIGHT,
            #[cfg(feature = "etcd")]
            etcd: None,
        }
    }

    /// NIP defaults with the lock directory from `BUZZ_LEADER_LOCK_DIR`, or
    /// `<home>/.buzz/leader-locks`, and the backend from `NIP_LE_BACKEND`
    /// when set (an escape hatch: `portable` turns the Linux fast paths
    /// off without a rebuild).
    pub fn default_from_env() -> Result<Self, ConfigError> {
        let mut c = Self::new(default_lock_dir()?);
        c.backend = backend_from_env()?;
        Ok(c)
    }

    /// How often a watched holder's presence lock is probed where its
    /// process's exit cannot be waited for (a pid that is no process here,
    /// no `pidfd_open`), and the longest pause between the probes that
    /// confirm an exit: a twentieth of the refresh, within 10 ms to 250 ms
    /// (250 ms at the NIP's defaults).
    pub fn holder_poll(&self) -> Duration {
        (self.refresh / 20).clamp(Duration::from_millis(10), Duration::from_millis(250))
    }

    /// Checks every invariant; tests and the CLI go through this too.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, d) in [
            ("refresh", self.refresh),
            ("stale", self.stale),
            ("stand_down", self.stand_down),
            ("lock_wait", self.lock_wait),
            ("work_retention", self.work_retention),
            ("reply_flight", self.reply_flight),
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

/// `NIP_LE_BACKEND` when set and non-empty, else [`Backend::Native`].
pub fn backend_from_env() -> Result<Backend, ConfigError> {
    backend_of(std::env::var(BACKEND_ENV))
}

fn backend_of(var: Result<String, std::env::VarError>) -> Result<Backend, ConfigError> {
    match var {
        Ok(v) if !v.is_empty() => v.parse().map_err(ConfigError::Backend),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(Backend::Native),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(ConfigError::Backend(format!("not UTF-8: {v:?}")))
        }
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
        // Absolute on every platform (`/tmp/x` is not on Windows).
        let c = Config::new(std::env::temp_dir().join("x"));
        assert_eq!(c.refresh, Duration::from_secs(5));
        assert_eq!(c.stale, Duration::from_secs(10));
        assert_eq!(c.stand_down, Duration::from_secs(10));
        c.validate().unwrap();
    }

    #[test]
    fn backends_parse_and_default_to_native() {
        assert_eq!(Config::new("/tmp/x").backend, Backend::Native);
        for b in [Backend::Native, Backend::Portable] {
            assert_eq!(b.as_str().parse::<Backend>(), Ok(b));
        }
        for bad in ["", "Native", "fast", "portable "] {
            assert!(bad.parse::<Backend>().is_err(), "{bad:?}");
        }
        use std::env::VarError;
        assert_eq!(backend_of(Err(VarError::NotPresent)), Ok(Backend::Native));
        assert_eq!(backend_of(Ok(String::new())), Ok(Backend::Native));
        assert_eq!(backend_of(Ok("portable".into())), Ok(Backend::Portable));
        assert!(matches!(
            backend_of(Ok("../x".into())),
            Err(ConfigError::Backend(_))
        ));
        assert!(!Backend::Portable.linux_fast_paths());
        assert_eq!(Config::new("/x").holder_poll(), Duration::from_millis(250));
        let mut c = Config::new("/x");
        c.refresh = Duration::from_millis(50);
        assert_eq!(c.holder_poll(), Duration::from_millis(10));
        assert_eq!(
            Backend::Native.linux_fast_paths(),
            cfg!(target_os = "linux")
        );
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
