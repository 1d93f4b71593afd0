//! The TypeScript types in `guest-js/bindings/` are generated from the Rust
//! payload types with ts-rs (the engine's types through its `ts` feature).
//! This test fails when a file on disk differs from what the Rust types
//! generate; run it with `UPDATE_BINDINGS=1` to rewrite them.

use std::path::PathBuf;

use ts_rs::{Config, TS};

fn check<T: TS + 'static>(stale: &mut Vec<String>) {
    let cfg = Config::new().with_large_int("number");
    let rel = T::output_path().expect("every payload type has an export path");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("guest-js/bindings")
        .join(&rel);
    let fresh = T::export_to_string(&cfg).expect("the payload types export");
    // The doc comments travel into TypeScript: a Rust intra-doc link
    // (`[`Foo`]`, `crate::…`) means nothing to a TypeScript reader.
    if fresh.contains("[`") || fresh.contains("crate::") {
        stale.push(format!("{} (a Rust doc link in its docs)", rel.display()));
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != fresh {
        if std::env::var_os("UPDATE_BINDINGS").is_some() {
            std::fs::create_dir_all(path.parent().expect("a file has a parent"))
                .expect("bindings directory");
            std::fs::write(&path, fresh).expect("bindings file");
        } else {
            stale.push(rel.display().to_string());
        }
    }
}

#[test]
fn generated_bindings_are_up_to_date() {
    let mut stale = Vec::new();
    check::<nip_le::ChangeReason>(&mut stale);
    check::<nip_le::LeadershipChange>(&mut stale);
    check::<nip_le::HolderStatus>(&mut stale);
    check::<nip_le::LockState>(&mut stale);
    check::<nip_le::ElectionStatus>(&mut stale);
    check::<nip_le::ClaimOutcome>(&mut stale);
    check::<nip_le::ControlResult>(&mut stale);
    check::<nip_le::TakeOutcome>(&mut stale);
    check::<nip_le::QueuedEvent>(&mut stale);
    check::<nip_le::Level>(&mut stale);
    check::<nip_le::GlobalHolder>(&mut stale);
    check::<nip_le::GlobalStatus>(&mut stale);
    check::<nip_le::agent::AgentEvent>(&mut stale);
    check::<nip_le::agent::AgentReport>(&mut stale);
    check::<nip_le::StateCounts>(&mut stale);
    check::<crate::Status>(&mut stale);
    check::<crate::SupervisedAgent>(&mut stale);
    check::<crate::ErrorKind>(&mut stale);
    check::<crate::LeaderElectionError>(&mut stale);
    assert!(
        stale.is_empty(),
        "stale TypeScript bindings in guest-js/bindings: {stale:?}; regenerate with \
         `UPDATE_BINDINGS=1 cargo test -p tauri-plugin-leader-election --lib bindings`"
    );
}
