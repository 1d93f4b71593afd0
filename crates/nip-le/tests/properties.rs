//! Property tests of the parts that read hostile input: the record parser,
//! the pubkey validator and the takeable decision, the last against a
//! reference model written independently from the NIP's text.

use std::time::{Duration, SystemTime};

use nip_le::election::{takeable, Takeable};
use nip_le::liveness::Liveness;
use nip_le::record::{encode_record, ClaimedAt, LockContent, LockRecord, MAX_RECORD_BYTES};
use nip_le::AgentPubkey;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parser_never_panics_and_classifies_by_size(bytes in proptest::collection::vec(any::<u8>(), 0..6000)) {
        let c = LockContent::parse(&bytes);
        if bytes.is_empty() {
            prop_assert_eq!(c, LockContent::Empty);
        } else if bytes.len() > MAX_RECORD_BYTES {
            prop_assert_eq!(c, LockContent::Oversized);
        }
    }

    #[test]
    fn json_shaped_garbage_never_panics(
        id in any::<Option<String>>(),
        pid in any::<Option<i64>>(),
        claimed in prop_oneof![Just(serde_json::Value::Null), any::<i64>().prop_map(serde_json::Value::from),
                               any::<f64>().prop_map(|f| serde_json::json!(f)), ".{0,40}".prop_map(serde_json::Value::from)],
        extra in any::<Option<String>>(),
    ) {
        let mut m = serde_json::Map::new();
        if let Some(id) = id { m.insert("instance_id".into(), id.into()); }
        if let Some(pid) = pid { m.insert("pid".into(), pid.into()); }
        m.insert("claimed_at".into(), claimed);
        if let Some(e) = extra { m.insert("live".into(), e.clone().into()); m.insert("epoch".into(), e.into()); }
        let bytes = serde_json::to_vec(&m).unwrap();
        let _ = LockContent::parse(&bytes);
    }

    #[test]
    fn written_records_read_back(id in "[ -~]{1,64}", pid in any::<u32>(), secs in 0u64..4_000_000_000, millis in 0u64..1000) {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(secs * 1000 + millis);
        let bytes = encode_record(&id, pid, t, None);
        match LockContent::parse(&bytes) {
            LockContent::Record(r) => {
                prop_assert_eq!(r.instance_id, id);
                prop_assert_eq!(r.pid, pid);
                prop_assert_eq!(r.claimed_at, ClaimedAt::At(t));
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn pubkeys_are_accepted_iff_64_hex(s in prop_oneof!["[0-9a-fA-F]{64}", ".{0,80}", "[0-9a-f]{60,68}"]) {
        let ok = s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
        match AgentPubkey::parse(&s) {
            Ok(k) => {
                prop_assert!(ok);
                prop_assert_eq!(k.as_str(), s.to_ascii_lowercase());
                prop_assert!(!k.lock_file_name().contains('/'));
            }
            Err(_) => prop_assert!(!ok),
        }
    }

    #[test]
    fn takeable_matches_the_reference_model(
        kind in prop_oneof![Just(3u8), 0u8..4],
        ours in any::<bool>(),
        dead in any::<bool>(),
        unparseable in any::<bool>(),
        age in -100i64..100,
        stale in 1u64..50,
        near in proptest::option::of((any::<bool>(), -2i64..=2)),
    ) {
        // Half the cases sit right at the stale bound, past or future.
        let age = match near {
            Some((future, d)) => {
                let a = stale as i64 + d;
                if future { -a } else { a }
            }
            None => age,
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let claimed_at = if unparseable {
            ClaimedAt::Unparseable("?".into())
        } else if age >= 0 {
            ClaimedAt::At(now - Duration::from_secs(age as u64))
        } else {
            ClaimedAt::At(now + Duration::from_secs(age.unsigned_abs()))
        };
        let content = match kind {
            0 => LockContent::Absent,
            1 => LockContent::Empty,
            2 => LockContent::Malformed("x".into()),
            _ => LockContent::Record(LockRecord {
                instance_id: if ours { "me".into() } else { "them".into() },
                pid: 42,
                claimed_at: claimed_at.clone(),
                epoch: None,
                live: None,
                host: None,
                boot: None,
            }),
        };
        // The model, from the NIP's text plus our documented future rule.
        let model = kind < 3
            || ours
            || dead
            || unparseable
            || (age as i128).unsigned_abs() > stale as u128;
        let got = takeable(&content, "me", now, Duration::from_secs(stale), |_| if dead { Liveness::Dead } else { Liveness::Alive });
        prop_assert_eq!(matches!(got, Takeable::Yes(_)), model, "{:?}", content);
    }
}
