//! `nip-le-etcd-proto-gen PROTO_DIR OUT_DIR`: compiles PROTO_DIR/etcd.proto and
//! PROTO_DIR/kv.proto into OUT_DIR/etcdserverpb.rs and OUT_DIR/mvccpb.rs
//! (client stubs only). Run through scripts/etcd-proto.sh.
use std::{env, path::PathBuf};

fn main() {
    let args: Vec<PathBuf> = env::args_os().skip(1).map(PathBuf::from).collect();
    let [proto_dir, out_dir] = args.as_slice() else {
        eprintln!("usage: nip-le-etcd-proto-gen PROTO_DIR OUT_DIR");
        std::process::exit(2);
    };
    let protoc = protoc_bin_vendored::protoc_bin_path().expect("vendored protoc for this host");
    // prost-build runs the protoc named by PROTOC.
    env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        // Clients only: the engine never serves etcd's API.
        .build_server(false)
        // No `connect()` helpers tied to tonic::transport: the engine builds
        // its own Channel (TLS, timeouts) and hands it to `XClient::new`.
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out_dir)
        .compile_protos(
            &[proto_dir.join("etcd.proto"), proto_dir.join("kv.proto")],
            &[proto_dir.clone()],
        )
        .expect("compile the etcd protos");
}
