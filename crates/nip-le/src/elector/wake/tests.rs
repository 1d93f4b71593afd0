//! The wake sources' unit tests.

use super::*;

#[test]
fn names_in_the_lock_dir() {
    let pk = "ab".repeat(32);
    let k = AgentPubkey::parse(&pk).unwrap();
    assert_eq!(name_event(&format!("{pk}.lock")), Some(NameEvent::Key(k)));
    assert_eq!(name_event(&format!("{pk}.claim")), Some(NameEvent::Key(k)));
    assert_eq!(
        name_event("12-0123456789abcdef.live"),
        Some(NameEvent::Presence("12-0123456789abcdef".into()))
    );
    assert_eq!(
        name_event(".12-0123456789abcdef-s4.gone"),
        Some(NameEvent::Presence("12-0123456789abcdef-s4".into()))
    );
    for other in [
        format!("{pk}.12-0123456789abcdef.live"),
        "presence.live".to_owned(),
        ".12-0123456789abcdef.live.tmp".to_owned(),
        format!("{pk}.../x.live"),
        format!("{pk}.lock.tmp"),
        ".claim-123".to_owned(),
        "x.lock".to_owned(),
    ] {
        assert_eq!(name_event(&other), None, "{other}");
    }
}
