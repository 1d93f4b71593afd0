//! A real etcd for the lab and the tests: one member on loopback, free
//! ports, a temporary data directory, stopped when dropped. The binary is
//! `$NIP_LE_ETCD`, else `etcd` on the PATH, else `/usr/bin/etcd` (Debian's
//! `etcd-server`, which `scripts/test.sh` installs). [`Etcd::start_tls`]
//! serves its clients over TLS (the certificates are the caller's).
//! [`Cluster`] is several members, with a peer network the lab can
//! partition.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nip_le::global::{EtcdConfig, EtcdTls};
use nip_le::AgentPubkey;

use super::etcd_secure::Secure;
use super::peer_net::{find, lock, PeerNet};
use super::ports::{free_port, free_ports};

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

/// How many times etcd is started on fresh ports when it exits at once
/// (a port taken between our pick and its bind: parallel tests pick too).
const STARTS: usize = 3;

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
        Self::start_on(free_ports()?, tls)
    }

    /// Starts etcd on `ports` (client, peer) first, on fresh ones if it
    /// exits at once (a port taken: `tests/etcd_start.rs`).
    pub fn start_on(ports: [u16; 2], tls: Option<ServerTls>) -> std::io::Result<Self> {
        let exe = find_etcd().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no etcd binary (install Debian's etcd-server, or set NIP_LE_ETCD)",
            )
        })?;
        let [client_port, peer_port] = ports;
        let mut e = Self {
            exe,
            data: tempfile::tempdir()?,
            client_port,
            peer_port,
            tls,
            child: None,
        };
        let mut starts = 1;
        loop {
            match e.spawn() {
                Err(err) if err.kind() == std::io::ErrorKind::AddrInUse && starts < STARTS => {
                    [e.client_port, e.peer_port] = free_ports()?;
                    e.data = tempfile::tempdir()?;
                    starts += 1;
                }
                r => return r.map(|()| e),
            }
        }
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
            .stderr(etcd_log())
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
            // Exited before answering: most likely a port taken since we
            // picked it (it binds both at once, and exits if it cannot).
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("etcd exited before answering ({status}): {last}"),
                ));
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

/// A real etcd cluster of several members on loopback, each with its own
/// client port, peer port and data directory, stopped when dropped. Every
/// member's peer traffic goes through a small TCP proxy of the lab
/// (`PeerNet`), so that [`Cluster::partition`] can cut one member from
/// the others (both ways, existing connections included) while clients
/// still reach it. Members are numbered from 0. A secure cluster
/// ([`Cluster::start_secure`]) serves the windows over TLS with client
/// certificates and users; the lab's own calls go to a plain port.
pub struct Cluster {
    _data: tempfile::TempDir,
    members: Vec<Member>,
    net: Arc<PeerNet>,
    proxies: Vec<JoinHandle<()>>,
    secure: Option<Secure>,
}

struct Member {
    /// The plain port: the lab's.
    client_port: u16,
    /// The TLS port given to windows (a secure cluster).
    secure_port: Option<u16>,
    child: Child,
    /// How to start it again (same name, data, ports and cluster).
    command: Vec<std::ffi::OsString>,
}

/// How long [`Cluster`] waits for the members to answer, and for a
/// partition or its healing to show in what the members say.
const CLUSTER_WAIT: Duration = Duration::from_secs(40);

impl Cluster {
    /// Starts `n` members and waits (up to 20 s) until each answers.
    pub fn start(n: usize) -> std::io::Result<Self> {
        Self::start_with(n, None)
    }

    /// [`Cluster::start`] as production runs etcd: TLS with client
    /// certificates on the windows' port, and users (see
    /// [`super::etcd_secure`]); authentication is on once it returns.
    pub fn start_secure(n: usize, secure: Secure) -> std::io::Result<Self> {
        Self::start_with(n, Some(secure))
    }

