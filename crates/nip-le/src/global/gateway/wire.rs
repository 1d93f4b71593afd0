//! What travels on the wire: the JSON mapping's numbers and base64, and
//! bounded reads of answers and of the watch stream, so that a hostile or
//! broken peer costs at most a fixed amount of memory.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::Value;

use super::super::etcd::{Change, GatewayError, Kv, Result, Watch, WatchMessage};
use super::auth::Auth;

/// The most one successful answer may hold (ours are a few hundred bytes).
pub(super) const MAX_BODY: u64 = 1 << 20;
/// The most of an error answer that is kept (it goes into every status).
pub(super) const MAX_ERROR_BODY: u64 = 512;
/// The most one line of a watch stream may hold.
pub(super) const MAX_WATCH_LINE: u64 = 16 << 20;

pub(super) fn num(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

pub(super) fn signed(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

pub(super) fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

/// The end of the range of every key that starts with `prefix`.
pub(super) fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return B64.encode(end);
        }
    }
    B64.encode([0u8])
}

pub(super) fn parse_kv(v: &Value) -> Option<Kv> {
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

/// Reads a successful answer of at most [`MAX_BODY`] bytes.
pub(super) fn read_body(r: impl Read) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    r.take(MAX_BODY + 1).read_to_end(&mut body)?;
    if body.len() as u64 > MAX_BODY {
        return Err(std::io::Error::other(format!(
            "answer too large (over {MAX_BODY} bytes)"
        )));
    }
    Ok(body)
}

/// The start of an error answer (at most [`MAX_ERROR_BODY`] bytes, lossy
/// UTF-8, one line), for an error message.
pub(super) fn error_excerpt(r: impl Read) -> String {
    let mut body = Vec::new();
    let _ = r.take(MAX_ERROR_BODY).read_to_end(&mut body);
    let text = String::from_utf8_lossy(&body);
    let text = text.trim().replace(['\r', '\n'], " ");
    if body.len() as u64 == MAX_ERROR_BODY {
        format!("{text}…")
    } else {
        text
    }
}

/// Reads one line (up to and with its `\n`) into `line`, reading at most
/// `cap + 1` bytes: a longer line is an error, whatever follows it.
/// Returns the bytes read (0: end of stream).
pub(super) fn read_line_bounded(
    r: &mut impl BufRead,
    line: &mut Vec<u8>,
    cap: u64,
) -> std::io::Result<usize> {
    line.clear();
    let n = r.take(cap + 1).read_until(b'\n', line)?;
    if n as u64 > cap {
        return Err(std::io::Error::other(format!(
            "oversized message (over {cap} bytes)"
        )));
    }
    Ok(n)
}

/// A watch's stream of JSON lines.
pub(crate) struct WatchStream {
    lines: BufReader<Box<dyn Read + Send + Sync>>,
    /// The credentials the watch was opened with: forgotten when etcd
    /// says the token is no longer valid.
    auth: Option<(Arc<Auth>, String)>,
    /// Moves the gateway past this stream's endpoint: called when the
    /// member ends the stream or it breaks (its member lost its leader,
    /// closed, sent garbage), not when a silent connection times out.
    leave: Option<Box<dyn FnOnce() + Send>>,
}

impl WatchStream {
    pub(super) fn new(r: Box<dyn Read + Send + Sync>, auth: Option<(Arc<Auth>, String)>) -> Self {
        Self {
            lines: BufReader::new(r),
            auth,
            leave: None,
        }
    }

    /// This stream, calling `leave` when its member fails it.
    pub(super) fn leaving(mut self, leave: Box<dyn FnOnce() + Send>) -> Self {
        self.leave = Some(leave);
        self
    }

    /// The member failed this stream: the next one goes elsewhere.
    fn leave(&mut self) {
        if let Some(f) = self.leave.take() {
            f();
        }
    }
}

