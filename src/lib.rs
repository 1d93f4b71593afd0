//! Tauri v2 plugin for NIP-LE leader election.
//!
//! The plugin itself (Builder, commands, events, permissions) is not written
//! yet; until then this package only re-exports the election engine so the
//! workspace layout is the one the plugin will live in.

pub use nip_le as core;
