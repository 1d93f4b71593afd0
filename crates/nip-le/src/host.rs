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
    /// The boot id (Linux: `/proc/sys/kernel/random/boot_id`; macOS:
    /// `kern.bootsessionuuid`), when there is one.
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

#[cfg(target_os = "macos")]
fn boot_id() -> Option<String> {
    let mut buf = [0u8; 64];
    let mut len = buf.len();
    // SAFETY: sysctlbyname writes at most `len` bytes into our buffer and
    // stores the length it wrote; the name is a NUL-terminated literal.
    let rc = unsafe {
        libc::sysctlbyname(
            c"kern.bootsessionuuid".as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then(|| boot_from_sysctl(&buf[..len.min(buf.len())]))?
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn boot_id() -> Option<String> {
    None
}

/// The boot id in what `sysctlbyname("kern.bootsessionuuid")` returned: a
/// C string (a UUID), without its NUL; nothing for anything else.
pub fn boot_from_sysctl(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let s = std::str::from_utf8(&bytes[..end]).ok()?.trim();
    valid_field(s).then(|| s.to_owned())
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

/// `statfs` of `dir`, or of its nearest existing ancestor: the directory
/// may not exist yet, and that ancestor is where it will be created.
#[cfg(any(target_os = "linux", target_os = "macos"))]
fn statfs_of(dir: &Path) -> Option<libc::statfs> {
    use std::os::unix::ffi::OsStrExt;
    dir.ancestors().find_map(|d| {
        let c = std::ffi::CString::new(d.as_os_str().as_bytes()).ok()?;
        // SAFETY: statfs writes into the struct we pass; the path is a
        // valid C string.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st)
    })
}

/// The network filesystem `dir` sits on, if it does (Linux: by `statfs`'s
/// magic number). `flock` there may not exclude across hosts.
#[cfg(target_os = "linux")]
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    network_fs_by_magic(statfs_of(dir)?.f_type as u64)
}

/// The network filesystem of a Linux `statfs` magic number, if it is one
/// (linux/magic.h, and fs/smb, fs/ceph, fs/afs).
pub fn network_fs_by_magic(magic: u64) -> Option<&'static str> {
    match magic {
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

/// The network filesystem `dir` sits on, if it does (macOS: by `statfs`'s
/// `f_fstypename`).
#[cfg(target_os = "macos")]
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    let st = statfs_of(dir)?;
    let name: Vec<u8> = st
        .f_fstypename
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    network_fs_by_name(std::str::from_utf8(&name).ok()?)
}

/// The network filesystem of a macOS (BSD) `f_fstypename`, if it is one.
pub fn network_fs_by_name(name: &str) -> Option<&'static str> {
    match name {
        "nfs" => Some("nfs"),
        "smbfs" => Some("smbfs"),
        "afpfs" => Some("afpfs"),
        "webdav" => Some("webdav"),
        "cifs" => Some("cifs"),
        "ftp" => Some("ftp"),
        "macfuse" | "osxfuse" | "fusefs" => Some("fuse (possibly remote, e.g. sshfs)"),
        _ => None,
    }
}

/// The network filesystem `dir` sits on, if it does (Windows: a UNC path,
/// or a drive `GetDriveTypeW` calls remote).
#[cfg(windows)]
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    use std::os::windows::ffi::OsStrExt;
    let path = dir.to_string_lossy();
    let root = match windows_root(&path)? {
        WindowsRoot::Unc => return Some("a network share (UNC path)"),
        WindowsRoot::Drive(letter) => format!("{letter}:\\"),
    };
    let wide: Vec<u16> = std::ffi::OsStr::new(&root)
        .encode_wide()
        .chain([0])
        .collect();
    // SAFETY: a NUL-terminated UTF-16 root path.
    let kind = unsafe { windows_sys::Win32::Storage::FileSystem::GetDriveTypeW(wide.as_ptr()) };
    // `DRIVE_REMOTE` of WinBase.h (windows-sys puts it behind another
    // feature, `Win32_System_WindowsProgramming`).
    const DRIVE_REMOTE: u32 = 4;
    (kind == DRIVE_REMOTE).then_some("a network drive (GetDriveTypeW: remote)")
}

/// The root a Windows path names: a UNC share (`\\server\share`,
/// `\\?\UNC\…`, also with forward slashes) or a drive letter (`C:\…`,
/// `\\?\C:\…`); `None` for a relative path.
pub fn windows_root(path: &str) -> Option<WindowsRoot> {
    let p = path.replace('/', "\\");
    let rest = p.strip_prefix(r"\\?\").unwrap_or(&p);
    if rest.starts_with(r"UNC\") || (rest.starts_with(r"\\") && rest.len() > 2) {
        return Some(WindowsRoot::Unc);
    }
    let mut chars = rest.chars();
    match (chars.next(), chars.next()) {
        (Some(letter), Some(':')) if letter.is_ascii_alphabetic() => {
            Some(WindowsRoot::Drive(letter.to_ascii_uppercase()))
        }
        _ => None,
    }
}

/// See [`windows_root`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowsRoot {
    /// A network share.
    Unc,
    /// A drive letter, upper case.
    Drive(char),
}

/// The network filesystem `dir` sits on (not detected on this platform).
#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
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
    fn macos_boot_session_uuids_are_read_from_the_sysctl_bytes() {
        let uuid = "1A2B3C4D-0000-4000-8000-00000000000A";
        let mut bytes = uuid.as_bytes().to_vec();
        bytes.push(0);
        bytes.extend([0xff; 8]);
        assert_eq!(boot_from_sysctl(&bytes).as_deref(), Some(uuid));
        assert_eq!(boot_from_sysctl(uuid.as_bytes()).as_deref(), Some(uuid));
        for hostile in [&b""[..], b"\0", b"\xff\xfe\0", b"a\nb\0"] {
            assert_eq!(boot_from_sysctl(hostile), None, "{hostile:?}");
        }
        assert_eq!(boot_from_sysctl(&[b'x'; 300]), None, "too long");
    }

    #[test]
    fn network_filesystems_are_named_on_every_platform() {
        assert_eq!(network_fs_by_magic(0x6969), Some("nfs"));
        assert_eq!(network_fs_by_magic(0xef53), None, "ext4");
        assert_eq!(network_fs_by_magic(0x0102_1994), None, "tmpfs");
        for (name, remote) in [
            ("nfs", true),
            ("smbfs", true),
            ("afpfs", true),
            ("webdav", true),
            ("macfuse", true),
            ("apfs", false),
            ("hfs", false),
            ("msdos", false),
            ("", false),
        ] {
            assert_eq!(network_fs_by_name(name).is_some(), remote, "{name}");
        }
        use WindowsRoot::{Drive, Unc};
        for (path, root) in [
            (r"C:\Users\me\AppData", Some(Drive('C'))),
            ("d:/buzz/locks", Some(Drive('D'))),
            (r"\\?\C:\Users", Some(Drive('C'))),
            (r"\\server\share\locks", Some(Unc)),
            ("//server/share", Some(Unc)),
            (r"\\?\UNC\server\share", Some(Unc)),
            ("relative\\dir", None),
            ("", None),
            (r"\\", None),
        ] {
            assert_eq!(windows_root(path), root, "{path}");
        }
    }

    #[test]
    fn a_local_tmp_dir_is_not_a_network_filesystem() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(network_fs(tmp.path()), None);
    }
}