    fn start_with(n: usize, secure: Option<Secure>) -> std::io::Result<Self> {
        let exe = find_etcd()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no etcd binary"))?;
        let data = tempfile::tempdir()?;
        let net = Arc::new(PeerNet::default());
        // The proxies listen on the advertised peer URLs; the members on
        // their real peer ports behind them.
        let mut listeners = Vec::new();
        let mut real = Vec::new();
        for _ in 0..n {
            listeners.push(TcpListener::bind("127.0.0.1:0")?);
            real.push(free_port()?);
        }
        let advertised: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<std::io::Result<_>>()?;
        let initial = (0..n)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", advertised[i]))
            .collect::<Vec<_>>()
            .join(",");
        {
            let mut st = lock(&net.state);
            st.isolated = vec![false; n];
            for l in &listeners {
                st.listening.push(l.local_addr()?);
            }
        }
        let token = format!("nip-le-lab-{}", uuid::Uuid::new_v4());
        let mut proxies = Vec::new();
        for (i, l) in listeners.into_iter().enumerate() {
            let (net, to) = (Arc::clone(&net), real[i]);
            proxies.push(std::thread::spawn(move || net.serve(l, i, to)));
        }
        let mut c = Self {
            _data: data,
            members: Vec::new(),
            net,
            proxies,
            secure: None,
        };
        for i in 0..n {
            let client = format!("http://127.0.0.1:{}", free_port()?);
            let secure_port = secure.as_ref().map(|_| free_port()).transpose()?;
            let (listen, advertise) = match secure_port {
                Some(p) => (
                    format!("https://127.0.0.1:{p},{client}"),
                    format!("https://127.0.0.1:{p}"),
                ),
                None => (client.clone(), client.clone()),
            };
            let data = c._data.path().join(format!("m{i}"));
            let mut command: Vec<std::ffi::OsString> = [
                exe.as_os_str(),
                "--name".as_ref(),
                format!("m{i}").as_ref(),
                "--data-dir".as_ref(),
                data.as_os_str(),
                "--listen-client-urls".as_ref(),
                listen.as_ref(),
                "--advertise-client-urls".as_ref(),
                advertise.as_ref(),
                "--listen-peer-urls".as_ref(),
                format!("http://127.0.0.1:{}", real[i]).as_ref(),
                "--initial-advertise-peer-urls".as_ref(),
                format!("http://127.0.0.1:{}", advertised[i]).as_ref(),
                "--initial-cluster".as_ref(),
                initial.as_ref(),
                "--initial-cluster-token".as_ref(),
                token.as_ref(),
                "--initial-cluster-state".as_ref(),
                "new".as_ref(),
            ]
            .iter()
            .map(|s| s.to_os_string())
            .collect();
            if let Some(s) = &secure {
                command.extend(s.member_args());
            }
            let child = spawn_member(&command)?;
            let port = client.rsplit(':').next().and_then(|p| p.parse().ok());
            c.members.push(Member {
                client_port: port.expect("a port"),
                secure_port,
                child,
                command,
            });
        }
        let deadline = Instant::now() + CLUSTER_WAIT;
        let mut ids = Vec::new();
        for i in 0..n {
            let id = loop {
                // A linearizable read: the member answers once the cluster
                // has a leader; then it says its id.
                let probe = c.config(&[i], "probe");
                let read = nip_le::global::read_holder(
                    &probe,
                    &AgentPubkey::parse(&"0".repeat(64)).expect("a key"),
                );
                let status = c.status(i);
                match (read, status) {
                    (Ok(_), Ok(s)) => break num(&s["header"]["member_id"]),
                    (r, s) if Instant::now() > deadline => {
                        return Err(std::io::Error::other(format!(
                            "etcd member {i} did not answer within {CLUSTER_WAIT:?}: {r:?} {s:?}"
                        )))
                    }
                    _ => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            ids.push(id);
        }
        lock(&c.net.state).ids = ids;
        if let Some(s) = secure {
            let port = c.members[0].client_port;
            s.enable_users(|path, body| post_json(port, path, body))?;
            c.secure = Some(s);
        }
        Ok(c)
    }

    /// Member `i`'s client URL, as windows are given it (TLS on a secure
    /// cluster).
    pub fn url(&self, i: usize) -> String {
        match self.members[i].secure_port {
            Some(p) => format!("https://127.0.0.1:{p}"),
            None => self.lab_url(i),
        }
    }

    /// Member `i`'s plain URL: the lab's own.
    fn lab_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// What a window needs besides the URLs (a secure cluster: the CA, its
    /// certificate, the user).
    pub fn window_args(&self) -> Vec<String> {
        self.secure
            .as_ref()
            .map_or_else(Vec::new, Secure::window_args)
    }

    /// The client URLs of the members `order` names, in that order.
    pub fn urls(&self, order: &[usize]) -> Vec<String> {
        order.iter().map(|&i| self.url(i)).collect()
    }

    /// A configuration for the lab's probes as `host_id` on the members
    /// `order` names, in that order (on a secure cluster: their plain
    /// ports, as etcd's root).
    pub fn config(&self, order: &[usize], host_id: &str) -> EtcdConfig {
        let urls = order.iter().map(|&i| self.lab_url(i)).collect();
        EtcdConfig {
            auth: self.secure.as_ref().map(|_| Secure::root()),
            ..EtcdConfig::new(urls, host_id)
        }
    }

    /// Member `i`'s answer to etcd's status call.
    fn status(&self, i: usize) -> std::io::Result<serde_json::Value> {
        post_json(self.members[i].client_port, "/v3/maintenance/status", "{}")
    }

    /// The leader member `i` follows (etcd's member id), if any.
    pub fn leader_seen_by(&self, i: usize) -> Option<u64> {
        let s = self.status(i).ok()?;
        Some(num(&s["leader"])).filter(|&l| l != 0)
    }

    /// Cuts member `i` from the others (both ways, established peer
    /// connections too; clients still reach it), and waits until it says
    /// it has no leader and the others agree on one.
    pub fn partition(&self, i: usize) -> std::io::Result<()> {
        self.net.set(i, true);
        let ids = lock(&self.net.state).ids.clone();
        self.wait_for("partition", |c| {
            let others: Vec<Option<u64>> = (0..ids.len())
                .filter(|&j| j != i)
                .map(|j| c.leader_seen_by(j))
                .collect();
            c.leader_seen_by(i).is_none()
                && others[0].is_some_and(|l| l != ids[i])
                && others.iter().all(|o| *o == others[0])
        })
    }

    /// Joins member `i` to the others again, and waits until every member
    /// follows the same leader.
    pub fn heal(&self, i: usize) -> std::io::Result<()> {
        self.net.set(i, false);
        self.wait_for("healing", |c| {
            let seen: Vec<Option<u64>> =
                (0..c.members.len()).map(|j| c.leader_seen_by(j)).collect();
            seen[0].is_some() && seen.iter().all(|s| *s == seen[0])
        })
    }

    /// Whether a majority of the members follow one leader that a member
    /// outside the minority cut from the others sees too: the cluster can
    /// serve writes. Each member is asked for its status (bounded).
    pub fn serves(&self) -> bool {
        let isolated = lock(&self.net.state).isolated.clone();
        let seen: Vec<Option<u64>> = (0..self.members.len())
            .map(|i| (!isolated[i]).then(|| self.leader_seen_by(i)).flatten())
            .collect();
        let majority = self.members.len() / 2 + 1;
        seen.iter()
            .flatten()
            .any(|l| seen.iter().filter(|s| **s == Some(*l)).count() >= majority)
    }

    /// Cuts member `i` from the others (`true`) or joins it again, without
    /// waiting for the members to notice.
    pub fn set_cut(&self, i: usize, cut: bool) {
        self.net.set(i, cut);
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no member (never: [`Cluster::start`] makes
    /// at least one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Sends `sig` to member `i` (SIGSTOP/SIGCONT for a pause).
    #[cfg(unix)]
    pub fn signal(&self, i: usize, sig: i32) -> std::io::Result<()> {
        let pid = self.members[i].child.id();
        // SAFETY: kill has no memory effects.
        if unsafe { libc::kill(pid as i32, sig) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Kills member `i` (SIGKILL) and starts it again on its data and
    /// ports; it rejoins the others.
    pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
        let m = &mut self.members[i];
        let _ = m.child.kill();
        let _ = m.child.wait();
        m.child = spawn_member(&m.command)?;
        Ok(())
    }

    fn wait_for(&self, what: &str, f: impl Fn(&Self) -> bool) -> std::io::Result<()> {
        let deadline = Instant::now() + CLUSTER_WAIT;
        while !f(self) {
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "etcd cluster: no {what} within {CLUSTER_WAIT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
        self.net.stop();
        for p in self.proxies.drain(..) {
            let _ = p.join();
        }
    }
}

/// Starts a member from its command line (program first).
fn spawn_member(command: &[std::ffi::OsString]) -> std::io::Result<Child> {
    Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(etcd_log())
        .spawn()
}

/// Where etcd's log goes: NIP_LE_ETCD_LOG=1 shows it (to debug a launch).
fn etcd_log() -> Stdio {
    if std::env::var_os("NIP_LE_ETCD_LOG").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    }
}

fn num(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        v => v.as_u64().unwrap_or(0),
    }
}

/// One POST of JSON to etcd's gateway on `port`, bounded (2 s).
fn post_json(port: u16, path: &str, body: &str) -> std::io::Result<serde_json::Value> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = Vec::new();
    s.take(1 << 20).read_to_end(&mut answer)?;
    let start = find(&answer, b"\r\n\r\n").map_or(answer.len(), |p| p + 4);
    serde_json::from_slice(&answer[start..]).map_err(std::io::Error::other)
}
