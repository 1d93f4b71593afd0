//! The contender's calls ([`Etcd`]) as etcd's KV and Lease requests.

use std::time::Duration;

use super::proto::{etcdserverpb as pb, mvccpb};
use super::{Grpc, Line};
use crate::global::etcd::{Etcd, EtcdError, Kv, Result, Txn, Watch};

use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::request_op::Request as Op;
use pb::response_op::Response as OpResult;

/// Keys per page of a range read.
const RANGE_PAGE: i64 = 500;

/// A revision as etcd sends it (never negative from a sane etcd; a
/// negative one reads as 0, "unknown").
fn rev(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A revision as etcd takes it (ours come from etcd: one past `i64::MAX`
/// cannot match anything, so it is clamped).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One key-value pair; `None` for a key that is not UTF-8 (none of ours).
pub(super) fn kv_of(kv: mvccpb::KeyValue) -> Option<Kv> {
    Some(Kv {
        key: String::from_utf8(kv.key).ok()?,
        value: kv.value,
        mod_revision: rev(kv.mod_revision),
        lease: kv.lease,
    })
}

/// The end of the range of every key that starts with `prefix`.
pub(super) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn compare(key: &str, target: CompareTarget, revision: u64) -> pb::Compare {
    let revision = signed(revision);
    pb::Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        target_union: Some(match target {
            CompareTarget::Create => TargetUnion::CreateRevision(revision),
            _ => TargetUnion::ModRevision(revision),
        }),
    }
}

fn put_op(key: &str, value: &[u8], lease: i64) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestPut(pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

fn delete_op(key: &str) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestDeleteRange(pb::DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })),
    }
}

fn range_op(key: &str) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestRange(pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })),
    }
}

impl Grpc {
    /// One transaction: its answer.
    fn txn_call(&self, req: pb::TxnRequest) -> Result<pb::TxnResponse> {
        self.call(|l: Line| {
            let req = l.request(req.clone());
            async move {
                let r = l.kv().txn(req).await?.into_inner();
                let header = r.header;
                Ok((r, header))
            }
        })
    }

    /// Puts `key` if `compare` holds (and deletes `also_delete` if it too
    /// was last written at the revision given); otherwise reads
    /// `read_back`.
    fn txn(
        &self,
        key: &str,
        mut compare: Vec<pb::Compare>,
        value: &[u8],
        lease: i64,
        also_delete: Option<(&str, u64)>,
        read_back: &str,
    ) -> Result<Txn> {
        let mut success = vec![put_op(key, value, lease)];
        if let Some((k, revision)) = also_delete {
            success.push(delete_op(k));
            compare.push(self::compare(k, CompareTarget::Mod, revision));
        }
        let r = self.txn_call(pb::TxnRequest {
            compare,
            success,
            failure: vec![range_op(read_back)],
        })?;
        if r.succeeded {
            return Ok(Txn::Done(rev(r.header.map_or(0, |h| h.revision))));
        }
        let kv = r
            .responses
            .into_iter()
            .find_map(|op| match op.response {
                Some(OpResult::ResponseRange(rr)) => rr.kvs.into_iter().next(),
                _ => None,
            })
            .and_then(kv_of);
        Ok(Txn::Failed(kv))
    }

    /// One range request.
    fn range_call(&self, req: pb::RangeRequest) -> Result<pb::RangeResponse> {
        self.call(|l: Line| {
            let req = l.request(req.clone());
            async move {
                let r = l.kv().range(req).await?.into_inner();
                let header = r.header;
                Ok((r, header))
            }
        })
    }
}

impl Etcd for Grpc {
    fn cluster_id(&self) -> u64 {
        self.cluster.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn get_at(&self, key: &str) -> Result<(Option<Kv>, u64)> {
        let r = self.range_call(pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        })?;
        let revision = rev(r.header.map_or(0, |h| h.revision));
        Ok((r.kvs.into_iter().next().and_then(kv_of), revision))
    }

    fn create(&self, key: &str, value: &[u8], lease: i64) -> Result<Txn> {
        let c = vec![compare(key, CompareTarget::Create, 0)];
        self.txn(key, c, value, lease, None, key)
    }

    fn swap(
        &self,
        key: &str,
        mod_revision: u64,
        value: &[u8],
        lease: i64,
        also_delete: Option<(&str, u64)>,
    ) -> Result<Txn> {
        let c = vec![compare(key, CompareTarget::Mod, mod_revision)];
        self.txn(key, c, value, lease, also_delete, key)
    }

    fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<()> {
        let req = pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            lease,
            ..Default::default()
        };
        self.call(|l: Line| {
            let req = l.request(req.clone());
            async move {
                let r = l.kv().put(req).await?.into_inner();
                Ok(((), r.header))
            }
        })
    }

    fn create_if(
        &self,
        guard: &str,
        guard_revision: u64,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Txn> {
        let c = vec![
            compare(guard, CompareTarget::Mod, guard_revision),
            compare(key, CompareTarget::Create, 0),
        ];
        self.txn(key, c, value, lease, None, guard)
    }

    fn delete_if(&self, key: &str, mod_revision: u64) -> Result<bool> {
        let r = self.txn_call(pb::TxnRequest {
            compare: vec![compare(key, CompareTarget::Mod, mod_revision)],
            success: vec![delete_op(key)],
            failure: Vec::new(),
        })?;
        Ok(r.succeeded)
    }

    /// Every key under `prefix`, in pages of [`RANGE_PAGE`] read at the
    /// first page's revision, at most `limit`.
    fn range(&self, prefix: &str, limit: usize) -> Result<Vec<Kv>> {
        let end = prefix_end(prefix);
        let mut from = prefix.as_bytes().to_vec();
        let mut kvs = Vec::new();
        let mut at = 0;
        loop {
            let r = self.range_call(pb::RangeRequest {
                key: from.clone(),
                range_end: end.clone(),
                limit: RANGE_PAGE,
                revision: at,
                ..Default::default()
            })?;
            if at == 0 {
                at = r.header.map_or(0, |h| h.revision);
            }
            let last = r.kvs.last().map(|kv| kv.key.clone());
            kvs.extend(r.kvs.into_iter().filter_map(kv_of));
            if kvs.len() > limit {
                return Err(EtcdError::refused(format!(
                    "more than {limit} keys under {prefix}"
                )));
            }
            if !r.more {
                return Ok(kvs);
            }
            // The next page starts just after the page's last key as etcd
            // sent it (one we skipped included: paging on the last one
            // kept would ask for the same page for ever).
            let last = last.ok_or_else(|| {
                EtcdError::refused(format!("{prefix}: a page said more and held no key"))
            })?;
            from = [&last[..], b"\0"].concat();
        }
    }

    fn grant(&self, ttl: Duration) -> Result<(i64, Duration)> {
        let req = pb::LeaseGrantRequest {
            ttl: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            id: 0,
        };
        let r = self.call(|l: Line| {
            let req = l.request(req);
            async move {
                let r = l.lease().lease_grant(req).await?.into_inner();
                let header = r.header;
                Ok((r, header))
            }
        })?;
        if r.id == 0 || !r.error.is_empty() {
            return Err(EtcdError::refused(format!(
                "lease grant refused: {}",
                r.error
            )));
        }
        Ok((r.id, Duration::from_secs(rev(r.ttl))))
    }

    /// One renewal on a stream of its own (kept open until the answer: a
    /// closed request stream ends etcd's side of it).
    fn keep_alive(&self, lease: i64) -> Result<Duration> {
        let r = self.call(|l: Line| {
            let req = pb::LeaseKeepAliveRequest { id: lease };
            let stream =
                tokio_stream::StreamExt::chain(tokio_stream::once(req), tokio_stream::pending());
            let req = l.request(stream);
            async move {
                let mut answers = l.lease().lease_keep_alive(req).await?.into_inner();
                match answers.message().await? {
                    Some(r) => {
                        let header = r.header;
                        Ok((r, header))
                    }
                    None => Err(tonic::Status::unavailable("keep-alive: closed by etcd")),
                }
            }
        })?;
        Ok(Duration::from_secs(rev(r.ttl)))
    }

    fn revoke(&self, lease: i64) -> Result<()> {
        self.call(|l: Line| {
            let req = l.request(pb::LeaseRevokeRequest { id: lease });
            async move {
                let r = l.lease().lease_revoke(req).await?.into_inner();
                Ok(((), r.header))
            }
        })
    }

    fn watch(
        &self,
        key: &str,
        prefix: bool,
        start: u64,
        read_timeout: Duration,
    ) -> Result<Box<dyn Watch>> {
        self.open_watch(key, prefix, start, read_timeout)
    }
}
