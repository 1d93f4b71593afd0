//! A watch: one `Watch` stream per watch, read with a bound on silence.
//! Its request side stays open for the watch's life: etcd ends a watch
//! whose client closed its side.

use std::sync::Arc;
use std::time::Duration;

use tonic::Streaming;

use super::auth::Auth;
use super::kv::{kv_of, prefix_end};
use super::proto::{etcdserverpb as pb, mvccpb};
use super::{classify, describe, leave, token_refused, Grpc, Runtime};
use crate::global::etcd::{Change, ErrorKind, EtcdError, Result, Watch, WatchMessage};

/// How long opening a watch may take.
const OPEN: Duration = Duration::from_secs(1);

/// The stream of one watch.
struct GrpcWatch {
    rt: Arc<Runtime>,
    answers: Streaming<pb::WatchResponse>,
    read_timeout: Duration,
    /// The token it was opened with: forgotten when etcd refuses it.
    auth: Option<(Arc<Auth>, String)>,
    /// Moves the client past this watch's endpoint (once).
    leave: Option<Box<dyn FnOnce() + Send>>,
}

impl GrpcWatch {
    fn leave(&mut self) {
        if let Some(f) = self.leave.take() {
            f();
        }
    }

    fn forget_token(&self) {
        if let Some((auth, token)) = &self.auth {
            auth.forget(token);
        }
    }
}

impl Grpc {
    /// Opens a watch on `key` (every key under it, when `prefix`), from
    /// `start` (0: now); a silent stream ends after `read_timeout`.
    pub(super) fn open_watch(
        &self,
        key: &str,
        prefix: bool,
        start: u64,
        read_timeout: Duration,
    ) -> Result<Box<dyn Watch>> {
        let (at, line) = self.line()?;
        let token = line.token.clone();
        let create = pb::WatchCreateRequest {
            key: key.as_bytes().to_vec(),
            range_end: if prefix { prefix_end(key) } else { Vec::new() },
            start_revision: i64::try_from(start).unwrap_or(i64::MAX),
            ..Default::default()
        };
        let first = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
        };
        let requests =
            tokio_stream::StreamExt::chain(tokio_stream::once(first), tokio_stream::pending());
        let req = line.request(requests);
        let mut client = line.watch();
        let opened = self.rt.run(OPEN, async move {
            let answers = client.watch(req).await?.into_inner();
            Ok(answers)
        });
        let answers = match opened {
            Ok(a) => a,
            Err(s) => {
                let e = classify(&s).context(format!("{} watch", self.name(at)));
                if token_refused(&s) {
                    self.forget_token(&line);
                } else if e.kind == ErrorKind::Unreachable {
                    self.failed(at);
                }
                return Err(e);
            }
        };
        let auth = self
            .auth
            .as_ref()
            .zip(token)
            .and_then(|(a, t)| t.to_str().ok().map(|t| (Arc::clone(a), t.to_owned())));
        let current = Arc::clone(&self.current);
        Ok(Box::new(GrpcWatch {
            rt: Arc::clone(&self.rt),
            answers,
            read_timeout,
            auth,
            leave: Some(Box::new(move || leave(&current, at))),
        }))
    }
}

/// One change of a watch message; `None` for a key that is not UTF-8.
fn change_of(e: mvccpb::Event) -> Option<Change> {
    let deleted = e.r#type == mvccpb::event::EventType::Delete as i32;
    let kv = kv_of(e.kv?)?;
    Some(Change {
        key: kv.key.clone(),
        revision: kv.mod_revision,
        kv: (!deleted).then_some(kv),
    })
}

impl Watch for GrpcWatch {
    fn next_message(&mut self) -> Result<WatchMessage> {
        let answers = &mut self.answers;
        let r = match self
            .rt
            .run(self.read_timeout, async move { answers.message().await })
        {
            Ok(Some(r)) => r,
            Ok(None) => {
                self.leave();
                return Err(EtcdError::unreachable("watch: closed by etcd"));
            }
            Err(s) if s.code() == tonic::Code::DeadlineExceeded => {
                // A silent stream: the normal case.
                return Err(EtcdError::unreachable(format!("watch: {}", describe(&s))));
            }
            Err(s) => {
                let e = classify(&s).context("watch");
                if token_refused(&s) {
                    self.forget_token();
                } else {
                    self.leave();
                }
                return Err(e);
            }
        };
        let reason = &r.cancel_reason;
        if r.canceled && reason.contains("no leader") {
            self.leave();
        }
        // etcd refuses a watch whose token it no longer knows (a restart
        // forgets simple tokens) as "permission denied" too: the next
        // watch logs in again.
        if r.canceled && (reason.contains("permission denied") || reason.contains("auth")) {
            self.forget_token();
        }
        Ok(WatchMessage {
            revision: u64::try_from(r.header.map_or(0, |h| h.revision)).unwrap_or(0),
            created: r.created,
            ended: r.canceled || r.compact_revision > 0,
            changes: r.events.into_iter().filter_map(change_of).collect(),
        })
    }
}
