//! etcd's gRPC API: the few calls the contender needs (range, a
//! transaction, leases, a watch stream) on `tonic`, with the protobuf code
//! generated once and kept in [`proto`] (`scripts/etcd-proto.sh`), so an
//! app's build needs no `protoc`.
//!
//! Why gRPC and not etcd's JSON gateway: the gateway refuses every request
//! that carries a client certificate once etcd's authentication is on, so
//! the recommended setup (TLS with client certificates *and* users with a
//! role on the prefix) cannot work through it.
//!
//! * Every call is bounded by a timeout, the connection and the TLS
//!   handshake included (a stopped etcd accepts TCP and never answers),
//!   and name resolution by the same bound on a thread of its own ([`net`]).
//! * Every call requires a leader (etcd's `WithRequireLeader`: the
//!   metadata `hasleader`), so a member cut from the majority answers at
//!   once "no leader" instead of timing out, and ends a watch some election
//!   timeouts after it lost its leader; the client then moves to the next
//!   endpoint, as after a transport error.
//! * Every failure is sorted into etcd out of reach or etcd's own answer
//!   ([`classify`]): only the first may ever start the fall-back.
//! * With [`EtcdAuth`](crate::global::EtcdAuth) every call carries etcd's
//!   token ([`auth`]), taken again once when etcd refuses it.
//!
//! The calls run on a runtime of one worker thread per client, which also
//! keeps the connection alive between calls (HTTP/2 pings); the callers
//! are the contender's own threads, and block.

mod auth;
mod kv;
mod net;
mod proto;
#[cfg(test)]
mod tests;
mod watch;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use super::etcd::{EtcdError, Result};
use super::EtcdConfig;
use auth::Auth;
pub(crate) use net::Resolve;
use proto::etcdserverpb as pb;

/// The most one answer may hold: a page of work records is far under it,
/// and a hostile peer costs no more.
const MAX_ANSWER: usize = 4 << 20;

/// The most of an error message kept (it goes into every status).
const MAX_ERROR: usize = 512;

/// One endpoint as configured.
#[derive(Debug, Clone)]
struct Target {
    /// `https`?
    tls: bool,
    /// The host as written (a name, an IPv4 address or `[v6]`).
    host: String,
    port: u16,
}

impl Target {
    fn parse(endpoint: &str) -> std::result::Result<Self, String> {
        let uri: tonic::transport::Uri = endpoint
            .parse()
            .map_err(|e| format!("etcd endpoint {endpoint:?}: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(format!(
                    "etcd endpoint {endpoint:?}: not http:// or https://"
                ))
            }
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("etcd endpoint {endpoint:?}: no host"))?;
        let port = uri.port_u16().unwrap_or(2379);
        Ok(Self {
            tls,
            host: host.to_owned(),
            port,
        })
    }

    /// `host:port`, for the resolver.
    fn netloc(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The name a server certificate must carry.
    #[cfg(feature = "etcd-tls")]
    fn server_name(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }
}

/// A runtime of one worker thread, shut down without waiting on drop (a
/// connection attempt in flight never holds an app's exit).
struct Runtime(Option<tokio::runtime::Runtime>);

impl Runtime {
    fn new() -> std::io::Result<Self> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nip-le-etcd-io")
            .enable_all()
            .build()
            .map(|rt| Self(Some(rt)))
    }

    /// Runs `f` to its end, bounded by `bound` (an error when it passes).
    /// From inside another runtime (an async caller of a status function)
    /// it runs on a thread of its own: blocking there would panic.
    fn run<T: Send>(
        &self,
        bound: Duration,
        f: impl Future<Output = std::result::Result<T, Status>> + Send,
    ) -> std::result::Result<T, Status> {
        let Some(rt) = &self.0 else {
            return Err(Status::internal("no runtime"));
        };
        let bounded = async move {
            tokio::time::timeout(bound, f).await.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "no answer within {bound:?}"
                )))
            })
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| rt.block_on(bounded))
                    .join()
                    .unwrap_or_else(|_| Err(Status::internal("etcd call panicked")))
            })
        } else {
            rt.block_on(bounded)
        }
    }

    fn handle(&self) -> Option<&tokio::runtime::Handle> {
        self.0.as_ref().map(tokio::runtime::Runtime::handle)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A client for one list of endpoints; a call or watch that fails at the
/// transport level, or that a member without a leader refuses or ends,
/// moves to the next.
pub(crate) struct Grpc {
    targets: Vec<Target>,
    /// The endpoint in use (modulo their number); watches hold it too.
    current: Arc<AtomicUsize>,
    /// A channel per endpoint, made on first use and dropped after a
    /// transport failure (the next one resolves the name again).
    channels: Mutex<Vec<Option<Channel>>>,
    rt: Arc<Runtime>,
    timeout: Duration,
    resolve: Resolve,
    #[cfg(feature = "etcd-tls")]
    tls: Option<tonic::transport::ClientTlsConfig>,
    auth: Option<Arc<Auth>>,
    /// Why this configuration cannot be used (a TLS file gone since it was
    /// validated, an endpoint that does not parse): every call fails with
    /// it, as etcd's refusal (no outage of etcd).
    broken: Option<String>,
    /// The cluster id of the last answer (see [`super::etcd::Etcd::cluster_id`]).
    cluster: AtomicU64,
}

impl std::fmt::Debug for Grpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grpc")
            .field("targets", &self.targets)
            .field("user", &self.auth.as_ref().map(|a| a.user()))
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// Moves `current` past turn `at`, unless it moved already (several calls
/// failing on one endpoint move it once).
fn leave(current: &AtomicUsize, at: usize) {
    let _ = current.compare_exchange(at, at.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed);
}

/// The whole text of a status: its message and every source below it (a
/// transport error's cause lives there), cut to [`MAX_ERROR`].
fn describe(status: &Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let s = e.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        source = e.source();
    }
    text.chars().take(MAX_ERROR).collect()
}

