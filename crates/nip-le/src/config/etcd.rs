//! The cross-host configuration (feature `etcd`), here with the rest of
//! the configuration so that it names nothing above it; the level itself
//! is `crate::global`. Its transport security (TLS files, user and
//! password) is loaded and checked here too, so that a bad file is an
//! error of [`EtcdConfig::validate`], not of the first call.

use std::path::{Path, PathBuf};
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
    /// (it is how a sibling knows it may continue the host's lease), and
    /// no two hosts may share one. Empty (the default): a random id kept
    /// in the lock directory ([`crate::global::HOST_ID_FILE`]), made by
    /// the first window that needs it.
    pub host_id: String,
    /// Lease TTL, whole seconds (etcd's minimum is about 2 s).
    pub ttl: Duration,
    /// Key prefix shared by every host of the cluster.
    pub prefix: String,
    /// What to do while etcd cannot be reached.
    pub when_unreachable: WhenUnreachable,
    /// TLS to etcd: required by `https://` endpoints, refused with
    /// `http://` ones. `None` (the default): plain HTTP.
    pub tls: Option<EtcdTls>,
    /// etcd user authentication; `None` (the default): none. Over plain
    /// HTTP the password travels in clear: use it with [`EtcdTls`].
    pub auth: Option<EtcdAuth>,
    /// Send [`EtcdConfig::auth`]'s password over plain `http://` to an
    /// endpoint that is not this machine (`false`, the default: refused by
    /// [`EtcdConfig::validate`], since anyone on the path reads it; a
    /// loopback endpoint is always allowed).
    pub allow_plain_http_auth: bool,
}

/// TLS to etcd (cargo feature `etcd-tls`; see docs/cross-host.md,
/// "Transport security and trust model").
///
/// Only the certificate authorities in `ca` are trusted for etcd's
/// server certificates (not the system's roots): a cluster's CA is
/// usually its own. With `cert` and `key`, the client presents a
/// certificate, as etcd's `--client-cert-auth` requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM file of the CA certificate(s) that sign etcd's server
    /// certificates.
    pub ca: PathBuf,
    /// PEM file of this client's certificate (its chain, leaf first);
    /// set together with `key`.
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (PKCS#8, PKCS#1
    /// or SEC1); set together with `cert`.
    pub key: Option<PathBuf>,
}

impl EtcdTls {
    /// TLS trusting the CA(s) in the PEM file `ca`, with no client
    /// certificate.
    pub fn new(ca: impl Into<PathBuf>) -> Self {
        Self {
            ca: ca.into(),
            cert: None,
            key: None,
        }
    }

    /// The same, presenting the client certificate `cert` with its
    /// private key `key` (PEM files).
    pub fn with_client_cert(self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        Self {
            cert: Some(cert.into()),
            key: Some(key.into()),
            ..self
        }
    }

    /// The TLS configuration of these files for the gRPC client, checked
    /// first with rustls (that the files parse, the CA is usable, the key
    /// fits the certificate): an error names the file and what is wrong
    /// with it.
    #[cfg(feature = "etcd-tls")]
    pub(crate) fn client_config(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use rustls::{ClientConfig, RootCertStore};
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};

        let certs = |path: &Path| -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), String> {
            let pem = read_file(path, "etcd TLS")?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("etcd TLS {}: {e}", path.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "etcd TLS {}: no PEM certificate in it",
                    path.display()
                ));
            }
            Ok((pem, certs))
        };
        let (ca_pem, ca) = certs(&self.ca)?;
        let mut roots = RootCertStore::empty();
        for c in ca {
            roots
                .add(c)
                .map_err(|e| format!("etcd TLS CA {}: {e}", self.ca.display()))?;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("etcd TLS: {e}"))?
            .with_root_certificates(roots);
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
        match (&self.cert, &self.key) {
            (None, None) => Ok(config),
            (Some(cert), Some(key)) => {
                let (cert_pem, chain) = certs(cert)?;
                let key_pem = read_secret(key, "etcd TLS key")?;
                let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| format!("etcd TLS key {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| format!("etcd TLS client certificate {}: {e}", cert.display()))?;
                Ok(config.identity(Identity::from_pem(cert_pem, key_pem)))
            }
            _ => Err(
                "etcd TLS: a client certificate needs its key, and a key its certificate".into(),
            ),
        }
    }

    fn validate(&self) -> Result<(), String> {
        #[cfg(feature = "etcd-tls")]
        return self.client_config().map(drop);
        #[cfg(not(feature = "etcd-tls"))]
        Err("etcd TLS: this build of nip-le lacks its cargo feature etcd-tls".into())
    }
}

/// etcd user authentication: the client takes a token for `user` and
/// sends it with every call. The password is never printed: `Debug` shows
/// it redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    /// The etcd user.
    pub user: String,
    password: String,
}

