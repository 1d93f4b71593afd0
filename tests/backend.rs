//! The backend a Tauri app asks for reaches the engine's configuration:
//! `Builder::backend` wins, else `$NIP_LE_BACKEND`, else native.

use tauri_plugin_leader_election::{Backend, Builder};

#[test]
fn the_builders_backend_reaches_the_engine_config() {
    let dir = std::env::temp_dir().join("nip-le-backend-test");
    let b = Builder::new().lock_dir(&dir);
    assert_eq!(
        b.clone().config().unwrap().backend,
        nip_le::config::backend_from_env().unwrap()
    );
    for backend in [Backend::Native, Backend::Portable] {
        assert_eq!(
            b.clone().backend(backend).config().unwrap().backend,
            backend
        );
    }
}
