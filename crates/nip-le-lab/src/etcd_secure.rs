//! etcd as production runs it, for the lab: TLS on the client port with
//! client certificates required (`--client-cert-auth`), and etcd users,
//! the windows' user with a role on the key prefix only (the setup
//! docs/cross-host.md recommends). A certificate authority made here
//! (rcgen) signs the members' and the windows' certificates.
//!
//! The members also listen on a plain loopback port that only the lab uses
//! (status, the users' setup, probes as root): it is never given to a
//! window.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use nip_le::global::{EtcdAuth, EtcdTls};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The windows' etcd user, and its role's prefix.
const USER: (&str, &str) = ("nip", "nip-lab-secret");
/// etcd's root user: the lab's probes.
const ROOT: (&str, &str) = ("root", "nip-lab-root");
const PREFIX: &str = "/nip-le/";

/// The files of a secure etcd: its CA, the members' certificate, the
/// windows' client certificate and the user's password file.
#[derive(Debug, Clone)]
pub struct Secure {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    password_file: PathBuf,
}

impl Secure {
    /// A new authority and its certificates, written into `dir`.
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        let key = KeyPair::generate().map_err(other)?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(other)?;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, "nip-le lab CA");
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).map_err(other)?;
        let ca = dir.join("lab-ca.pem");
        std::fs::write(&ca, cert.pem())?;
        let issuer = Issuer::new(p, key);
        // etcd's own gateway uses the server certificate as a client one.
        let server = issue(
            dir,
            &issuer,
            "member",
            &["127.0.0.1", "localhost"],
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        let client = issue(
            dir,
            &issuer,
            "window",
            &["nip-le-window"],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let password_file = dir.join("etcd-password");
        write_secret(&password_file, USER.1.as_bytes())?;
        Ok(Self {
            ca,
            server,
            client,
            password_file,
        })
    }

    /// A member's TLS flags.
    pub fn member_args(&self) -> Vec<OsString> {
        [
            ("--cert-file", &self.server.0),
            ("--key-file", &self.server.1),
            ("--trusted-ca-file", &self.ca),
        ]
        .into_iter()
        .flat_map(|(f, p)| [OsString::from(f), p.as_os_str().to_owned()])
        .chain([OsString::from("--client-cert-auth")])
        .collect()
    }

    /// A window's flags: the CA, its client certificate, the user.
    pub fn window_args(&self) -> Vec<String> {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            "--etcd-ca".into(),
            s(&self.ca),
            "--etcd-cert".into(),
            s(&self.client.0),
            "--etcd-key".into(),
            s(&self.client.1),
            "--etcd-user".into(),
            USER.0.into(),
            "--etcd-password-file".into(),
            s(&self.password_file),
        ]
    }

    /// The windows' TLS (for a check over the secure port).
    pub fn tls(&self) -> EtcdTls {
        EtcdTls::new(&self.ca).with_client_cert(&self.client.0, &self.client.1)
    }

    /// The lab's probes: etcd's root.
    pub fn root() -> EtcdAuth {
        EtcdAuth::new(ROOT.0, ROOT.1)
    }

    /// Adds root and the windows' user (its role: read-write on the
    /// prefix only) through `post` (the plain port's JSON API), then turns
    /// authentication on.
    pub fn enable_users(
        &self,
        post: impl Fn(&str, &str) -> std::io::Result<serde_json::Value>,
    ) -> std::io::Result<()> {
        let ok = |path: &str, body: serde_json::Value| -> std::io::Result<()> {
            let r = post(path, &body.to_string())?;
            match r.get("error") {
                Some(e) => Err(std::io::Error::other(format!("{path}: {e}"))),
                None => Ok(()),
            }
        };
        let end = format!("{}0", PREFIX.trim_end_matches('/'));
        for (user, password, role) in [(ROOT.0, ROOT.1, "root"), (USER.0, USER.1, "nip-rw")] {
            ok(
                "/v3/auth/user/add",
                serde_json::json!({ "name": user, "password": password }),
            )?;
            ok("/v3/auth/role/add", serde_json::json!({ "name": role }))?;
            if role != "root" {
                let perm = serde_json::json!({
                    "permType": "READWRITE",
                    "key": B64.encode(PREFIX),
                    "range_end": B64.encode(&end),
                });
                ok(
                    "/v3/auth/role/grant",
                    serde_json::json!({ "name": role, "perm": perm }),
                )?;
            }
            ok(
                "/v3/auth/user/grant",
                serde_json::json!({ "user": user, "role": role }),
            )?;
        }
        ok("/v3/auth/enable", serde_json::json!({}))
    }
}

/// A certificate for `names` signed by `issuer`: (cert.pem, key.pem).
fn issue(
    dir: &Path,
    issuer: &Issuer<'static, KeyPair>,
    file: &str,
    names: &[&str],
    usage: &[ExtendedKeyUsagePurpose],
) -> std::io::Result<(PathBuf, PathBuf)> {
    let key = KeyPair::generate().map_err(other)?;
    let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    let mut p = CertificateParams::new(names.clone()).map_err(other)?;
    p.distinguished_name
        .push(DnType::CommonName, names[0].clone());
    p.extended_key_usages = usage.to_vec();
    let cert = p.signed_by(&key, issuer).map_err(other)?;
    let (c, k) = (
        dir.join(format!("{file}.pem")),
        dir.join(format!("{file}-key.pem")),
    );
    std::fs::write(&c, cert.pem())?;
    write_secret(&k, key.serialize_pem().as_bytes())?;
    Ok((c, k))
}

/// Writes a password or private key readable by its owner alone, as the
/// engine requires of the files it reads them from (ssh's rule).
pub fn write_secret(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)?.write_all(bytes)
}

fn other(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}
