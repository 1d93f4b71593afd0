//! Name resolution with a deadline. The system resolver can hang for many
//! seconds (a dead DNS server) and nothing interrupts it: a lookup runs on
//! its own thread and the call gives up on it at the bound, so a call
//! never outlasts its timeout and an app's exit never waits on DNS.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// A name lookup: `host:port` to its addresses.
pub(crate) type Resolve = Arc<dyn Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// The system's resolver.
pub(crate) fn system() -> Resolve {
    Arc::new(|netloc: &str| Ok(netloc.to_socket_addrs()?.collect()))
}

/// Lookups abandoned at their bound and still running: past this many,
/// a new lookup fails at once rather than leave one more thread behind.
const MAX_PENDING: usize = 4;

/// A resolver that answers within `bound` or fails.
#[derive(Clone)]
pub(super) struct Bounded {
    inner: Resolve,
    bound: Duration,
    pending: Arc<AtomicUsize>,
}

impl Bounded {
    pub(super) fn new(inner: Resolve, bound: Duration) -> Self {
        Self {
            inner,
            bound,
            pending: Arc::default(),
        }
    }
}

impl Bounded {
    /// `netloc`'s addresses, or an error once the bound has passed.
    pub(super) fn resolve(&self, netloc: &str) -> io::Result<Vec<SocketAddr>> {
        // An address needs no lookup (and no thread).
        if let Ok(addr) = netloc.parse::<SocketAddr>() {
            return Ok(vec![addr]);
        }
        if self.pending.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("DNS lookup of {netloc}: {MAX_PENDING} earlier lookups still hang"),
            ));
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let (inner, pending, name) = (
            Arc::clone(&self.inner),
            Arc::clone(&self.pending),
            netloc.to_owned(),
        );
        let spawned = std::thread::Builder::new()
            .name("nip-le-dns".into())
            .spawn(move || {
                let r = inner(&name);
                pending.fetch_sub(1, Ordering::SeqCst);
                let _ = tx.send(r);
            });
        if let Err(e) = spawned {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
        match rx.recv_timeout(self.bound) {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("DNS lookup of {netloc}: no answer within {:?}", self.bound),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_need_no_lookup_and_names_are_bounded() {
        let hang: Resolve = Arc::new(|_: &str| {
            std::thread::sleep(Duration::from_secs(3600));
            Ok(vec![])
        });
        let r = Bounded::new(hang, Duration::from_millis(50));
        assert_eq!(r.resolve("127.0.0.1:1").unwrap().len(), 1);
        for _ in 0..MAX_PENDING {
            let e = r.resolve("etcd.example:2379").unwrap_err();
            assert!(e.to_string().contains("no answer within"), "{e}");
        }
        // The hung lookups are not multiplied without end.
        let e = r.resolve("etcd.example:2379").unwrap_err();
        assert!(e.to_string().contains("still hang"), "{e}");
    }
}
