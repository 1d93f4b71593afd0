//! Extension: which host, and which boot of it, wrote a record.
//!
//! A record names a pid, and a pid means something only on the host that
//! wrote it, during that boot. After a reboot a recycled pid would keep a
//! dead holder "alive" until the stale bound; on a lock directory shared by
//! two machines (a network home over NFS or SMB, where `flock` may not even
//! exclude across hosts) each machine would probe the other's pids. So
//! extended records carry `"host"` and `"boot"`, and:
//!
//! * a record from another boot of this host is dead at once;
//! * a record from another host is never judged by its pid or presence,
//!   only by our own clock (it must stay unchanged past the stale bound);
//! * a record without them (the harness, spec mode, an older build) is
//!   judged as the NIP says.
//!
//! A lock directory on a network filesystem is reported (log and status).

use std::path::Path;
use std::sync::OnceLock;

/// Longest `host` or `boot` value we read or write.
pub const MAX_FIELD_BYTES: usize = 255;

/// This process's host and boot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Here {
    /// The host name, when it can be read.
    pub host: Option<String>,
    /// The boot id (Linux: `/proc/sys/kernel/random/boot_id`), when there
    /// is one.
    pub boot: Option<String>,
}

/// This process's host and boot, read once.
pub fn here() -> &'static Here {
    static HERE: OnceLock<Here> = OnceLock::new();
    HERE.get_or_init(|| Here {
        host: hostname().filter(|h| valid_field(h)),
        boot: boot_id().filter(|b| valid_field(b)),
    })
}

/// A usable `host` or `boot` value: 1 to 255 bytes, no control characters.
pub fn valid_field(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_FIELD_BYTES && !s.chars().any(char::is_control)
}

#[cfg(unix)]
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

#[cfg(not(unix))]
fn hostname() -> Option<String> {
    std::env::var("COMPUTERNAME").ok()
}

#[cfg(target_os = "linux")]
fn boot_id() -> Option<String> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(s.trim().to_owned())
}

#[cfg(not(target_os = "linux"))]
fn boot_id() -> Option<String> {
    None
}

/// Where a record was written, as seen from here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This host and boot, or a record that does not say (the NIP's rules).
    HereOrUnknown,
    /// An earlier (or later) boot of this host: its holder is gone.
    OtherBoot,
    /// Another host: its pid and presence mean nothing here.
    OtherHost,
}

/// Where a record carrying `host` and `boot` was written, as seen from
/// `here` (see [`crate::record::LockRecord::origin`]).
pub fn origin(host: Option<&str>, boot: Option<&str>, here: &Here) -> Origin {
    match (host, here.host.as_deref()) {
        (Some(theirs), Some(ours)) if theirs != ours => Origin::OtherHost,
        (Some(_), Some(_)) => match (boot, here.boot.as_deref()) {
            (Some(theirs), Some(ours)) if theirs != ours => Origin::OtherBoot,
            _ => Origin::HereOrUnknown,
        },
        _ => Origin::HereOrUnknown,
    }
}

/// The network filesystem `dir` sits on, if it does (Linux: by `statfs`'s
/// magic number). `flock` there may not exclude across hosts.
#[cfg(target_os = "linux")]
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    // The directory may not exist yet: its nearest existing ancestor is
    // where it will be created.
    let st = dir.ancestors().find_map(|d| {
        let c = std::ffi::CString::new(d.as_os_str().as_bytes()).ok()?;
        // SAFETY: statfs writes into the struct we pass; the path is a
        // valid C string.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st)
    })?;
    // The magic numbers of linux/magic.h (and fs/smb, fs/ceph, fs/afs).
    match st.f_type as u64 {
        0x6969 => Some("nfs"),
        0x517b => Some("smb"),
        0xff53_4d42 => Some("cifs"),
        0xfe53_4d42 => Some("smb2"),
        0x00c3_6400 => Some("ceph"),
        0x5346_414f => Some("afs"),
        0x0bd0_0bd0 => Some("lustre"),
        0x4750_4653 => Some("gpfs"),
        0x6573_5546 => Some("fuse (possibly remote, e.g. sshfs)"),
        _ => None,
    }
}

/// The network filesystem `dir` sits on (not detected on this platform).
#[cfg(not(target_os = "linux"))]
pub fn network_fs(_dir: &Path) -> Option<&'static str> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ClaimedAt;
    use crate::record::LockRecord;

    fn rec(host: Option<&str>, boot: Option<&str>) -> LockRecord {
        LockRecord {
            instance_id: "x".into(),
            pid: 1,
            claimed_at: ClaimedAt::Unparseable(String::new()),
            epoch: None,
            live: None,
            host: host.map(str::to_owned),
            boot: boot.map(str::to_owned),
        }
    }

    #[test]
    fn origin_follows_host_then_boot() {
        let here = Here {
            host: Some("laptop".into()),
            boot: Some("b1".into()),
        };
        let o = |h, b| rec(h, b).origin(&here);
        assert_eq!(o(Some("laptop"), Some("b1")), Origin::HereOrUnknown);
        assert_eq!(o(Some("laptop"), Some("b0")), Origin::OtherBoot);
        assert_eq!(o(Some("desktop"), Some("b1")), Origin::OtherHost);
        assert_eq!(o(Some("desktop"), None), Origin::OtherHost);
        assert_eq!(
            o(None, Some("b0")),
            Origin::HereOrUnknown,
            "no host: NIP rules"
        );
        assert_eq!(o(Some("laptop"), None), Origin::HereOrUnknown);
        let nowhere = Here {
            host: None,
            boot: None,
        };
        assert_eq!(
            rec(Some("desktop"), Some("b0")).origin(&nowhere),
            Origin::HereOrUnknown
        );
    }

    #[test]
    fn here_is_readable_and_valid_on_linux() {
        let h = here();
        if cfg!(target_os = "linux") {
            assert!(h.host.is_some() && h.boot.is_some(), "{h:?}");
        }
        for f in [&h.host, &h.boot].into_iter().flatten() {
            assert!(valid_field(f));
        }
        assert!(!valid_field(""));
        assert!(!valid_field("a\nb"));
        assert!(!valid_field(&"x".repeat(256)));
    }

    #[test]
    fn a_local_tmp_dir_is_not_a_network_filesystem() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(network_fs(tmp.path()), None);
    }
}
