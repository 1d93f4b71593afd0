//! Microbenchmarks: the hot-path leadership check and an uncontended
//! acquire (one refresh of a key we lead), in both modes.
//! `cargo bench -p nip-le --bench micro`

use criterion::{criterion_group, criterion_main, Criterion};
use nip_le::{AgentPubkey, Config, Elector, InstanceId, Mode};

fn elector(mode: Mode, dir: &std::path::Path) -> (Elector, AgentPubkey) {
    let mut c = Config::new(dir);
    c.mode = mode;
    let e = Elector::start(c, InstanceId::random()).unwrap();
    let pk = AgentPubkey::parse(&"ab".repeat(32)).unwrap();
    assert!(e.join(&pk).unwrap());
    (e, pk)
}

fn benches(c: &mut Criterion) {
    for mode in [Mode::Spec, Mode::Extended] {
        let tmp = tempfile::tempdir().unwrap();
        let (e, pk) = elector(mode, tmp.path());
        let flag = e.leader_flag(&pk).unwrap();
        c.bench_function(&format!("is_leader LeaderFlag [{}]", mode.as_str()), |b| {
            b.iter(|| std::hint::black_box(&flag).is_leader())
        });
        c.bench_function(&format!("is_leader by pubkey [{}]", mode.as_str()), |b| {
            b.iter(|| e.is_leader(std::hint::black_box(&pk)))
        });
        c.bench_function(&format!("uncontended acquire [{}]", mode.as_str()), |b| {
            b.iter(|| e.refresh_now())
        });
    }
}

criterion_group!(micro, benches);
criterion_main!(micro);
