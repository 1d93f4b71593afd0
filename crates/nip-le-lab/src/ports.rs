//! Loopback ports for the lab's servers (etcd members, proxies).

use std::net::TcpListener;

/// A port free a moment ago.
pub(crate) fn free_port() -> std::io::Result<u16> {
    Ok(free_ports::<1>()?[0])
}

/// `N` distinct ports free a moment ago (all held while picked, so never
/// the same twice). Another process may still bind one before etcd does:
/// [`super::etcd::Etcd::start`] then starts it again on others.
pub(crate) fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()?;
    let mut ports = [0; N];
    for (p, l) in ports.iter_mut().zip(&held) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}
