//! The gateway against small HTTP servers on loopback that answer what a
//! broken or hostile etcd might.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::config::etcd::EtcdAuth;

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    authorization: Option<String>,
    body: String,
}

/// A server on loopback answering each request with `answer(request)`:
/// an HTTP status line's code and text, and a body. Returns its URL and
/// what it saw.
fn serve(
    answer: impl Fn(&Seen) -> (&'static str, Vec<u8>) + Send + 'static,
) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for s in l.incoming().take(64) {
            let Ok(mut s) = s else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let path = line.split(' ').nth(1).unwrap_or("").to_owned();
            let (mut len, mut authorization) = (0, None);
            loop {
                line.clear();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                let (name, value) = line.split_once(':').unwrap_or((&line, ""));
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => len = value.trim().parse().unwrap_or(0),
                    "authorization" => authorization = Some(value.trim().to_owned()),
                    _ => {}
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let req = Seen {
                path,
                authorization,
                body: String::from_utf8_lossy(&body).into_owned(),
            };
            log.lock().unwrap().push(req.clone());
            let (status, body) = answer(&req);
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            for chunk in body.chunks(64 << 10) {
                if s.write_all(chunk).is_err() {
                    break;
                }
            }
        }
    });
    (url, seen)
}

fn config(url: &str) -> EtcdConfig {
    EtcdConfig::new(vec![url.to_owned()], "h")
}

#[test]
fn an_error_body_is_cut_short() {
    let (url, _) = serve(|_| ("500 Oops", vec![b'x'; 10 << 20]));
    let gw = Gateway::new(&config(&url), Duration::from_secs(5));
    let e = gw.get_at("/k").unwrap_err();
    assert!(e.0.contains("HTTP 500"), "{}", &e.0[..100.min(e.0.len())]);
    assert!(e.0.len() < 1024, "an error of {} bytes", e.0.len());
}

#[test]
fn an_oversized_answer_is_refused() {
    let (url, _) = serve(|_| ("200 OK", vec![b' '; 2 << 20]));
    let gw = Gateway::new(&config(&url), Duration::from_secs(5));
    let e = gw.get_at("/k").unwrap_err();
    assert!(e.0.len() < 1024, "an error of {} bytes", e.0.len());
    assert!(e.0.contains("too large"), "{e}");
}

#[test]
fn no_endpoint_fails_every_call_without_a_panic() {
    let gw = Gateway::new(&config("x"), Duration::from_secs(1));
    let empty = Gateway {
        endpoints: Vec::new(),
        ..gw
    };
    assert!(empty.get_at("/k").unwrap_err().0.contains("no endpoint"));
    assert!(empty.grant(Duration::from_secs(2)).is_err());
    assert!(empty.watch("/k", true, 0, Duration::from_secs(1)).is_err());
}

#[test]
fn a_hung_name_lookup_is_bounded_by_the_calls_timeout() {
    let hang: Resolve = Arc::new(|_: &str| {
        std::thread::sleep(Duration::from_secs(3600));
        Ok(vec![])
    });
    let timeout = Duration::from_millis(300);
    let gw = Gateway::with_resolver(&config("http://etcd.invalid:2379"), timeout, hang);
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send((
            gw.get_at("/k").map(drop),
            gw.watch("/k", true, 0, timeout).map(drop),
        ));
    });
    // Generous slack: this checks a bound, not a speed.
    let (call, watch) = rx
        .recv_timeout(timeout * 2 + Duration::from_secs(5))
        .expect("the call and the watch return although DNS hangs");
    assert!(call.unwrap_err().0.contains("DNS"));
    assert!(watch.is_err());
    assert!(t0.elapsed() < timeout * 2 + Duration::from_secs(5));
}

#[test]
fn a_token_is_sent_and_taken_again_when_etcd_refuses_it() {
    let tokens = Arc::new(Mutex::new(0));
    let issued = Arc::clone(&tokens);
    let (url, seen) = serve(move |r| {
        if r.path == "/v3/auth/authenticate" {
            let mut n = issued.lock().unwrap();
            *n += 1;
            let body = if r.body.contains(r#""password":"s3cret""#) {
                format!(r#"{{"token":"tok{n}"}}"#)
            } else {
                return ("400 Bad Request", b"authentication failed".to_vec());
            };
            return ("200 OK", body.into_bytes());
        }
        match r.authorization.as_deref() {
            // The first token "expires".
            Some("tok1") => (
                "401 Unauthorized",
                br#"{"error":"etcdserver: invalid auth token"}"#.to_vec(),
            ),
            Some(_) => ("200 OK", br#"{"header":{"revision":"9"}}"#.to_vec()),
            None => ("400 Bad Request", b"user name is empty".to_vec()),
        }
    });
    let mut cfg = config(&url);
    cfg.auth = Some(EtcdAuth::new("nip", "s3cret"));
    let gw = Gateway::new(&cfg, Duration::from_secs(5));
    assert_eq!(gw.get_at("/k").unwrap().1, 9);
    assert_eq!(gw.get_at("/k").unwrap().1, 9);
    let seen = seen.lock().unwrap().clone();
    let paths: Vec<(&str, Option<&str>)> = seen
        .iter()
        .map(|s| (s.path.as_str(), s.authorization.as_deref()))
        .collect();
    assert_eq!(
        paths,
        [
            ("/v3/auth/authenticate", None),
            ("/v3/kv/range", Some("tok1")),
            ("/v3/auth/authenticate", None),
            ("/v3/kv/range", Some("tok2")),
            ("/v3/kv/range", Some("tok2")),
        ]
    );
    // A wrong password: an error that says so, no password in it, and no
    // second attempt within the retry interval.
    cfg.auth = Some(EtcdAuth::new("nip", "wrong"));
    let gw = Gateway::new(&cfg, Duration::from_secs(5));
    for _ in 0..3 {
        let e = gw.get_at("/k").unwrap_err();
        assert!(e.0.contains("authentication failed"), "{e}");
        assert!(!e.0.contains("wrong"), "{e}");
    }
    assert_eq!(
        *tokens.lock().unwrap(),
        3,
        "one attempt for the wrong password"
    );
    assert!(!format!("{gw:?} {cfg:?}").contains("wrong"));
}
