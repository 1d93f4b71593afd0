//! A real etcd for the lab and the tests: one member on loopback, free
//! ports, a temporary data directory, stopped when dropped. The binary is
//! `$NIP_LE_ETCD`, else `etcd` on the PATH, else `/usr/bin/etcd` (Debian's
//! `etcd-server`, which `scripts/test.sh` installs). [`Etcd::start_tls`]
//! serves its clients over TLS (the certificates are the caller's).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nip_le::global::{EtcdConfig, EtcdTls};
use nip_le::AgentPubkey;

/// A running etcd.
pub struct Etcd {
    exe: PathBuf,
    data: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    tls: Option<ServerTls>,
    child: Option<Child>,
}

/// TLS on etcd's client port (PEM files).
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// etcd's server certificate (valid for 127.0.0.1), `--cert-file`.
    pub cert: PathBuf,
    /// Its private key, `--key-file`.
    pub key: PathBuf,
    /// The CA that client certificates must chain to, `--trusted-ca-file`.
    pub trusted_ca: PathBuf,
    /// Whether etcd requires a client certificate (`--client-cert-auth`).
    pub client_cert_auth: bool,
    /// How the launcher connects to see etcd answer, and the TLS of
    /// [`Etcd::config`]: the CA of `cert`, and a client certificate when
    /// `client_cert_auth`.
    pub client: EtcdTls,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Where the etcd binary is, if anywhere.
pub fn find_etcd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NIP_LE_ETCD").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let p = PathBuf::from("/usr/bin/etcd");
        p.is_file().then_some(p)
    })
}

impl Etcd {
    /// Starts etcd and waits (up to 20 s) until it answers.
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(None)
    }

    /// Starts etcd serving its clients over TLS, and waits (up to 20 s)
    /// until it answers.
    pub fn start_tls(tls: ServerTls) -> std::io::Result<Self> {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<ServerTls>) -> std::io::Result<Self> {
        let exe = find_etcd().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no etcd binary (install Debian's etcd-server, or set NIP_LE_ETCD)",
            )
        })?;
        let mut e = Self {
            exe,
            data: tempfile::tempdir()?,
            client_port: free_port()?,
            peer_port: free_port()?,
            tls,
            child: None,
        };
        e.spawn()?;
        Ok(e)
    }

    /// The client URL (`https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// A contender configuration for `host_id` on this etcd (with the
    /// launcher's client TLS, if any).
    pub fn config(&self, host_id: &str) -> EtcdConfig {
        EtcdConfig {
            tls: self.tls.as_ref().map(|t| t.client.clone()),
            ..EtcdConfig::new(vec![self.url()], host_id)
        }
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(&self.exe);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.cert)
                .arg("--key-file")
                .arg(&t.key)
                .arg("--trusted-ca-file")
                .arg(&t.trusted_ca);
            if t.client_cert_auth {
                cmd.arg("--client-cert-auth");
            }
        }
        let child = cmd
            .arg("--data-dir")
            .arg(self.data.path().join("member"))
            .args(["--listen-client-urls", &self.url()])
            .args(["--advertise-client-urls", &self.url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // NIP_LE_ETCD_LOG=1 shows etcd's log (to debug a launch).
            .stderr(if std::env::var_os("NIP_LE_ETCD_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()?;
        self.child = Some(child);
        let probe = self.config("probe");
        let pk = AgentPubkey::parse(&"0".repeat(64)).expect("a valid key");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = String::new();
        while Instant::now() < deadline {
            match nip_le::global::read_holder(&probe, &pk) {
                Ok(_) => return Ok(()),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(std::io::Error::other(format!(
            "etcd did not answer within 20 s: {last}"
        )))
    }

    /// The etcd process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `sig` to etcd (SIGSTOP/SIGCONT for a pause).
    #[cfg(unix)]
    pub fn signal(&self, sig: i32) -> std::io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| std::io::Error::other("etcd is not running"))?;
        // SAFETY: kill has no memory effects.
        if unsafe { libc::kill(pid as i32, sig) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Kills etcd (SIGKILL) and starts it again on the same data and ports.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        self.spawn()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        #[cfg(unix)]
        let _ = self.signal(libc::SIGCONT);
        self.stop();
    }
}
