//! A slow link: a TCP proxy on loopback that delivers every byte a fixed
//! delay after it arrived, in each direction (latency, not a bandwidth
//! cap: a round trip costs twice the delay, however much it carries). For
//! the tests where etcd is far away.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// The proxy; it stops accepting when dropped (open connections end with
/// their peers).
pub struct SlowLink {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl SlowLink {
    /// Forwards connections to `to`, each byte `delay` late each way.
    pub fn start(to: SocketAddr, delay: Duration) -> std::io::Result<Self> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        std::thread::spawn(move || {
            for conn in l.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let Ok(up) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else {
                    continue;
                };
                let _ = conn.set_nodelay(true);
                let _ = up.set_nodelay(true);
                if let (Ok(c), Ok(u)) = (conn.try_clone(), up.try_clone()) {
                    pipe(conn, up, delay);
                    pipe(u, c, delay);
                }
            }
        });
        Ok(Self { addr, stop })
    }

    /// `http://` and the proxy's address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, bytes) in rx {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}
