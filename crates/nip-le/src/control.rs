//! Cooperative steal messages: NIP-AO control frames delivered by the relay,
//! and the local lead request that lets co-located instances hand over
//! leadership with no relay at all.
//!
//! Words: the user's *claim* (the sidebar's "lead from this window") is
//! carried to co-located instances by a *lead request*, to remote ones by a
//! `claim_leadership` *frame*; the holder's *record* is what the lock file
//! holds.
//!
//! The lead request is an extension file beside the lock file,
//! `<pubkey>.claim`, holding `{"type":"claim_leadership","targetInstanceId":…,
//! "requestedAt":…,"nonce":…,"pid":…}`. Foreign writers never read it, so it
//! only affects our instances; it is replaced atomically (rename, which never
//! follows a symlink at the destination) and read with the same caps and
//! no-follow rules as the lock file.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pubkey::AgentPubkey;
use crate::record::{format_claimed_at, MAX_RECORD_BYTES};

/// The `type` of a cooperative steal frame.
pub const CLAIM_LEADERSHIP: &str = "claim_leadership";

/// A control frame this crate understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlFrame {
    /// `{"type":"claim_leadership","targetInstanceId":"<id>"}`.
    ClaimLeadership {
        /// The instance that should lead.
        target_instance_id: String,
    },
    /// A frame of another `type`; NIP-AO says unknown types are ignored.
    Other,
}

impl ControlFrame {
    /// Parses a decrypted control frame's JSON content. Unknown `type`s are
    /// [`ControlFrame::Other`]; a known type with missing or mistyped fields
    /// is an error.
    pub fn parse(json: &str) -> Result<Self> {
        if json.len() > 64 * 1024 {
            return Err(Error::ControlFrame("frame larger than 64 KiB".into()));
        }
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| Error::ControlFrame(e.to_string()))?;
        let Some(obj) = v.as_object() else {
            return Err(Error::ControlFrame("not a JSON object".into()));
        };
        match obj.get("type").and_then(|t| t.as_str()) {
            Some(CLAIM_LEADERSHIP) => match obj.get("targetInstanceId").and_then(|t| t.as_str()) {
                Some(t) if !t.is_empty() => Ok(ControlFrame::ClaimLeadership {
                    target_instance_id: t.to_owned(),
                }),
                _ => Err(Error::ControlFrame(
                    "claim_leadership needs a non-empty string targetInstanceId".into(),
                )),
            },
            Some(_) => Ok(ControlFrame::Other),
            None => Err(Error::ControlFrame("missing string field \"type\"".into())),
        }
    }
}

/// The `control_result` the target sends (as telemetry) once it holds the
/// lock: `{"type":"claim_leadership","status":"claimed"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ts", derive(ts_rs::TS), ts(export_to = "ControlResult.ts"))]
pub struct ControlResult {
    /// Always `claim_leadership`.
    #[serde(rename = "type")]
    #[cfg_attr(feature = "ts", ts(rename = "type", type = "\"claim_leadership\""))]
    pub kind: String,
    /// Always `claimed` (no frame is sent while the acquire has not succeeded).
    #[cfg_attr(feature = "ts", ts(type = "\"claimed\""))]
    pub status: String,
}

impl ControlResult {
    /// The result of a successful claim.
    pub fn claimed() -> Self {
        Self {
            kind: CLAIM_LEADERSHIP.into(),
            status: "claimed".into(),
        }
    }

    /// The JSON to send.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("two strings always serialise")
    }
}

/// A local lead request, read from `<pubkey>.claim`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeadRequest {
    /// Always `claim_leadership`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Who asks to lead.
    pub target_instance_id: String,
    /// RFC 3339 UTC time of the request; requests expire after the
    /// stand-down timeout.
    pub requested_at: String,
    /// Unique per request, so a leader honours each request once.
    pub nonce: String,
    /// The requesting process.
    pub pid: u32,
}

impl LeadRequest {
    /// A new request for `target`, now.
    pub fn new(target: &str) -> Self {
        Self::at(
            target,
            SystemTime::now(),
            uuid::Uuid::new_v4().as_u128(),
            std::process::id(),
        )
    }

    /// A request for `target` made at `now` by `pid`, with `nonce` (the
    /// writer passes its world's time and randomness).
    pub fn at(target: &str, now: SystemTime, nonce: u128, pid: u32) -> Self {
        Self {
            kind: CLAIM_LEADERSHIP.into(),
            target_instance_id: target.into(),
            requested_at: format_claimed_at(now),
            nonce: uuid::Uuid::from_u128(nonce).to_string(),
            pid,
        }
    }

