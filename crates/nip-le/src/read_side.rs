//! The NIP's read side, whole, for processes that only read leadership: a
//! file read ([`crate::lockfile`]) decided by the rules
//! ([`crate::election`]). It sits above both, so the file layer never
//! needs the rules.

use std::path::Path;

use crate::lockfile::{lock_path, read_unguarded};
use crate::pubkey::AgentPubkey;

/// One unguarded read of `pubkey`'s lock file in `lock_dir`, decided for
/// `our_id` by [`crate::election::reads_as_leader`]. For an agent process
/// spawned by a window, with its instance id: it joins nothing and writes
/// nothing.
pub fn read_side(lock_dir: &Path, pubkey: &AgentPubkey, our_id: &str) -> bool {
    let content = read_unguarded(&lock_path(lock_dir, pubkey));
    crate::election::reads_as_leader(content.as_ref(), our_id)
}