/// Sorts a failed call: etcd's own answer (its messages start with
/// `etcdserver: `; a TLS alert or certificate etcd sent) is a refusal,
/// except that a member that cannot serve (`Unavailable`: no leader, a
/// request timed out in raft, stopping) is as good as out of reach;
/// everything else (no connection, a handshake or answer that never came,
/// a connection lost, a peer that does not speak etcd's protocol) is etcd
/// out of reach. docs/cross-host.md has the table.
pub(super) fn classify(status: &Status) -> EtcdError {
    let text = describe(status);
    let etcd_said = status.message().contains("etcdserver: ");
    let tls_said = [
        "invalid peer certificate",
        "received fatal alert",
        "certificate",
    ]
    .iter()
    .any(|s| text.contains(s));
    match (etcd_said, status.code()) {
        (true, Code::Unavailable) => EtcdError::unreachable(text),
        (true, _) => EtcdError::refused(text),
        (false, _) if tls_said => EtcdError::refused(format!("TLS: {text}")),
        (false, _) => EtcdError::unreachable(text),
    }
}

/// Whether etcd refused the token (expired, or the auth store changed, or
/// a restart forgot it): take a new one and try once more.
pub(super) fn token_refused(status: &Status) -> bool {
    status.code() == Code::Unauthenticated
        || status.message().contains("invalid auth token")
        || status.message().contains("auth store is old")
}

/// What a call needs: a channel to the endpoint in use and the metadata.
#[derive(Clone)]
pub(super) struct Line {
    channel: Channel,
    token: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl Line {
    /// `msg` as a request with the metadata every call carries.
    pub(super) fn request<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        let md = r.metadata_mut();
        md.insert("hasleader", MetadataValue::from_static("true"));
        if let Some(t) = &self.token {
            md.insert("token", t.clone());
        }
        r
    }

    pub(super) fn kv(&self) -> pb::kv_client::KvClient<Channel> {
        pb::kv_client::KvClient::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER)
    }

    pub(super) fn lease(&self) -> pb::lease_client::LeaseClient<Channel> {
        pb::lease_client::LeaseClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_ANSWER)
    }

    pub(super) fn watch(&self) -> pb::watch_client::WatchClient<Channel> {
        pb::watch_client::WatchClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_ANSWER)
    }
}

impl Grpc {
    /// A client for `cfg`'s endpoints, TLS and credentials, each call
    /// bounded by `timeout`. Never fails: a configuration that cannot be
    /// used (not validated, or a file gone since) fails every call.
    pub(crate) fn new(cfg: &EtcdConfig, timeout: Duration) -> Self {
        Self::with_resolver(cfg, timeout, net::system())
    }

    /// [`Grpc::new`] resolving names with `resolve` (bounded by the
    /// timeout all the same).
    pub(crate) fn with_resolver(cfg: &EtcdConfig, timeout: Duration, resolve: Resolve) -> Self {
        let mut broken = None;
        let mut targets = Vec::new();
        for e in &cfg.endpoints {
            match Target::parse(e.trim_end_matches('/')) {
                Ok(t) => targets.push(t),
                Err(e) => broken = Some(e),
            }
        }
        #[cfg(feature = "etcd-tls")]
        let tls = cfg
            .tls
            .as_ref()
            .and_then(|t| t.client_config().map_err(|e| broken = Some(e)).ok());
        #[cfg(not(feature = "etcd-tls"))]
        if cfg.tls.is_some() {
            broken = Some("etcd TLS: this build of nip-le lacks its cargo feature etcd-tls".into());
        }
        let rt = Runtime::new().unwrap_or_else(|e| {
            broken = Some(format!("etcd client: no runtime: {e}"));
            Runtime(None)
        });
        Self {
            channels: Mutex::new(vec![None; targets.len()]),
            targets,
            current: Arc::default(),
            rt: Arc::new(rt),
            timeout,
            resolve,
            #[cfg(feature = "etcd-tls")]
            tls,
            auth: cfg.auth.clone().map(|a| Arc::new(Auth::new(a))),
            broken,
            cluster: AtomicU64::new(0),
        }
    }

