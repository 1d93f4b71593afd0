//! etcd's v3 JSON gateway over plain HTTP: the few calls the contender
//! needs (range, a transaction, leases, a watch stream), with every request
//! bounded by a timeout so that an unreachable etcd never holds the
//! contender past a fencing deadline. Keys and values travel base64-encoded
//! and numbers as strings, as the gateway's JSON mapping of the protobufs
//! says.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use super::etcd::{Change, Etcd, GatewayError, Kv, Result, Txn, Watch, WatchMessage};

/// A client for one list of endpoints; a failed call moves to the next.
#[derive(Debug)]
pub(crate) struct Gateway {
    endpoints: Vec<String>,
    current: std::sync::atomic::AtomicUsize,
    agent: ureq::Agent,
}

fn num(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

fn signed(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

/// The end of the range of every key that starts with `prefix`.
fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return B64.encode(end);
        }
    }
    B64.encode([0u8])
}

fn parse_kv(v: &Value) -> Option<Kv> {
    let key = B64.decode(v.get("key")?.as_str()?).ok()?;
    let value = match v.get("value").and_then(Value::as_str) {
        Some(s) => B64.decode(s).ok()?,
        None => Vec::new(),
    };
    Some(Kv {
        key: String::from_utf8(key).ok()?,
        value,
        mod_revision: v.get("mod_revision").map_or(0, num),
        lease: v.get("lease").map_or(0, signed),
    })
}

impl Gateway {
    /// A client for `endpoints` (`http://host:port`), each call bounded by
    /// `timeout`.
    pub(crate) fn new(endpoints: &[String], timeout: Duration) -> Self {
        Self {
            endpoints: endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_owned())
                .collect(),
            current: Default::default(),
            agent: ureq::AgentBuilder::new()
                .timeout(timeout)
                .max_idle_connections_per_host(4)
                .build(),
        }
    }

    fn endpoint(&self) -> &str {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        &self.endpoints[i % self.endpoints.len()]
    }

    fn next_endpoint(&self) {
        self.current
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// POSTs `body` to `path` and parses the answer.
    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let url = format!("{}{path}", self.endpoint());
        let answer = self
            .agent
            .post(&url)
            .set("content-type", "application/json")
            .send_string(&body.to_string());
        let text = match answer {
            Ok(r) => r.into_string(),
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                return Err(GatewayError(format!("{url}: HTTP {code}: {text}")));
            }
            Err(e) => {
                // ureq's transport error names the URL already.
                self.next_endpoint();
                return Err(GatewayError(e.to_string()));
            }
        };
        let text = text.map_err(|e| GatewayError(format!("{url}: {e}")))?;
        serde_json::from_str(&text).map_err(|e| GatewayError(format!("{url}: {e}: {text}")))
    }

    fn txn(
        &self,
        key: &str,
        compare: Value,
        value: &[u8],
        lease: i64,
        also_delete: Option<&str>,
    ) -> Result<Txn> {
        let mut success = vec![json!({ "request_put": {
            "key": b64(key), "value": B64.encode(value), "lease": lease.to_string()
        }})];
        if let Some(k) = also_delete {
            success.push(json!({ "request_delete_range": { "key": b64(k) } }));
        }
        let body = json!({
            "compare": compare,
            "success": success,
            "failure": [{ "request_range": { "key": b64(key) } }],
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
        self.txn(key, compare, value, lease, None)
    }

    /// Rewrites `key` (bound to `lease`) only if it was last written at
    /// `mod_revision`; deletes `also_delete` in the same transaction.
    fn swap(
        &self,
        key: &str,
        mod_revision: u64,
        value: &[u8],
        lease: i64,
        also_delete: Option<&str>,
    ) -> Result<Txn> {
        let compare = json!([{
            "target": "MOD", "key": b64(key), "mod_revision": mod_revision.to_string()
        }]);
        self.txn(key, compare, value, lease, also_delete)
    }

    /// Puts `key` unconditionally, bound to `lease`.
    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<()> {
        let body =
            json!({ "key": b64(key), "value": B64.encode(value), "lease": lease.to_string() });
        self.call("/v3/kv/put", &body).map(drop)
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
        let url = format!("{}/v3/watch", self.endpoint());
        let mut create = json!({ "key": b64(key) });
        if prefix {
            create["range_end"] = json!(prefix_end(key));
        }
        if start > 0 {
            create["start_revision"] = json!(start.to_string());
        }
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(1))
            .timeout_read(read_timeout)
            .build();
        let r = agent
            .post(&url)
            .send_string(&json!({ "create_request": create }).to_string())
            .map_err(|e| {
                self.next_endpoint();
                GatewayError(format!("{url}: {e}"))
            })?;
        Ok(Box::new(WatchStream {
            lines: BufReader::new(Box::new(r.into_reader())),
        }))
    }
}

/// A watch's stream of JSON lines.
pub(crate) struct WatchStream {
    lines: BufReader<Box<dyn std::io::Read + Send + Sync>>,
}

impl Watch for WatchStream {
    fn next_message(&mut self) -> Result<WatchMessage> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .lines
                .read_line(&mut line)
                .map_err(|e| GatewayError(format!("watch: {e}")))?;
            if n == 0 {
                return Err(GatewayError("watch: closed by etcd".into()));
            }
            if line.len() > 16 << 20 {
                return Err(GatewayError("watch: oversized message".into()));
            }
            if !line.trim().is_empty() {
                break;
            }
        }
        let v: Value =
            serde_json::from_str(&line).map_err(|e| GatewayError(format!("watch: {e}")))?;
        let r = &v["result"];
        if r.is_null() {
            return Err(GatewayError(format!("watch: {}", v)));
        }
        let changes = r["events"]
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .filter_map(|e| {
                        let kv = parse_kv(&e["kv"])?;
                        let deleted = e["type"].as_str() == Some("DELETE");
                        Some(Change {
                            key: kv.key.clone(),
                            revision: kv.mod_revision,
                            kv: (!deleted).then_some(kv),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(WatchMessage {
            revision: num(&r["header"]["revision"]),
            created: r["created"].as_bool() == Some(true),
            ended: r["canceled"].as_bool() == Some(true) || num(&r["compact_revision"]) > 0,
            changes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(B64.decode(prefix_end("/a/")).unwrap(), b"/a0");
        assert_eq!(B64.decode(prefix_end("a\u{7f}")).unwrap(), b"a\x80");
    }

    #[test]
    fn key_values_parse_from_the_gateways_json() {
        let v: Value = serde_json::from_str(
            r#"{"key":"L2E=","create_revision":"2","mod_revision":"7","version":"1","value":"eA==","lease":"42"}"#,
        )
        .unwrap();
        let kv = parse_kv(&v).unwrap();
        assert_eq!(
            (
                kv.key.as_str(),
                kv.value.as_slice(),
                kv.mod_revision,
                kv.lease
            ),
            ("/a", b"x".as_slice(), 7, 42)
        );
        assert!(parse_kv(&serde_json::json!({"key": "!!"})).is_none());
    }
}
