// A new app's src-tauri/src/main.rs, as the Tauri templates make it; lib.rs
// is the README's Rust block.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    readme_app_lib::run()
}
