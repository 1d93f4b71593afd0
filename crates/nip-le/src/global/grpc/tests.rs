//! The client against peers that never answer, answer nonsense, or whose
//! names never resolve; and the sorting of etcd's answers from no answer.
//! (Real etcd, with TLS and users: the CLI crate's `etcd_security` tests.)

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tonic::Status;

use super::*;
use crate::global::etcd::{ErrorKind, Etcd};

fn config(url: &str) -> EtcdConfig {
    EtcdConfig::new(vec![url.to_owned()], "h")
}

/// A peer on loopback that accepts connections and does `with` each.
fn peer(with: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let with = Arc::new(with);
    std::thread::spawn(move || {
        for s in l.incoming().take(16).flatten() {
            let with = Arc::clone(&with);
            std::thread::spawn(move || with(s));
        }
    });
    url
}

/// Runs `f` on a thread and waits at most `within` for it.
fn bounded<T: Send + 'static>(within: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(within).expect("returned within its bound")
}

#[test]
fn no_endpoint_fails_every_call_without_a_panic() {
    let c = Grpc::new(&EtcdConfig::new(vec![], "h"), Duration::from_secs(1));
    let e = c.get_at("/k").unwrap_err();
    assert!(e.message.contains("no endpoint"), "{e}");
    assert_eq!(e.kind, ErrorKind::Refused, "a configuration, not an outage");
    assert!(c.grant(Duration::from_secs(2)).is_err());
    assert!(c.watch("/k", true, 0, Duration::from_secs(1)).is_err());
    let bad = Grpc::new(&config("ftp://x"), Duration::from_secs(1));
    assert_eq!(bad.get("/k").unwrap_err().kind, ErrorKind::Refused);
}

#[test]
fn a_hung_name_lookup_is_bounded_by_the_calls_timeout() {
    let hang: Resolve = Arc::new(|_: &str| {
        std::thread::sleep(Duration::from_secs(3600));
        Ok(vec![])
    });
    let timeout = Duration::from_millis(300);
    let c = Grpc::with_resolver(&config("http://etcd.invalid:2379"), timeout, hang);
    let t0 = Instant::now();
    // Generous slack: this checks a bound, not a speed.
    let (call, watch) = bounded(timeout * 2 + Duration::from_secs(5), move || {
        (
            c.get_at("/k").map(drop),
            c.watch("/k", true, 0, timeout).map(drop),
        )
    });
    let call = call.unwrap_err();
    assert!(call.message.contains("DNS"), "{call}");
    assert_eq!(call.kind, ErrorKind::Unreachable);
    assert!(watch.is_err());
    assert!(t0.elapsed() < timeout * 2 + Duration::from_secs(5));
}

#[test]
fn a_peer_that_accepts_and_never_answers_is_out_of_reach_within_the_timeout() {
    // A stopped etcd: the kernel accepts, nothing answers.
    let url = peer(|s| {
        std::thread::sleep(Duration::from_secs(30));
        drop(s);
    });
    let timeout = Duration::from_millis(300);
    let c = Grpc::new(&config(&url), timeout);
    let t0 = Instant::now();
    let (call, watch) = bounded(Duration::from_secs(10), move || {
        (
            c.get_at("/k").map(drop),
            c.watch("/k", true, 0, timeout).map(drop),
        )
    });
    assert_eq!(call.unwrap_err().kind, ErrorKind::Unreachable);
    assert_eq!(watch.err().map(|e| e.kind), Some(ErrorKind::Unreachable));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn a_peer_that_speaks_no_grpc_is_out_of_reach_and_its_text_is_cut_short() {
    let url = peer(|mut s| {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        let body = vec![b'x'; 1 << 20];
        let _ = s.write_all(b"HTTP/1.1 500 Oops\r\nContent-Length: 1048576\r\n\r\n");
        let _ = s.write_all(&body);
    });
    let c = Grpc::new(&config(&url), Duration::from_secs(2));
    let e = bounded(Duration::from_secs(10), move || c.get_at("/k").unwrap_err());
    assert_eq!(e.kind, ErrorKind::Unreachable, "{e}");
    assert!(
        e.message.len() <= MAX_ERROR * 2,
        "an error of {} bytes",
        e.message.len()
    );
}

/// The table of docs/cross-host.md ("What is an outage"), with the texts
/// etcd 3.4, 3.5 and 3.7 and the transport send.
#[test]
fn etcds_answers_are_refusals_and_the_rest_is_out_of_reach() {
    use ErrorKind::{Refused, Unreachable};
    let cases = [
        (
            Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            Refused,
        ),
        (
            Status::permission_denied("etcdserver: permission denied"),
            Refused,
        ),
        (
            Status::invalid_argument("etcdserver: user name is empty"),
            Refused,
        ),
        (
            Status::unauthenticated("etcdserver: invalid auth token"),
            Refused,
        ),
        (
            Status::not_found("etcdserver: requested lease not found"),
            Refused,
        ),
        (
            Status::resource_exhausted("etcdserver: mvcc: database space exceeded"),
            Refused,
        ),
        (
            Status::out_of_range("etcdserver: mvcc: required revision has been compacted"),
            Refused,
        ),
        (Status::unknown("etcdserver: some new refusal"), Refused),
        (
            Status::unavailable("invalid peer certificate: UnknownIssuer"),
            Refused,
        ),
        (
            Status::unknown("transport error: received fatal alert: BadCertificate"),
            Refused,
        ),
        (Status::unavailable("etcdserver: no leader"), Unreachable),
        (
            Status::unavailable("etcdserver: request timed out"),
            Unreachable,
        ),
        (Status::unavailable("tcp connect error"), Unreachable),
        (Status::cancelled("operation was canceled"), Unreachable),
        (
            Status::unknown("h2 protocol error: error reading a body from connection"),
            Unreachable,
        ),
        (
            Status::internal("h2 protocol error: http2 error"),
            Unreachable,
        ),
        (
            Status::deadline_exceeded("no answer within 1s"),
            Unreachable,
        ),
    ];
    for (status, kind) in cases {
        assert_eq!(classify(&status).kind, kind, "{status:?}");
    }
    assert!(token_refused(&Status::unauthenticated(
        "etcdserver: invalid auth token"
    )));
    assert!(token_refused(&Status::invalid_argument(
        "etcdserver: revision of auth store is old"
    )));
    assert!(!token_refused(&Status::permission_denied(
        "etcdserver: permission denied"
    )));
}

#[test]
fn an_async_caller_does_not_panic() {
    let c = Grpc::new(&EtcdConfig::new(vec![], "h"), Duration::from_millis(200));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = peer(drop);
    let reachable = Grpc::new(&config(&url), Duration::from_millis(200));
    rt.block_on(async {
        assert!(c.get_at("/k").is_err());
        assert!(reachable.get_at("/k").is_err());
    });
}
