//! etcd's v3 JSON gateway over HTTP or HTTPS: the few calls the contender
//! needs (range, a transaction, leases, a watch stream), with every request
//! bounded by a timeout (name resolution included, see [`net`]) so that an
//! unreachable etcd never holds the contender past a fencing deadline, and
//! every answer bounded in size (see [`wire`]). Keys and values travel
//! base64-encoded and numbers as strings, as the gateway's JSON mapping of
//! the protobufs says. With [`EtcdTls`](crate::global::EtcdTls) calls and
//! watches speak TLS with the configured CA and client certificate; with
//! [`EtcdAuth`](crate::global::EtcdAuth) they carry etcd's token ([`auth`]).
//!
//! Every request requires a leader (etcd's `WithRequireLeader`: the
//! metadata `hasleader`), so a member cut from the majority answers at once
//! "no leader" (503) instead of timing out, and ends a watch some election
//! timeouts after it lost its leader instead of keeping it open, silent;
//! the client then moves to the next endpoint, as after a transport error.

mod auth;
mod net;
#[cfg(test)]
mod tests;
mod wire;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use super::etcd::{Etcd, GatewayError, Kv, Result, Txn, Watch};
use super::EtcdConfig;
use auth::Auth;
pub(crate) use net::Resolve;
use wire::{b64, num, parse_kv, prefix_end, signed, WatchStream};

/// A client for one list of endpoints; a call or watch that fails at the
/// transport level, or that a member without a leader refuses or ends,
/// moves to the next.
pub(crate) struct Gateway {
    endpoints: Vec<String>,
    /// The endpoint in use (modulo their number); watches hold it too.
    current: Arc<AtomicUsize>,
    agent: ureq::Agent,
    /// Name resolution, for the watch's agents too.
    resolve: Resolve,
    #[cfg(feature = "etcd-tls")]
    tls: Option<Arc<ureq::rustls::ClientConfig>>,
    auth: Option<Arc<Auth>>,
    /// Why this configuration cannot be used (a TLS file gone since it was
    /// validated): every call fails with it.
    broken: Option<String>,
    /// The cluster id of the last answer (see [`Etcd::cluster_id`]).
    cluster: AtomicU64,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("endpoints", &self.endpoints)
            .field("user", &self.auth.as_ref().map(|a| a.user()))
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// Keys per page of a range read: a page of work records stays far under
/// the answer cap.
const RANGE_PAGE: usize = 500;

/// The gRPC metadata of etcd's `clientv3.WithRequireLeader`, as the
/// gateway takes it: a member that has no leader refuses the request, and
/// ends a watch when it loses its leader.
const REQUIRE_LEADER: (&str, &str) = ("Grpc-Metadata-hasleader", "true");

/// Whether an HTTP status says this member cannot serve now (gRPC's
/// Unavailable: "etcdserver: no leader", a request timed out in raft),
/// so another member should be tried.
fn unavailable(code: u16) -> bool {
    code == 503
}

/// Moves `current` past turn `at`, unless it moved already (several calls
/// failing on one endpoint move it once).
fn leave(current: &AtomicUsize, at: usize) {
    let _ = current.compare_exchange(at, at.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed);
}

/// Why one request failed.
enum Failure {
    /// etcd refused the token: take a new one and try once more.
    Token(GatewayError),
    Other(GatewayError),
}

impl From<Failure> for GatewayError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Token(e) | Failure::Other(e) => e,
        }
    }
}

impl Gateway {
    /// A client for `cfg`'s endpoints, TLS and credentials, each call
    /// bounded by `timeout`. Never fails: a configuration that cannot be
    /// used (not validated, or a file gone since) fails every call.
    pub(crate) fn new(cfg: &EtcdConfig, timeout: Duration) -> Self {
        Self::with_resolver(cfg, timeout, net::system())
    }