    /// When it was made, if parseable.
    pub fn requested_at(&self) -> Option<SystemTime> {
        chrono::DateTime::parse_from_rfc3339(&self.requested_at)
            .ok()
            .map(|t| t.with_timezone(&chrono::Utc).into())
    }

    /// Whether the request is still in force at `now`: made at most
    /// `window` ago and not (beyond that window) in the future.
    pub fn is_fresh(&self, now: SystemTime, window: std::time::Duration) -> bool {
        match self.requested_at() {
            Some(t) => match now.duration_since(t) {
                Ok(age) => age <= window,
                Err(ahead) => ahead.duration() <= window,
            },
            None => false,
        }
    }
}

/// `<dir>/<pubkey>.claim`.
pub fn lead_request_path(dir: &Path, pubkey: &AgentPubkey) -> PathBuf {
    dir.join(format!("{}.claim", pubkey.as_str()))
}

/// Reads the current request, if any valid one exists. Hostile content
/// (symlink, non-file, oversized, malformed) reads as no request.
pub fn read_lead_request(path: &Path) -> Option<LeadRequest> {
    let f = crate::lockfile::open_regular_file(path, crate::lockfile::Create::No).ok()?;
    let mut buf = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(f, MAX_RECORD_BYTES as u64 + 1),
        &mut buf,
    )
    .ok()?;
    if buf.len() > MAX_RECORD_BYTES {
        return None;
    }
    let req: LeadRequest = serde_json::from_slice(&buf).ok()?;
    (req.kind == CLAIM_LEADERSHIP).then_some(req)
}

/// Publishes `req` atomically: a fresh temp file in the same directory
/// (`0600`, created exclusively, never through a symlink), then a rename
/// over the request path. The temp file is removed if anything fails.
pub fn write_lead_request(path: &Path, req: &LeadRequest) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".claim-{}", uuid::Uuid::new_v4().simple()));
    let body = serde_json::to_vec(req).expect("strings and an integer always serialise");
    crate::lockfile::replace_whole(&tmp, path, &body).map_err(|e| Error::io(path, e))
}

/// Removes the request if it is still the one with `nonce` (a newer request
/// by someone else is left alone).
pub fn remove_lead_request(path: &Path, nonce: &str) {
    if read_lead_request(path).is_some_and(|r| r.nonce == nonce) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parses_claim_frames_and_ignores_unknown_types() {
        assert_eq!(
            ControlFrame::parse(r#"{"type":"claim_leadership","targetInstanceId":"abc"}"#).unwrap(),
            ControlFrame::ClaimLeadership {
                target_instance_id: "abc".into()
            }
        );
        assert_eq!(
            ControlFrame::parse(r#"{"type":"cancel_turn","channelId":"x"}"#).unwrap(),
            ControlFrame::Other
        );
        for bad in [
            "",
            "[]",
            "{}",
            r#"{"type":"claim_leadership"}"#,
            r#"{"type":"claim_leadership","targetInstanceId":5}"#,
            r#"{"type":"claim_leadership","targetInstanceId":""}"#,
        ] {
            assert!(ControlFrame::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn result_has_the_interop_shape() {
        assert_eq!(
            ControlResult::claimed().to_json(),
            r#"{"type":"claim_leadership","status":"claimed"}"#
        );
    }

    #[test]
    fn request_round_trip_freshness_and_removal() {
        let tmp = tempfile::tempdir().unwrap();
        let pk = AgentPubkey::parse(&"cd".repeat(32)).unwrap();
        let p = lead_request_path(tmp.path(), &pk);
        assert_eq!(read_lead_request(&p), None);
        let req = LeadRequest::new("me");
        write_lead_request(&p, &req).unwrap();
        assert_eq!(read_lead_request(&p).as_ref(), Some(&req));
        // No temp file is left behind.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
        let now = SystemTime::now();
        assert!(req.is_fresh(now, Duration::from_secs(10)));
        assert!(!req.is_fresh(now + Duration::from_secs(11), Duration::from_secs(10)));
        assert!(!req.is_fresh(now - Duration::from_secs(11), Duration::from_secs(10)));
        remove_lead_request(&p, "someone-else");
        assert!(p.exists());
        remove_lead_request(&p, &req.nonce);
        assert!(!p.exists());
        std::fs::write(&p, b"{garbage").unwrap();
        assert_eq!(read_lead_request(&p), None);
    }
}
