//! The commands users and outside tools run: `run` and `status`, and the
//! timing flags every command shares.

pub mod agent;
mod msg;
mod replies;
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
    /// How long a reply sent while leading may take to reach the relay, in
    /// milliseconds: a leader that cannot write stops acting this long
    /// before anyone may take over [default: 1000].
    #[arg(long)]
    pub reply_flight_ms: Option<u64>,
    /// `extended` (presence locks, directory watch, handoff, epoch,
    /// self-fencing) or `spec` (exactly the NIP) [default: extended].
    #[arg(long)]
    pub mode: Option<nip_le::Mode>,
    /// `native` (Linux: shared presence file, inotify, pidfd, boot id) or
    /// `portable` (what macOS and Windows run: presence files, a directory
    /// watch of changes, a thread per holder waiting for its exit, no boot
    /// id) [default: $NIP_LE_BACKEND or native].
    #[arg(long)]
    pub backend: Option<nip_le::Backend>,
}

/// Cross-host leadership on etcd, shared by `run` and `status`.
#[derive(Args, Debug, Clone, Default)]
pub struct EtcdArgs {
    /// etcd client URL (http://host:port, or https://host:port with
    /// --etcd-ca); repeat for several endpoints. With it, the host leader
    /// contends for the agent's etcd lease and `is_leader` means "may act"
    /// across every host.
    #[arg(long = "etcd", value_name = "URL")]
    pub etcd: Vec<String>,
    /// This host's id (the same for every window of one host, different
    /// on every host) [default: a random id kept in the lock directory's
    /// `etcd-host-id`].
    #[arg(long, requires = "etcd")]
    pub host_id: Option<String>,
    /// Lease TTL in whole seconds [default: 10].
    #[arg(long, requires = "etcd")]
    pub etcd_ttl_s: Option<u64>,
    /// What a host leader does while etcd cannot be reached: `fall-back`
    /// (act for this host: duplicates over silence) or `stay-silent`
    /// [default: fall-back].
    #[arg(long, requires = "etcd")]
    pub when_etcd_unreachable: Option<nip_le::global::WhenUnreachable>,
    /// etcd key prefix [default: /nip-le].
    #[arg(long, requires = "etcd")]
    pub etcd_prefix: Option<String>,
    /// TLS: PEM file of the CA that signs etcd's server certificate
    /// (required by https:// endpoints; only it is trusted).
    #[arg(long, value_name = "FILE", requires = "etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// TLS: PEM file of this client's certificate, for etcd's
    /// --client-cert-auth (with --etcd-key).
    #[arg(long, value_name = "FILE", requires_all = ["etcd_ca", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// TLS: PEM file of the client certificate's private key.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_ca", "etcd_cert"])]
    pub etcd_key: Option<PathBuf>,
    /// etcd user to authenticate as (with --etcd-password-file).
    #[arg(long, value_name = "NAME", requires_all = ["etcd", "etcd_password_file"])]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password (one trailing newline is
    /// ignored; readable by its owner alone, chmod 600); never printed.
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// Send the etcd user's password over plain http:// to an endpoint on
    /// another machine (refused without it: it travels in clear).
    #[arg(long, requires = "etcd_user")]
    pub etcd_allow_plain_auth: bool,
}

impl EtcdArgs {
    /// The etcd configuration, when `--etcd` was given; an error when the
    /// password file cannot be read.
    pub fn config(&self) -> Result<Option<nip_le::global::EtcdConfig>, nip_le::Error> {
        if self.etcd.is_empty() {
            return Ok(None);
        }
        let host = self.host_id.clone().unwrap_or_default();
        let mut c = nip_le::global::EtcdConfig::new(self.etcd.clone(), host);
        if let Some(s) = self.etcd_ttl_s {
            c.ttl = Duration::from_secs(s);
        }
        if let Some(w) = self.when_etcd_unreachable {
            c.when_unreachable = w;
        }
        if let Some(p) = &self.etcd_prefix {
            c.prefix = p.clone();
        }
        if let Some(ca) = &self.etcd_ca {
            c.tls = Some(nip_le::global::EtcdTls {
                ca: ca.clone(),
                cert: self.etcd_cert.clone(),
                key: self.etcd_key.clone(),
            });
        }
        if let (Some(user), Some(file)) = (&self.etcd_user, &self.etcd_password_file) {
            let auth = nip_le::global::EtcdAuth::from_password_file(user.clone(), file)
                .map_err(|e| nip_le::Error::Config(nip_le::config::ConfigError::Etcd(e)))?;
            c.auth = Some(auth);
        }
        c.allow_plain_http_auth = self.etcd_allow_plain_auth;
        Ok(Some(c))
    }
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
    if let Some(v) = t.reply_flight_ms {
        c.reply_flight = ms(v);
    }
    if let Some(v) = lock_wait_ms {
        c.lock_wait = ms(v);
    }
    if let Some(m) = t.mode {
        c.mode = m;
    }
    c.backend = match t.backend {
        Some(b) => b,
        None => nip_le::config::backend_from_env()?,
    };
    c.validate()?;
    Ok(c)
}
