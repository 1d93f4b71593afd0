//! Which machine this is, as the OS keeps it: the host id kept in a lock
//! directory is bound to it, so a lock directory shared by several
//! machines (an NFS home, synced dotfiles) never gives two of them one
//! host id. Only a fingerprint of it is ever written (a hash: the machine
//! id itself is not for sharing).

/// The fingerprint of this machine's id; `None` where the OS keeps none
/// we can read.
pub(crate) fn fingerprint() -> Option<String> {
    raw().map(|id| fingerprint_of(&id))
}

/// A stable, one-way fingerprint of a machine id: 16 hex digits.
pub(crate) fn fingerprint_of(machine_id: &str) -> String {
    /// Our namespace for name-based UUIDs (any fixed UUID will do).
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6e69_702d_6c65_2d68_6f73_742d_6964_0001);
    let id = uuid::Uuid::new_v5(&NAMESPACE, machine_id.trim().as_bytes());
    id.simple().to_string()[..16].to_owned()
}

/// A machine id as read: accepted if it is a short run of hex digits and
/// dashes (systemd's `machine-id`, a UUID), refused otherwise (a file we
/// cannot trust to name a machine).
pub(crate) fn plausible(raw: &str) -> Option<String> {
    let id = raw.trim();
    let ok = (16..=64).contains(&id.len())
        && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && id.chars().any(|c| c != '0' && c != '-');
    ok.then(|| id.to_ascii_lowercase())
}

/// Linux and the other Unixes: systemd's (or D-Bus's) machine id.
#[cfg(all(unix, not(target_vendor = "apple")))]
fn raw() -> Option<String> {
    use std::io::Read as _;
    ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|p| {
            let mut s = String::new();
            std::fs::File::open(p)
                .ok()?
                .take(128)
                .read_to_string(&mut s)
                .ok()?;
            plausible(&s)
        })
}

/// macOS: the host UUID (`gethostuuid`, the hardware's).
#[cfg(target_vendor = "apple")]
fn raw() -> Option<String> {
    let mut id = [0u8; 16];
    let wait = libc::timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    // SAFETY: `id` is the 16 bytes gethostuuid writes; `wait` outlives it.
    let r = unsafe { libc::gethostuuid(id.as_mut_ptr(), &wait) };
    (r == 0)
        .then(|| uuid::Uuid::from_bytes(id).to_string())
        .and_then(|s| plausible(&s))
}

/// Windows: `MachineGuid`, which Windows setup writes once per install.
#[cfg(windows)]
fn raw() -> Option<String> {
    use windows_sys::Win32::System::Registry::{RegGetValueW, HKEY_LOCAL_MACHINE, RRF_RT_REG_SZ};
    let wide = |s: &str| s.encode_utf16().chain([0]).collect::<Vec<u16>>();
    let (key, name) = (
        wide(r"SOFTWARE\Microsoft\Cryptography"),
        wide("MachineGuid"),
    );
    let mut buf = [0u16; 64];
    let mut len = u32::try_from(std::mem::size_of_val(&buf)).ok()?;
    // SAFETY: the strings are NUL-terminated; `buf` holds `len` bytes.
    let r = unsafe {
        RegGetValueW(
            HKEY_LOCAL_MACHINE,
            key.as_ptr(),
            name.as_ptr(),
            RRF_RT_REG_SZ,
            std::ptr::null_mut(),
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    let chars = (len as usize / 2).min(buf.len());
    let s = String::from_utf16_lossy(&buf[..chars]);
    plausible(s.trim_end_matches('\0'))
}

#[cfg(not(any(unix, windows)))]
fn raw() -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_ids_are_checked_and_fingerprints_are_stable_and_one_way() {
        // systemd's form, a UUID (macOS, Windows), hostile text.
        assert!(plausible("0123456789abcdef0123456789abcdef\n").is_some());
        assert!(plausible("6F9619FF-8B86-D011-B42D-00C04FC964FF").is_some());
        for bad in [
            "",
            "uninitialized\n",
            "../../etc/passwd",
            "00000000000000000000000000000000",
            "12",
        ] {
            assert!(plausible(bad).is_none(), "{bad:?}");
        }
        let a = fingerprint_of("0123456789abcdef0123456789abcdef");
        assert_eq!(a.len(), 16);
        assert_eq!(a, fingerprint_of("0123456789abcdef0123456789abcdef\n"));
        assert_ne!(a, fingerprint_of("fedcba9876543210fedcba9876543210"));
        assert!(!a.contains("0123456789abcdef"));
        // This machine (CI's) has one.
        #[cfg(target_os = "linux")]
        assert!(fingerprint().is_some());
    }
}