impl EtcdAuth {
    /// Credentials of `user`.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            password: password.into(),
        }
    }

    /// Credentials of `user` whose password is the content of the file
    /// `path`, less one trailing newline (`\n` or `\r\n`). On Unix the
    /// file must be readable by its owner alone (`chmod 600`), as ssh asks
    /// of a private key: one that group or others may read is refused.
    pub fn from_password_file(user: impl Into<String>, path: &Path) -> Result<Self, String> {
        let bytes = read_secret(path, "etcd password file")?;
        let mut text = String::from_utf8(bytes)
            .map_err(|_| format!("etcd password file {}: not UTF-8", path.display()))?;
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        Ok(Self::new(user, text))
    }

    pub(crate) fn password(&self) -> &str {
        &self.password
    }

    fn validate(&self) -> Result<(), String> {
        if !crate::host::valid_field(&self.user) {
            return Err(format!(
                "etcd user {:?}: 1 to 255 bytes, no control characters",
                self.user
            ));
        }
        if self.password.is_empty() {
            return Err(format!("etcd user {:?}: empty password", self.user));
        }
        Ok(())
    }
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[cfg(feature = "etcd-tls")]
fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    read_bounded(f, path, what)
}

/// [`read_file`] for a secret (a password, a private key), refused as ssh
/// refuses a private key when group or others may read it: whoever can
/// read it is this host to etcd. Checked on the file opened, not on the
/// path, so a swap between the check and the read cannot slip one in.
/// Windows has no such bits (its ACLs are the user profile's).
fn read_secret(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = f
            .metadata()
            .map_err(|e| format!("{what} {}: {e}", path.display()))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{what} {}: permissions {mode:04o} are too open: group or others may read it \
                 (chmod 600 it)",
                path.display()
            ));
        }
    }
    read_bounded(f, path, what)
}

fn read_bounded(f: std::fs::File, path: &Path, what: &str) -> Result<Vec<u8>, String> {
    // Bounded: a PEM file or a password is a few kilobytes.
    use std::io::Read as _;
    let mut bytes = Vec::new();
    f.take(1 << 20)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    Ok(bytes)
}

impl EtcdConfig {
    /// Defaults (TTL 10 s, prefix `/nip-le`, fall back when unreachable)
    /// for `endpoints` and `host_id` (empty: the id kept in the lock
    /// directory).
    pub fn new(endpoints: Vec<String>, host_id: impl Into<String>) -> Self {
        Self {
            endpoints,
            host_id: host_id.into(),
            ttl: DEFAULT_TTL,
            prefix: DEFAULT_PREFIX.to_owned(),
            when_unreachable: WhenUnreachable::default(),
            tls: None,
            auth: None,
            allow_plain_http_auth: false,
        }
    }

