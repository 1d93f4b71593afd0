//! The TypeScript types in `guest-js/bindings/` are generated from the Rust
//! payload types with ts-rs. This test fails when a file on disk differs from
//! what the Rust types generate; run it with `UPDATE_BINDINGS=1` to rewrite
//! them.

use std::path::PathBuf;

use tauri_plugin_leader_election::*;
use ts_rs::{Config, TS};

fn check<T: TS + 'static>(stale: &mut Vec<String>) {
    let cfg = Config::new().with_large_int("number");
    let rel = T::output_path().expect("every payload type has an export path");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("guest-js/bindings")
        .join(&rel);
    let fresh = T::export_to_string(&cfg).unwrap();
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != fresh {
        if std::env::var_os("UPDATE_BINDINGS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, fresh).unwrap();
        } else {
            stale.push(rel.display().to_string());
        }
    }
}

#[test]
fn generated_bindings_are_up_to_date() {
    let mut stale = Vec::new();
    check::<ChangeReason>(&mut stale);
    check::<LeadershipChanged>(&mut stale);
    check::<Holder>(&mut stale);
    check::<AgentStatus>(&mut stale);
    check::<Status>(&mut stale);
    check::<ClaimOutcome>(&mut stale);
    check::<ControlResult>(&mut stale);
    check::<ErrorKind>(&mut stale);
    check::<LeaderElectionError>(&mut stale);
    assert!(
        stale.is_empty(),
        "stale TypeScript bindings in guest-js/bindings: {stale:?}; regenerate with \
         `UPDATE_BINDINGS=1 cargo test -p tauri-plugin-leader-election --test bindings`"
    );
}
