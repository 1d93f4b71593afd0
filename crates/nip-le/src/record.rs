//! The lock record: `{"instance_id","pid","claimed_at"}`, parsed defensively
//! and written byte-compatibly with the existing harness (INTEROP.md).
//!
//! Reading accepts `claimed_at` as RFC 3339 or as unix seconds (a number or a
//! numeric string) and ignores unknown fields; writing always produces
//! `{"instance_id":"…","pid":N,"claimed_at":"<RFC 3339 UTC>"}` in that order.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Largest lock file we read. A real record is ~120 bytes; anything beyond
/// this is treated as malformed without reading it all.
pub const MAX_RECORD_BYTES: usize = 4096;

/// When the current holder claimed the lock, as far as the record says.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClaimedAt {
    /// A parseable instant.
    At(SystemTime),
    /// Present but not a time we can read; counts as stale for acquire.
    Unparseable(String),
}

impl ClaimedAt {
    /// Parses the JSON value of `claimed_at`: an RFC 3339 string, or unix
    /// seconds as a number or numeric string.
    fn from_json(v: &serde_json::Value) -> Self {
        match v {
            serde_json::Value::String(s) => parse_time_str(s)
                .map(ClaimedAt::At)
                .unwrap_or_else(|| ClaimedAt::Unparseable(truncate_for_display(s))),
            serde_json::Value::Number(n) => n
                .as_f64()
                .and_then(unix_seconds)
                .map(ClaimedAt::At)
                .unwrap_or_else(|| ClaimedAt::Unparseable(n.to_string())),
            other => ClaimedAt::Unparseable(truncate_for_display(&other.to_string())),
        }
    }

    /// The instant, if it parsed.
    pub fn instant(&self) -> Option<SystemTime> {
        match self {
            ClaimedAt::At(t) => Some(*t),
            ClaimedAt::Unparseable(_) => None,
        }
    }
}

fn parse_time_str(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        // Checked: chrono's own conversion panics on instants the platform
        // cannot hold (before 1601 on Windows).
        let secs = t.timestamp();
        let nanos = Duration::from_nanos(u64::from(t.timestamp_subsec_nanos()));
        let whole = Duration::from_secs(secs.unsigned_abs());
        return if secs >= 0 {
            UNIX_EPOCH.checked_add(whole)?.checked_add(nanos)
        } else {
            UNIX_EPOCH.checked_sub(whole)?.checked_add(nanos)
        };
    }
    s.parse::<f64>().ok().and_then(unix_seconds)
}

/// Unix seconds → instant; `None` for non-finite or out-of-range values.
fn unix_seconds(secs: f64) -> Option<SystemTime> {
    if !secs.is_finite() || secs.abs() > 1e11 {
        return None;
    }
    let d = Duration::try_from_secs_f64(secs.abs()).ok()?;
    if secs >= 0.0 {
        UNIX_EPOCH.checked_add(d)
    } else {
        UNIX_EPOCH.checked_sub(d)
    }
}

fn truncate_for_display(s: &str) -> String {
    s.chars().take(64).collect()
}

/// A well-formed lock record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockRecord {
    /// Instance id of the holder; the only field the read side uses.
    pub instance_id: String,
    /// Process id of the holder, for dead-pid takeover.
    pub pid: u32,
    /// When the holder last claimed or refreshed.
    pub claimed_at: ClaimedAt,
    /// Extension: fencing epoch, incremented on every change of holder.
    /// Absent in records written by the harness or in spec mode.
    pub epoch: Option<u64>,
    /// Extension: the holder's liveness token (see [`crate::presence`]).
    /// Absent in records written by the harness or in spec mode; ignored
    /// unless it is a well-formed token.
    pub live: Option<String>,
    /// Extension: the writer's host name (see [`crate::host`]); ignored
    /// unless well-formed.
    pub host: Option<String>,
    /// Extension: the writer's boot id (see [`crate::host`]); ignored
    /// unless well-formed.
    pub boot: Option<String>,
}

/// What a lock file holds, classified.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockContent {
    /// No file at the path.
    Absent,
    /// Zero bytes: released (or caught mid-rewrite).
    Empty,
    /// Larger than [`MAX_RECORD_BYTES`].
    Oversized,
    /// Not a record we can read (bad JSON, wrong types, truncated write).
    Malformed(String),
    /// A record.
    Record(LockRecord),
}