    /// Checks the configuration, and reads its TLS and password files;
    /// the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("etcd: no endpoint".into());
        }
        let scheme = if self.tls.is_some() {
            "https://"
        } else {
            "http://"
        };
        for e in &self.endpoints {
            if !e.starts_with(scheme) || e.len() <= scheme.len() {
                return Err(match (&self.tls, e.starts_with("https://")) {
                    (None, true) => format!(
                        "etcd endpoint {e:?}: https needs the CA of etcd's certificate (EtcdTls, --etcd-ca)"
                    ),
                    (Some(_), _) => format!(
                        "etcd endpoint {e:?}: with TLS configured, every endpoint must be https://host:port"
                    ),
                    (None, false) => format!("etcd endpoint {e:?}: must be http://host:port or https://host:port"),
                });
            }
        }
        if let Some(tls) = &self.tls {
            tls.validate()?;
        }
        if let Some(auth) = &self.auth {
            auth.validate()?;
            let remote =
                (self.endpoints.iter()).find(|e| !e.starts_with("https://") && !loopback(e));
            if let (Some(e), false) = (remote, self.allow_plain_http_auth) {
                return Err(format!(
                    "etcd endpoint {e:?}: user {:?}'s password would travel in clear over plain \
                     http:// to another machine: use TLS (EtcdTls, --etcd-ca), or opt in \
                     (EtcdConfig::allow_plain_http_auth, --etcd-allow-plain-auth)",
                    auth.user
                ));
            }
        }
        if !self.host_id.is_empty() && !crate::host::valid_field(&self.host_id) {
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

/// Whether the endpoint `url` (`scheme://host:port[/…]`) names this
/// machine: `localhost`, or a loopback address.
fn loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_security_is_validated() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let http = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()], "h");
        let https = EtcdConfig::new(vec!["https://127.0.0.1:2379".into()], "h");
        let with_tls = |tls: EtcdTls| EtcdConfig {
            tls: Some(tls),
            ..https.clone()
        };
        let cases = [
            (https.clone(), "needs the CA"),
            (
                EtcdConfig {
                    tls: Some(EtcdTls::new(&junk)),
                    ..http.clone()
                },
                "must be https",
            ),
            (
                with_tls(EtcdTls::new(dir.path().join("gone.pem"))),
                "gone.pem",
            ),
            (with_tls(EtcdTls::new(&junk)), "no PEM certificate"),
            (
                with_tls(EtcdTls {
                    cert: Some(junk.clone()),
                    ..EtcdTls::new(&junk)
                }),
                "junk.pem",
            ),
            (
                EtcdConfig {
                    auth: Some(EtcdAuth::new("u", "")),
                    ..http.clone()
                },
                "empty password",
            ),
            (
                EtcdConfig {
                    auth: Some(EtcdAuth::new("", "p")),
                    ..http.clone()
                },
                "etcd user",
            ),
        ];
        for (bad, why) in cases {
            let e = bad.validate().unwrap_err();
            // A build without etcd-tls refuses any TLS configuration as such.
            let why = if cfg!(feature = "etcd-tls") || bad.tls.is_none() || why == "must be https" {
                why
            } else {
                "lacks its cargo feature etcd-tls"
            };
            assert!(e.contains(why), "{bad:?}: {e} (expected {why:?})");
        }
        EtcdConfig {
            auth: Some(EtcdAuth::new("u", "p")),
            ..http
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn a_password_file_loses_one_newline_and_never_shows() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        for (text, want) in [
            ("s3cret\n", "s3cret"),
            ("s3cret\r\n", "s3cret"),
            ("a b\n\n", "a b\n"),
        ] {
            std::fs::write(&p, text).unwrap();
            owner_only(&p);
            let a = EtcdAuth::from_password_file("u", &p).unwrap();
            assert_eq!(a.password(), want);
            assert!(!format!("{a:?}").contains("s3cret"), "{a:?}");
        }
        let gone = EtcdAuth::from_password_file("u", &dir.path().join("none")).unwrap_err();
        assert!(gone.contains("etcd password file"), "{gone}");
    }

    /// `chmod 600`.
    fn owner_only(p: &Path) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let _ = p;
    }

    /// A password file or private key that group or others may read is
    /// refused, naming its mode; the owner's alone is read.
    #[cfg(unix)]
    #[test]
    fn a_secret_readable_by_group_or_others_is_refused_like_ssh_refuses_a_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, "s3cret\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660, 0o606] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = EtcdAuth::from_password_file("u", &p).unwrap_err();
            assert!(
                e.contains(&format!("permissions {mode:04o} are too open")),
                "{e}"
            );
            assert!(!e.contains("s3cret"), "{e}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(
                EtcdAuth::from_password_file("u", &p).unwrap().password(),
                "s3cret"
            );
        }
        // The private key of a client certificate: the same rule (checked
        // before anything parses it).
        std::fs::write(dir.path().join("k.pem"), "junk").unwrap();
        let key = dir.path().join("k.pem");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_secret(&key, "etcd TLS key").unwrap_err();
        assert!(e.contains("etcd TLS key") && e.contains("too open"), "{e}");
    }

    /// A user's password over plain `http://` to another machine is
    /// refused unless the app opts in; to this machine, or over TLS, it
    /// is not.
    #[test]
    fn a_password_over_plain_http_to_another_machine_needs_an_opt_in() {
        let with = |endpoint: &str| EtcdConfig {
            auth: Some(EtcdAuth::new("u", "p")),
            ..EtcdConfig::new(vec![endpoint.into()], "h")
        };
        for local in [
            "http://127.0.0.1:2379",
            "http://127.8.9.1:2379",
            "http://localhost:2379",
            "http://LOCALHOST:2379/",
            "http://[::1]:2379",
        ] {
            with(local)
                .validate()
                .unwrap_or_else(|e| panic!("{local}: {e}"));
        }
        for remote in [
            "http://10.0.0.1:2379",
            "http://etcd.example:2379",
            "http://[fe80::1]:2379",
            "http://localhost.example:2379",
            "http://127.0.0.1.example:2379",
        ] {
            let e = with(remote).validate().unwrap_err();
            assert!(
                e.contains("in clear") && e.contains("allow_plain_http_auth"),
                "{remote}: {e}"
            );
            assert!(!e.contains("\"p\""), "{e}");
            let opted = EtcdConfig {
                allow_plain_http_auth: true,
                ..with(remote)
            };
            opted
                .validate()
                .unwrap_or_else(|e| panic!("{remote} opted in: {e}"));
        }
        // A loopback endpoint beside a remote one is still refused.
        let mut both = with("http://127.0.0.1:2379");
        both.endpoints.push("http://10.0.0.2:2379".into());
        assert!(both.validate().is_err());
        // Without a user nothing secret travels.
        EtcdConfig::new(vec!["http://10.0.0.1:2379".into()], "h")
            .validate()
            .unwrap();
    }
}