    /// [`Gateway::new`] resolving names with `resolve` (bounded by the
    /// timeout all the same).
    pub(crate) fn with_resolver(cfg: &EtcdConfig, timeout: Duration, resolve: Resolve) -> Self {
        let mut broken = None;
        #[cfg(feature = "etcd-tls")]
        let tls = cfg
            .tls
            .as_ref()
            .and_then(|t| t.client_config().map_err(|e| broken = Some(e)).ok());
        #[cfg(not(feature = "etcd-tls"))]
        if cfg.tls.is_some() {
            broken = Some("etcd TLS: this build of nip-le lacks its cargo feature etcd-tls".into());
        }
        let mut gw = Self {
            endpoints: cfg
                .endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_owned())
                .collect(),
            current: Arc::default(),
            agent: ureq::Agent::new(),
            resolve,
            #[cfg(feature = "etcd-tls")]
            tls,
            auth: cfg.auth.clone().map(|a| Arc::new(Auth::new(a))),
            broken,
            cluster: AtomicU64::new(0),
        };
        gw.agent = gw
            .builder(timeout)
            .timeout(timeout)
            .max_idle_connections_per_host(4)
            .build();
        gw
    }

    /// An agent builder with this gateway's TLS and a resolver bounded by
    /// `bound`.
    fn builder(&self, bound: Duration) -> ureq::AgentBuilder {
        let b = ureq::AgentBuilder::new()
            .resolver(net::Bounded::new(Arc::clone(&self.resolve), bound))
            // etcd never redirects; a redirect would carry the token away.
            .redirects(0);
        #[cfg(feature = "etcd-tls")]
        let b = match &self.tls {
            Some(c) => b.tls_config(Arc::clone(c)),
            None => b,
        };
        b
    }

    /// The endpoint to use (and its turn, for [`Gateway::next_endpoint`]),
    /// or why there is none.
    fn endpoint(&self) -> Result<(usize, &str)> {
        if let Some(e) = &self.broken {
            return Err(GatewayError(e.clone()));
        }
        if self.endpoints.is_empty() {
            return Err(GatewayError("etcd: no endpoint".into()));
        }
        let i = self.current.load(Ordering::Relaxed);
        Ok((i, &self.endpoints[i % self.endpoints.len()]))
    }

    /// Moves past the endpoint of turn `at`, unless another failure did.
    fn next_endpoint(&self, at: usize) {
        leave(&self.current, at);
    }

    /// The token to send, taking one when there is none (`None`: no
    /// authentication configured).
    fn token(&self) -> Result<Option<String>> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        auth.token(|user, password| {
            let v = self
                .post(
                    "/v3/auth/authenticate",
                    &json!({ "name": user, "password": password }),
                    None,
                )
                .map_err(|f| {
                    let e = GatewayError::from(f);
                    GatewayError(format!("etcd authentication as {user:?}: {e}"))
                })?;
            match v["token"].as_str() {
                Some(t) if !t.is_empty() && t.len() <= 4096 => Ok(t.to_owned()),
                _ => Err(GatewayError(format!(
                    "etcd authentication as {user:?}: no token in the answer"
                ))),
            }
        })
        .map(Some)
    }

    /// POSTs `body` to `path` (with the token, if any) and parses the
    /// answer; a refused token is taken again once.
    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let token = self.token()?;
        let v = match self.post(path, body, token.as_deref()) {
            Err(Failure::Token(e)) => {
                let (Some(auth), Some(old)) = (&self.auth, &token) else {
                    return Err(e);
                };
                auth.forget(old);
                let token = self.token()?;
                self.post(path, body, token.as_deref())?
            }
            r => r?,
        };
        let cluster = num(&v["header"]["cluster_id"]);
        if cluster != 0 {
            self.cluster.store(cluster, Ordering::Relaxed);
        }
        Ok(v)
    }

    /// One request.
    fn post(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> std::result::Result<Value, Failure> {
        let (at, endpoint) = self.endpoint().map_err(Failure::Other)?;
        let url = format!("{endpoint}{path}");
        let mut req = self
            .agent
            .post(&url)
            .set("content-type", "application/json")
            .set(REQUIRE_LEADER.0, REQUIRE_LEADER.1);
        if let Some(t) = token {
            req = req.set("authorization", t);
        }
        let body = match req.send_string(&body.to_string()) {
            Ok(r) => wire::read_body(r.into_reader()),
            Err(ureq::Error::Status(code, r)) => {
                let text = wire::error_excerpt(r.into_reader());
                if unavailable(code) {
                    self.next_endpoint(at);
                }
                let e = GatewayError(format!("{url}: HTTP {code}: {text}"));
                return Err(if token.is_some() && auth::token_refused(code, &text) {
                    Failure::Token(e)
                } else {
                    Failure::Other(e)
                });
            }
            Err(e) => {
                // ureq's transport error names the URL already.
                self.next_endpoint(at);
                return Err(Failure::Other(GatewayError(e.to_string())));
            }
        };
        let body = body.map_err(|e| Failure::Other(GatewayError(format!("{url}: {e}"))))?;
        serde_json::from_slice(&body).map_err(|e| {
            let start = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            Failure::Other(GatewayError(format!("{url}: {e}: {start}")))
        })
    }

    fn txn(
        &self,
        key: &str,
        compare: Value,
        value: &[u8],
        lease: i64,
        also_delete: Option<(&str, u64)>,
        read_back: &str,
    ) -> Result<Txn> {
        let mut success = vec![json!({ "request_put": {
            "key": b64(key), "value": B64.encode(value), "lease": lease.to_string()
        }})];
        let mut compare = compare;
        if let Some((k, rev)) = also_delete {
            success.push(json!({ "request_delete_range": { "key": b64(k) } }));
            if let Some(c) = compare.as_array_mut() {
                c.push(json!({ "target": "MOD", "key": b64(k), "mod_revision": rev.to_string() }));
            }
        }
        let body = json!({
            "compare": compare,
            "success": success,
            "failure": [{ "request_range": { "key": b64(read_back) } }],
        });
        let v = self.call("/v3/kv/txn", &body)?;
        if v["succeeded"].as_bool() == Some(true) {
            return Ok(Txn::Done(num(&v["header"]["revision"])));
        }
        let kv = v["responses"][0]["response_range"]["kvs"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(parse_kv);
        Ok(Txn::Failed(kv))
    }
}

impl Etcd for Gateway {
    fn cluster_id(&self) -> u64 {
        self.cluster.load(Ordering::Relaxed)
    }

    /// The key's current value and the store's revision.
    fn get_at(&self, key: &str) -> Result<(Option<Kv>, u64)> {
        let v = self.call("/v3/kv/range", &json!({ "key": b64(key) }))?;
        let kv = v["kvs"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(parse_kv);
        Ok((kv, num(&v["header"]["revision"])))
    }

    /// Creates `key` bound to `lease` only if it does not exist.
    fn create(&self, key: &str, value: &[u8], lease: i64) -> Result<Txn> {
        let compare = json!([{ "target": "CREATE", "key": b64(key), "create_revision": "0" }]);
        self.txn(key, compare, value, lease, None, key)
    }

    /// Rewrites `key` (bound to `lease`) only if it was last written at
    /// `mod_revision`; deletes `also_delete` in the same transaction, only
    /// if it too was last written at the revision given.
    fn swap(
        &self,
        key: &str,
        mod_revision: u64,
        value: &[u8],
        lease: i64,
        also_delete: Option<(&str, u64)>,
    ) -> Result<Txn> {
        let compare = json!([{
            "target": "MOD", "key": b64(key), "mod_revision": mod_revision.to_string()
        }]);
        self.txn(key, compare, value, lease, also_delete, key)
    }

    /// Puts `key` unconditionally, bound to `lease`.
    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<()> {
        let body =
            json!({ "key": b64(key), "value": B64.encode(value), "lease": lease.to_string() });
        self.call("/v3/kv/put", &body).map(drop)
    }

    /// Creates `key` (bound to `lease`) only if it does not exist and
    /// `guard` was last written at `guard_revision`.
    fn create_if(
        &self,
        guard: &str,
        guard_revision: u64,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Txn> {
        let compare = json!([
            { "target": "MOD", "key": b64(guard), "mod_revision": guard_revision.to_string() },
            { "target": "CREATE", "key": b64(key), "create_revision": "0" },
        ]);
        self.txn(key, compare, value, lease, None, guard)
    }

    /// Deletes `key` only if it was last written at `mod_revision`.
    fn delete_if(&self, key: &str, mod_revision: u64) -> Result<bool> {
        let body = json!({
            "compare": [{
                "target": "MOD", "key": b64(key), "mod_revision": mod_revision.to_string()
            }],
            "success": [{ "request_delete_range": { "key": b64(key) } }],
        });
        let v = self.call("/v3/kv/txn", &body)?;
        Ok(v["succeeded"].as_bool() == Some(true))
    }

    /// Every key under `prefix`, in pages of [`RANGE_PAGE`] (each answer
    /// stays under the gateway's size cap), at most `limit`.
    fn range(&self, prefix: &str, limit: usize) -> Result<Vec<Kv>> {
        let end = prefix_end(prefix);
        let mut from = b64(prefix);
        let mut kvs = Vec::new();
        let mut at = None;
        loop {
            let mut body =
                json!({ "key": from, "range_end": end, "limit": RANGE_PAGE.to_string() });
            if let Some(rev) = &at {
                // Every page from the first page's snapshot.
                body["revision"] = json!(rev);
            }
            let v = self.call("/v3/kv/range", &body)?;
            at.get_or_insert_with(|| num(&v["header"]["revision"]).to_string());
            let page = v["kvs"].as_array().map(Vec::as_slice).unwrap_or_default();
            kvs.extend(page.iter().filter_map(parse_kv));
            if kvs.len() > limit {
                return Err(GatewayError(format!(
                    "more than {limit} keys under {prefix}"
                )));
            }
            if v["more"].as_bool() != Some(true) {
                return Ok(kvs);
            }
            // The next page starts just after the page's last key as etcd
            // sent it (one we could not parse included: paging on the last
            // parsed one would ask for the same page for ever).
            let last = page
                .last()
                .and_then(|kv| kv["key"].as_str())
                .and_then(|k| B64.decode(k).ok())
                .ok_or_else(|| {
                    GatewayError(format!("{prefix}: a page said more and held no key"))
                })?;
            from = B64.encode([&last[..], b"\0"].concat());
        }
    }

    /// A new lease of `ttl` (etcd may raise it to its minimum): its id and
    /// granted TTL.
    fn grant(&self, ttl: Duration) -> Result<(i64, Duration)> {
        let v = self.call(
            "/v3/lease/grant",
            &json!({ "TTL": ttl.as_secs().to_string() }),
        )?;
        let id = signed(&v["ID"]);
        if id == 0 {
            return Err(GatewayError(format!("lease grant refused: {v}")));
        }
        Ok((id, Duration::from_secs(num(&v["TTL"]))))
    }

    /// Renews `lease`: the TTL it has from now on, zero when it expired.
    fn keep_alive(&self, lease: i64) -> Result<Duration> {
        let v = self.call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))?;
        Ok(Duration::from_secs(num(&v["result"]["TTL"])))
    }

    /// Revokes `lease` (deleting every key bound to it).
    fn revoke(&self, lease: i64) -> Result<()> {
        self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .map(drop)
    }

    /// Opens a watch on `key` (every key under it, when `prefix`), from
    /// `start` (0: now). The reader blocks until etcd sends something;
    /// `read_timeout` bounds a silent connection (it is then opened again).
    fn watch(
        &self,
        key: &str,
        prefix: bool,
        start: u64,
        read_timeout: Duration,
    ) -> Result<Box<dyn Watch>> {
        let (at, endpoint) = self.endpoint()?;
        let url = format!("{endpoint}/v3/watch");
        let mut create = json!({ "key": b64(key) });
        if prefix {
            create["range_end"] = json!(prefix_end(key));
        }
        if start > 0 {
            create["start_revision"] = json!(start.to_string());
        }
        let token = self.token()?;
        let connect = Duration::from_secs(1);
        let agent = self
            .builder(connect)
            .timeout_connect(connect)
            .timeout_read(read_timeout)
            .build();
        let mut req = agent.post(&url).set(REQUIRE_LEADER.0, REQUIRE_LEADER.1);
        if let Some(t) = &token {
            req = req.set("authorization", t);
        }
        let r = match req.send_string(&json!({ "create_request": create }).to_string()) {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                let text = wire::error_excerpt(r.into_reader());
                if unavailable(code) {
                    self.next_endpoint(at);
                }
                if let (Some(auth), Some(t)) = (&self.auth, &token) {
                    if auth::token_refused(code, &text) {
                        auth.forget(t);
                    }
                }
                return Err(GatewayError(format!("{url}: HTTP {code}: {text}")));
            }
            Err(e) => {
                self.next_endpoint(at);
                return Err(GatewayError(format!("{url}: {e}")));
            }
        };
        let auth = self
            .auth
            .as_ref()
            .zip(token)
            .map(|(a, t)| (Arc::clone(a), t));
        let current = Arc::clone(&self.current);
        let leave = Box::new(move || leave(&current, at));
        Ok(Box::new(
            WatchStream::new(Box::new(r.into_reader()), auth).leaving(leave),
        ))
    }
}