impl LockRecord {
    /// Where this record was written, as seen from `here`: a pid and a
    /// presence mean something only on the host and boot that wrote them.
    pub fn origin(&self, here: &crate::host::Here) -> crate::host::Origin {
        crate::host::origin(self.host.as_deref(), self.boot.as_deref(), here)
    }
}

impl LockContent {
    /// Classifies raw bytes (at most [`MAX_RECORD_BYTES`] + 1 of them should
    /// be passed; more is reported as oversized).
    pub fn parse(bytes: &[u8]) -> Self {
        if bytes.is_empty() {
            return LockContent::Empty;
        }
        if bytes.len() > MAX_RECORD_BYTES {
            return LockContent::Oversized;
        }
        #[derive(Deserialize)]
        struct Raw {
            instance_id: String,
            pid: u32,
            claimed_at: serde_json::Value,
            // Extension fields: a wrong type is ignored, never malformed
            // (foreign readers ignore them too).
            #[serde(default)]
            epoch: serde_json::Value,
            #[serde(default)]
            live: serde_json::Value,
            #[serde(default)]
            host: serde_json::Value,
            #[serde(default)]
            boot: serde_json::Value,
        }
        // The NIP says "a JSON object"; serde would also accept an array.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return LockContent::Malformed("not a JSON object".into());
        }
        match serde_json::from_slice::<Raw>(bytes) {
            Ok(raw) => LockContent::Record(LockRecord {
                instance_id: raw.instance_id,
                pid: raw.pid,
                claimed_at: ClaimedAt::from_json(&raw.claimed_at),
                epoch: raw.epoch.as_u64(),
                live: raw
                    .live
                    .as_str()
                    .filter(|t| crate::token::valid_token(t))
                    .map(str::to_owned),
                host: field(&raw.host),
                boot: field(&raw.boot),
            }),
            Err(e) => LockContent::Malformed(e.to_string()),
        }
    }

    /// The record, when there is one.
    pub fn record(&self) -> Option<&LockRecord> {
        match self {
            LockContent::Record(r) => Some(r),
            _ => None,
        }
    }

    /// Short name of the classification, for status output.
    pub fn kind(&self) -> &'static str {
        match self {
            LockContent::Absent => "absent",
            LockContent::Empty => "empty",
            LockContent::Oversized => "oversized",
            LockContent::Malformed(_) => "malformed",
            LockContent::Record(_) => "record",
        }
    }
}

/// A well-formed `host` or `boot` extension field, if `v` is one.
fn field(v: &serde_json::Value) -> Option<String> {
    v.as_str()
        .filter(|s| crate::host::valid_field(s))
        .map(str::to_owned)
}

/// Formats an instant exactly as the harness does (chrono's default RFC
/// 3339: UTC as `+00:00`, as many fraction digits as the instant needs,
/// e.g. `2026-06-15T00:00:00.123456789+00:00`), so a record of ours is
/// byte-identical to the harness's for the same holder and time.
pub fn format_claimed_at(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339()
}

/// Extension fields our extended mode adds after the three NIP fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordExt<'a> {
    /// Fencing epoch.
    pub epoch: u64,
    /// The holder's liveness token.
    pub live: &'a str,
}

/// The exact bytes written for a claim:
/// `{"instance_id":"<id>","pid":<pid>,"claimed_at":"<RFC 3339 UTC>"}`, plus
/// `,"epoch":N,"live":"<token>","host":"<host>","boot":"<boot id>"` in
/// extended mode (host and boot when this machine has them, see
/// [`crate::host`]). The three NIP fields
/// always come first, in that order, with the harness's types.
pub fn encode_record(
    instance_id: &str,
    pid: u32,
    claimed_at: SystemTime,
    ext: Option<RecordExt<'_>>,
) -> Vec<u8> {
    encode_record_at(instance_id, pid, claimed_at, ext, crate::host::here())
}

