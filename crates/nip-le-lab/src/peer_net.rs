//! The peer network of the lab's etcd cluster: one TCP proxy per member,
//! in front of its real peer port, so that the lab can cut one member from
//! the others while its clients still reach it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The members' peer network: one proxy per member, in front of its real
/// peer port. A connection's sender is the member etcd's raft transport
/// names in its first request (`X-Server-From`); a connection to or from
/// an isolated member is refused, and cut when the member is isolated.
#[derive(Default)]
pub(super) struct PeerNet {
    pub(super) state: Mutex<NetState>,
    stopping: AtomicBool,
}

#[derive(Default)]
pub(super) struct NetState {
    pub(super) isolated: Vec<bool>,
    /// The members' ids, by number (known once they answer).
    pub(super) ids: Vec<u64>,
    /// Each proxy's address, to wake its accept when stopping.
    pub(super) listening: Vec<SocketAddr>,
    next: u64,
    /// Open connections: (the sender's id, the receiver, both sockets).
    conns: HashMap<u64, (Option<u64>, usize, TcpStream, TcpStream)>,
}

impl NetState {
    /// Whether the member of id `from` (if known) may reach member `to`.
    fn allowed(&self, from: Option<u64>, to: usize) -> bool {
        let from = from.and_then(|id| self.ids.iter().position(|&i| i == id));
        !self.isolated[to] && !from.is_some_and(|f| self.isolated[f])
    }
}

impl PeerNet {
    pub(super) fn set(&self, member: usize, isolated: bool) {
        let mut st = lock(&self.state);
        st.isolated[member] = isolated;
        let cut: Vec<u64> = st
            .conns
            .iter()
            .filter(|(_, (f, t, _, _))| !st.allowed(*f, *t))
            .map(|(k, _)| *k)
            .collect();
        for k in cut {
            if let Some((_, _, a, b)) = st.conns.remove(&k) {
                let _ = a.shutdown(Shutdown::Both);
                let _ = b.shutdown(Shutdown::Both);
            }
        }
    }

    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let mut st = lock(&self.state);
        for (_, (_, _, a, b)) in st.conns.drain() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
        for a in std::mem::take(&mut st.listening) {
            let _ = TcpStream::connect_timeout(&a, Duration::from_secs(1));
        }
    }

    /// Member `to`'s proxy: accepts on `l`, forwards to `real`.
    pub(super) fn serve(self: Arc<Self>, l: TcpListener, to: usize, real: u16) {
        for conn in l.incoming() {
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let Ok(conn) = conn else { continue };
            let net = Arc::clone(&self);
            std::thread::spawn(move || {
                let _ = net.forward(conn, to, real);
            });
        }
    }

    fn forward(&self, mut conn: TcpStream, to: usize, real: u16) -> std::io::Result<()> {
        if lock(&self.state).isolated[to] {
            return Ok(());
        }
        // The first request's head names its sender.
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while find(&head, b"\r\n\r\n").is_none() && head.len() < 64 << 10 {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            head.extend_from_slice(&buf[..n]);
        }
        conn.set_read_timeout(None)?;
        let sender = String::from_utf8_lossy(&head).lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-server-from")
                .then(|| u64::from_str_radix(value.trim(), 16).ok())?
        });
        let mut up = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], real)),
            Duration::from_secs(1),
        )?;
        let key = {
            let mut st = lock(&self.state);
            if self.stopping.load(Ordering::SeqCst) || !st.allowed(sender, to) {
                return Ok(());
            }
            st.next += 1;
            let key = st.next;
            st.conns
                .insert(key, (sender, to, conn.try_clone()?, up.try_clone()?));
            key
        };
        up.write_all(&head)?;
        let (mut back_from, mut back_to) = (up.try_clone()?, conn.try_clone()?);
        let back = std::thread::spawn(move || {
            let _ = std::io::copy(&mut back_from, &mut back_to);
            let _ = back_to.shutdown(Shutdown::Both);
        });
        let _ = std::io::copy(&mut conn, &mut up);
        let _ = up.shutdown(Shutdown::Both);
        let _ = back.join();
        lock(&self.state).conns.remove(&key);
        Ok(())
    }
}

/// Where `needle` first occurs in `hay`.
pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A mutex's guard, poisoned or not (a test thread that panicked must not
/// take the cluster's bookkeeping down with it).
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