impl Watch for WatchStream {
    fn next_message(&mut self) -> Result<WatchMessage> {
        let mut line = Vec::new();
        loop {
            let n = match read_line_bounded(&mut self.lines, &mut line, MAX_WATCH_LINE) {
                Ok(n) => n,
                Err(e) => {
                    // A silent connection times out: the normal case.
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                    ) {
                        self.leave();
                    }
                    return Err(GatewayError(format!("watch: {e}")));
                }
            };
            if n == 0 {
                self.leave();
                return Err(GatewayError("watch: closed by etcd".into()));
            }
            if !line.trim_ascii().is_empty() {
                break;
            }
        }
        let v: Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            Err(e) => {
                self.leave();
                return Err(GatewayError(format!("watch: {e}")));
            }
        };
        let r = &v["result"];
        if r.is_null() {
            // An error from the member, such as (etcd 3.4, a watch that
            // requires a leader) {"error":{"grpc_code":14,"message":
            // "etcdserver: no leader",…}} before it closes the stream.
            let text = v.to_string();
            match &self.auth {
                Some((auth, token)) if super::auth::token_refused(0, &text) => auth.forget(token),
                _ => self.leave(),
            }
            let cut: String = text.chars().take(MAX_ERROR_BODY as usize).collect();
            return Err(GatewayError(format!("watch: {cut}")));
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
        let canceled = r["canceled"].as_bool() == Some(true);
        let reason = r["cancel_reason"].as_str().unwrap_or("");
        if canceled && reason.contains("no leader") {
            self.leave();
        }
        // etcd refuses a watch whose token it no longer knows (a restart
        // forgets simple tokens) as "permission denied" too: the next
        // watch logs in again (the calls' gateway has its own token).
        if canceled && (reason.contains("permission denied") || reason.contains("auth")) {
            if let Some((auth, token)) = &self.auth {
                auth.forget(token);
            }
        }
        Ok(WatchMessage {
            revision: num(&r["header"]["revision"]),
            created: r["created"].as_bool() == Some(true),
            ended: canceled || num(&r["compact_revision"]) > 0,
            changes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

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

    /// `left` bytes of `b'a'` and no newline, counting what was read.
    struct Endless {
        left: usize,
        read: Arc<AtomicUsize>,
    }

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.left);
            buf[..n].fill(b'a');
            self.left -= n;
            self.read.fetch_add(n, Ordering::Relaxed);
            Ok(n)
        }
    }

    #[test]
    fn an_endless_watch_line_is_refused_after_the_cap() {
        let read = Arc::new(AtomicUsize::new(0));
        let endless = Endless {
            left: 20 << 20,
            read: Arc::clone(&read),
        };
        let mut w = WatchStream::new(Box::new(endless), None);
        let e = w.next_message().unwrap_err();
        assert!(e.0.contains("oversized"), "{e}");
        // The cap, and at most one buffer's worth beyond it.
        let n = read.load(Ordering::Relaxed) as u64;
        assert!(n <= MAX_WATCH_LINE + 8192 + 1, "read {n} bytes");
    }

    #[test]
    fn watch_lines_under_the_cap_still_parse() {
        let text = "\n{\"result\":{\"header\":{\"revision\":\"5\"},\"created\":true}}\n";
        let mut w = WatchStream::new(Box::new(std::io::Cursor::new(text.as_bytes())), None);
        let m = w.next_message().unwrap();
        assert_eq!((m.revision, m.created), (5, true));
        assert!(w.next_message().unwrap_err().0.contains("closed"));
    }

    #[test]
    fn a_member_without_a_leader_sends_the_next_watch_elsewhere() {
        // What etcd 3.4 sends on a watch that requires a leader, some
        // election timeouts after its member lost it (no newline).
        let no_leader = concat!(
            r#"{"result":{"header":{"revision":"5"},"created":true}}"#,
            "\n",
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}}"#
        );
        let left = Arc::new(AtomicUsize::new(0));
        let count = |left: &Arc<AtomicUsize>| -> Box<dyn FnOnce() + Send> {
            let left = Arc::clone(left);
            Box::new(move || {
                left.fetch_add(1, Ordering::Relaxed);
            })
        };
        let r = std::io::Cursor::new(no_leader.as_bytes());
        let mut w = WatchStream::new(Box::new(r), None).leaving(count(&left));
        assert!(w.next_message().unwrap().created);
        assert_eq!(left.load(Ordering::Relaxed), 0);
        assert!(w.next_message().unwrap_err().0.contains("no leader"));
        assert_eq!(left.load(Ordering::Relaxed), 1);
        // A silent connection timing out stays on its member.
        struct Silent;
        impl Read for Silent {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::TimedOut.into())
            }
        }
        let mut w = WatchStream::new(Box::new(Silent), None).leaving(count(&left));
        assert!(w.next_message().is_err());
        assert_eq!(left.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn bodies_are_bounded() {
        let big = vec![b'x'; (MAX_BODY + 1) as usize];
        let e = read_body(big.as_slice()).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        assert_eq!(read_body(&b"{}"[..]).unwrap(), b"{}");
        let excerpt = error_excerpt(&big[..]);
        assert!(
            excerpt.len() <= MAX_ERROR_BODY as usize + 4,
            "{}",
            excerpt.len()
        );
        assert_eq!(error_excerpt(&b"no\nway\n"[..]), "no way");
    }
}