/// [`encode_record`] for a process on `here` (the host and boot its
/// extended records name).
pub fn encode_record_at(
    instance_id: &str,
    pid: u32,
    claimed_at: SystemTime,
    ext: Option<RecordExt<'_>>,
    here: &crate::host::Here,
) -> Vec<u8> {
    #[derive(Serialize)]
    struct Wire<'a> {
        instance_id: &'a str,
        pid: u32,
        claimed_at: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        epoch: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        live: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        host: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        boot: Option<&'a str>,
    }
    let here = ext.map(|_| here);
    serde_json::to_vec(&Wire {
        instance_id,
        pid,
        claimed_at: format_claimed_at(claimed_at),
        epoch: ext.map(|e| e.epoch),
        live: ext.map(|e| e.live),
        host: here.and_then(|h| h.host.as_deref()),
        boot: here.and_then(|h| h.boot.as_deref()),
    })
    .expect("a struct of strings and integers always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(bytes: &str) -> LockRecord {
        match LockContent::parse(bytes.as_bytes()) {
            LockContent::Record(r) => r,
            other => panic!("expected a record from {bytes:?}, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_harness_exact_format() {
        let r = rec(
            r#"{"instance_id":"4242-1718409600000000000","pid":4242,"claimed_at":"2026-06-15T00:00:00Z"}"#,
        );
        assert_eq!(r.instance_id, "4242-1718409600000000000");
        assert_eq!(r.pid, 4242);
        let expected: SystemTime = DateTime::parse_from_rfc3339("2026-06-15T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
            .into();
        assert_eq!(r.claimed_at, ClaimedAt::At(expected));
        // chrono's default to_rfc3339 in the harness: nanoseconds and +00:00.
        let r = rec(
            r#"{"instance_id":"x","pid":1,"claimed_at":"2026-06-15T00:00:00.123456789+00:00"}"#,
        );
        assert!(matches!(r.claimed_at, ClaimedAt::At(_)));
    }

    #[test]
    fn spec_records_are_byte_identical_to_the_harness() {
        // The harness serialises this struct with serde_json and chrono's
        // default `to_rfc3339()` (INTEROP.md): same field order, same time
        // format (as many fraction digits as needed, `+00:00`).
        #[derive(serde::Serialize)]
        struct HarnessRecord {
            instance_id: String,
            pid: u32,
            claimed_at: String,
        }
        let t0 = UNIX_EPOCH + Duration::from_secs(1_781_481_600);
        for t in [
            t0,
            t0 + Duration::from_millis(123),
            t0 + Duration::from_nanos(123_456_789),
            SystemTime::now(),
        ] {
            let harness = serde_json::to_vec(&HarnessRecord {
                instance_id: "4242-1718409600000000000".into(),
                pid: 4242,
                claimed_at: DateTime::<Utc>::from(t).to_rfc3339(),
            })
            .unwrap();
            assert_eq!(
                String::from_utf8(encode_record("4242-1718409600000000000", 4242, t, None))
                    .unwrap(),
                String::from_utf8(harness).unwrap()
            );
        }
    }

    #[test]
    fn any_rfc3339_time_parses_without_panicking() {
        for s in [
            "0001-01-01T00:00:00Z",
            "1600-12-31T23:59:59.999999999Z",
            "1601-01-01T00:00:00Z",
            "1969-12-31T23:59:59.5Z",
            "9999-12-31T23:59:59.999999999+00:00",
            "2026-06-15T00:00:00-23:59",
        ] {
            let r = rec(&format!(
                r#"{{"instance_id":"x","pid":1,"claimed_at":"{s}"}}"#
            ));
            if let ClaimedAt::At(t) = r.claimed_at {
                // Printing it back (status) must not panic either.
                let _ = format_claimed_at(t);
            }
        }
        let r = rec(r#"{"instance_id":"x","pid":1,"claimed_at":"1969-12-31T23:59:59.5Z"}"#);
        assert_eq!(
            r.claimed_at,
            ClaimedAt::At(UNIX_EPOCH - Duration::from_millis(500))
        );
    }

    #[test]
    fn accepts_unix_seconds_and_unknown_fields() {
        let a = rec(r#"{"instance_id":"x","pid":1,"claimed_at":1781481600}"#);
        let b = rec(
            r#"{"instance_id":"x","pid":1,"claimed_at":"1781481600","epoch":7,"extra":{"a":1}}"#,
        );
        let c = rec(r#"{"claimed_at":1781481600.0,"pid":1,"instance_id":"x"}"#);
        let t = UNIX_EPOCH + Duration::from_secs(1_781_481_600);
        for r in [a, b, c] {
            assert_eq!(r.claimed_at, ClaimedAt::At(t));
        }
    }

    #[test]
    fn unparseable_claimed_at_is_kept_as_such() {
        for v in [
            r#""yesterday""#,
            "null",
            "true",
            r#"[1]"#,
            "1e300",
            r#""NaN""#,
        ] {
            let r = rec(&format!(
                r#"{{"instance_id":"x","pid":1,"claimed_at":{v}}}"#
            ));
            assert!(matches!(r.claimed_at, ClaimedAt::Unparseable(_)), "{v}");
        }
    }

    #[test]
    fn classifies_non_records() {
        assert_eq!(LockContent::parse(b""), LockContent::Empty);
        assert_eq!(
            LockContent::parse(&vec![b' '; MAX_RECORD_BYTES + 1]),
            LockContent::Oversized
        );
        for bad in [
            &b"{"[..],
            br#"{"instance_id":"x","pid":1,"claimed_at":"2026-06"#, // truncated mid-write
            br#"{"instance_id":7,"pid":1,"claimed_at":"x"}"#,
            br#"{"instance_id":"x","pid":-1,"claimed_at":"x"}"#,
            br#"{"instance_id":"x","pid":"12","claimed_at":"x"}"#,
            br#"{"instance_id":"x","pid":1}"#,
            br#"["x",1,"y"]"#,
            b"\xff\xfe\x00binary",
            b"null",
        ] {
            assert!(
                matches!(LockContent::parse(bad), LockContent::Malformed(_)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn writes_the_harness_exact_format() {
        let t = UNIX_EPOCH + Duration::from_millis(1_781_481_600_250);
        let bytes = encode_record("inst-1", 4242, t, None);
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"instance_id":"inst-1","pid":4242,"claimed_at":"2026-06-15T00:00:00.250+00:00"}"#
        );
        // And it reads back to the same record.
        let r = rec(std::str::from_utf8(&bytes).unwrap());
        assert_eq!(
            (r.instance_id.as_str(), r.pid, r.claimed_at),
            ("inst-1", 4242, ClaimedAt::At(t))
        );
    }

    #[test]
    fn extension_fields_follow_the_nip_fields_and_are_optional() {
        let t = UNIX_EPOCH + Duration::from_millis(1_781_481_600_250);
        let ext = RecordExt {
            epoch: 7,
            live: "1234-0123456789abcdef",
        };
        let bytes = encode_record("inst-1", 4242, t, Some(ext));
        let here = crate::host::here();
        let mut expected = r#"{"instance_id":"inst-1","pid":4242,"claimed_at":"2026-06-15T00:00:00.250+00:00","epoch":7,"live":"1234-0123456789abcdef""#.to_owned();
        for (k, v) in [("host", &here.host), ("boot", &here.boot)] {
            if let Some(v) = v {
                expected += &format!(r#","{k}":{}"#, serde_json::to_string(v).unwrap());
            }
        }
        expected += "}";
        assert_eq!(std::str::from_utf8(&bytes).unwrap(), expected);
        let r = rec(std::str::from_utf8(&bytes).unwrap());
        assert_eq!(
            (r.epoch, r.live.as_deref(), &r.host, &r.boot),
            (
                Some(7),
                Some("1234-0123456789abcdef"),
                &here.host,
                &here.boot
            )
        );
        let r = rec(r#"{"instance_id":"x","pid":1,"claimed_at":"x","host":"a\nb","boot":7}"#);
        assert_eq!((r.host, r.boot), (None, None), "ill-formed: ignored");
        // Wrong types or hostile tokens are ignored, never malformed.
        let r = rec(
            r#"{"instance_id":"x","pid":1,"claimed_at":"x","epoch":"7","live":"../../etc/passwd"}"#,
        );
        assert_eq!((r.epoch, r.live), (None, None));
        let r = rec(r#"{"instance_id":"x","pid":1,"claimed_at":"x","epoch":-1,"live":5}"#);
        assert_eq!((r.epoch, r.live), (None, None));
    }

    #[test]
    fn escapes_hostile_instance_ids() {
        let bytes = encode_record("a\"b\\c", 1, UNIX_EPOCH, None);
        assert_eq!(
            rec(std::str::from_utf8(&bytes).unwrap()).instance_id,
            "a\"b\\c"
        );
    }
}
