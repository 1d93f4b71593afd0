//! The lab's etcd starts even when a port it picked is taken before it
//! binds (parallel tests pick ports too): it exits at once, and is started
//! again on others. It used to probe the dead port for 20 s and fail
//! ("etcd did not answer within 20 s: … Connection refused"), once in CI.

mod support;

#[test]
fn etcd_whose_port_was_taken_is_started_again_on_another() {
    if support::etcd_or_skip().is_none() {
        return;
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let peer = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = nip_le_lab::etcd::Etcd::start_on([port, peer], None).expect("etcd starts");
    assert_ne!(e.url(), format!("http://127.0.0.1:{port}"));
    drop(taken);
}