    /// The endpoint's turn and a channel to it, or why there is none.
    fn channel(&self) -> Result<(usize, Channel)> {
        if let Some(e) = &self.broken {
            return Err(EtcdError::refused(e.clone()));
        }
        if self.targets.is_empty() {
            return Err(EtcdError::refused("etcd: no endpoint"));
        }
        let at = self.current.load(Ordering::Relaxed);
        let i = at % self.targets.len();
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = &channels[i] {
            return Ok((at, c.clone()));
        }
        let c = self.connect(&self.targets[i]).inspect_err(|_| {
            leave(&self.current, at);
        })?;
        channels[i] = Some(c.clone());
        Ok((at, c))
    }

    /// A lazily connecting channel to `t`'s address (resolved now, within
    /// the timeout).
    fn connect(&self, t: &Target) -> Result<Channel> {
        let netloc = t.netloc();
        let addr = net::Bounded::new(Arc::clone(&self.resolve), self.timeout)
            .resolve(&netloc)
            .map_err(|e| EtcdError::unreachable(format!("etcd {netloc}: {e}")))?
            .into_iter()
            .next()
            .ok_or_else(|| EtcdError::unreachable(format!("etcd {netloc}: no address")))?;
        let scheme = if t.tls { "https" } else { "http" };
        let ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| EtcdError::refused(format!("etcd {netloc}: {e}")))?
            .connect_timeout(self.timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true);
        #[cfg(feature = "etcd-tls")]
        let ep = match (&self.tls, t.tls) {
            (Some(tls), true) => ep
                .tls_config(tls.clone().domain_name(t.server_name()))
                .map_err(|e| EtcdError::refused(format!("etcd TLS {netloc}: {e}")))?,
            _ => ep,
        };
        let Some(handle) = self.rt.handle() else {
            return Err(EtcdError::refused("etcd client: no runtime"));
        };
        let _in = handle.enter();
        Ok(ep.connect_lazy())
    }

    /// After a transport failure on turn `at`: the next call goes to the
    /// next endpoint, and this one's channel is made again when its turn
    /// comes (its name resolved again).
    fn failed(&self, at: usize) {
        if !self.targets.is_empty() {
            let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
            channels[at % self.targets.len()] = None;
        }
        leave(&self.current, at);
    }

    /// The token to send, taking one when there is none (`None`: no
    /// authentication configured).
    fn token(&self, channel: &Channel) -> Result<Option<MetadataValue<tonic::metadata::Ascii>>> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let token = auth.token(|user, password| {
            let req = pb::AuthenticateRequest {
                name: user.to_owned(),
                password: password.to_owned(),
            };
            let mut client = pb::auth_client::AuthClient::new(channel.clone())
                .max_decoding_message_size(MAX_ANSWER);
            let r = self
                .rt
                .run(self.timeout, async move { client.authenticate(req).await });
            let r =
                r.map_err(|s| classify(&s).context(format!("etcd authentication as {user:?}")))?;
            let t = r.into_inner().token;
            if t.is_empty() || t.len() > 4096 {
                return Err(EtcdError::refused(format!(
                    "etcd authentication as {user:?}: no token in the answer"
                )));
            }
            Ok(t)
        })?;
        token
            .parse()
            .map(Some)
            .map_err(|_| EtcdError::refused("etcd authentication: a token that is not ASCII"))
    }

    /// A [`Line`] to the endpoint in use (its turn with it), a token taken
    /// first when there is none; an endpoint out of reach is left.
    pub(super) fn line(&self) -> Result<(usize, Line)> {
        let (at, channel) = self.channel()?;
        let token = self.token(&channel).inspect_err(|e| {
            if e.kind == super::etcd::ErrorKind::Unreachable {
                self.failed(at);
            }
        })?;
        Ok((at, Line { channel, token }))
    }

    /// Forgets the token `line` carried: etcd refused it.
    pub(super) fn forget_token(&self, line: &Line) {
        if let (Some(auth), Some(t)) = (&self.auth, &line.token) {
            auth.forget(t.to_str().unwrap_or_default());
        }
    }

    /// One call: `f` with a [`Line`] to the endpoint in use, bounded by the
    /// timeout; a refused token is taken again once; a transport failure
    /// moves to the next endpoint.
    pub(super) fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send,
        F: Fn(Line) -> Fut,
        Fut: Future<Output = std::result::Result<(T, Option<pb::ResponseHeader>), Status>> + Send,
    {
        let mut retried = false;
        loop {
            let (at, line) = self.line()?;
            match self.rt.run(self.timeout, f(line.clone())) {
                Ok((v, header)) => {
                    if let Some(h) = header.filter(|h| h.cluster_id != 0) {
                        self.cluster.store(h.cluster_id, Ordering::Relaxed);
                    }
                    return Ok(v);
                }
                Err(s) if token_refused(&s) && !retried => {
                    self.forget_token(&line);
                    retried = true;
                }
                Err(s) => {
                    let e = classify(&s).context(self.name(at));
                    if e.kind == super::etcd::ErrorKind::Unreachable {
                        self.failed(at);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// The endpoint of turn `at`, as errors name it.
    pub(super) fn name(&self, at: usize) -> String {
        match self.targets.get(at % self.targets.len().max(1)) {
            Some(t) => format!("etcd {}", t.netloc()),
            None => "etcd".into(),
        }
    }
}
