//! The cross-host configuration (feature `etcd`), here with the rest of
//! the configuration so that it names nothing above it; the level itself
//! is `crate::global`.

use std::time::Duration;

use crate::pubkey::AgentPubkey;

/// Default lease TTL: the NIP's stale bound. Only the loss of a whole host
/// (or of its link to etcd) waits this long.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "/nip-le";

/// What a host leader does while etcd cannot be reached (no answer for a
/// whole TTL).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WhenUnreachable {
    /// The NIP's "duplicates over silence": every host leader acts for its
    /// host (`Level::Host`) until etcd answers again. A partition
    /// then answers a mention once per host.
    #[default]
    FallBack,
    /// Nobody acts until etcd answers: no duplicate, but no answer either.
    StaySilent,
}

impl std::str::FromStr for WhenUnreachable {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fall-back" | "fallback" => Ok(Self::FallBack),
            "stay-silent" | "silent" => Ok(Self::StaySilent),
            other => Err(format!(
                "unknown policy {other:?} (fall-back or stay-silent)"
            )),
        }
    }
}

/// Where and how to contend across hosts (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs, `http://host:port`; a failed call moves to the next.
    pub endpoints: Vec<String>,
    /// This host's id: every window of one host must use the same one
    /// (it is how a sibling knows it may continue the host's lease).
    pub host_id: String,
    /// Lease TTL, whole seconds (etcd's minimum is about 2 s).
    pub ttl: Duration,
    /// Key prefix shared by every host of the cluster.
    pub prefix: String,
    /// What to do while etcd cannot be reached.
    pub when_unreachable: WhenUnreachable,
}

impl EtcdConfig {
    /// Defaults (TTL 10 s, prefix `/nip-le`, fall back when unreachable)
    /// for `endpoints` and `host_id`.
    pub fn new(endpoints: Vec<String>, host_id: impl Into<String>) -> Self {
        Self {
            endpoints,
            host_id: host_id.into(),
            ttl: DEFAULT_TTL,
            prefix: DEFAULT_PREFIX.to_owned(),
            when_unreachable: WhenUnreachable::default(),
        }
    }

    /// Checks the configuration; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("etcd: no endpoint".into());
        }
        for e in &self.endpoints {
            if !e.starts_with("http://") || e.len() <= "http://".len() {
                return Err(format!("etcd endpoint {e:?}: must be http://host:port"));
            }
        }
        if !crate::host::valid_field(&self.host_id) {
            return Err(format!(
                "etcd host id {:?}: 1 to 255 bytes, no control characters",
                self.host_id
            ));
        }
        if self.ttl < Duration::from_secs(2) || self.ttl.subsec_nanos() != 0 {
            return Err(format!(
                "etcd ttl {:?}: whole seconds, at least 2",
                self.ttl
            ));
        }
        if !self.prefix.starts_with('/') || self.prefix.len() > 128 || self.prefix.ends_with('/') {
            return Err(format!(
                "etcd prefix {:?}: starts with '/', does not end with one",
                self.prefix
            ));
        }
        Ok(())
    }

    pub(crate) fn leader_key(&self, pk: &AgentPubkey) -> String {
        format!("{}/{pk}/leader", self.prefix)
    }

    pub(crate) fn claim_key(&self, pk: &AgentPubkey) -> String {
        format!("{}/{pk}/claim", self.prefix)
    }
}
