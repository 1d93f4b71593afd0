//! The presence token a lock record names its holder by (the extra field
//! `live`), and what a probe of that holder says. A leaf: the record, the
//! election rules and the presence backends all speak of tokens, and none
//! of them should need another to do so.

/// Whether `t` is a well-formed presence token: `<1-10 digits>-<16 hex>`,
/// optionally followed by `-s<1-5 digits>` (a slot). Anything else in a
/// record is ignored.
pub fn valid_token(t: &str) -> bool {
    parse_token(t).is_some()
}

/// The parts of a token: pid, and slot when it has one.
pub(crate) fn parse_token(t: &str) -> Option<(u32, Option<u32>)> {
    let (pid, rest) = t.split_once('-')?;
    let (rand, slot) = match rest.split_once("-s") {
        Some((rand, slot)) => (rand, Some(slot)),
        None => (rest, None),
    };
    let digits =
        |s: &str, max: usize| (1..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid, 10)
        || rand.len() != 16
        || !rand.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        || slot.is_some_and(|s| !digits(s, 5))
    {
        return None;
    }
    Some((pid.parse().ok()?, slot.and_then(|s| s.parse().ok())))
}

/// The pid in a token, for a process handle on its holder.
pub fn token_pid(t: &str) -> Option<u32> {
    parse_token(t).map(|(pid, _)| pid)
}

/// What a presence probe says about a record's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerPresence {
    /// Its lock is held and it still takes part in the election.
    Alive,
    /// No presence, its lock is free (the process is gone), or it no
    /// longer lists the election's key (it left).
    Gone,
    /// Something we cannot judge (a hostile entry, an I/O error): fall back
    /// to the NIP's rules.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_validated() {
        assert_eq!(parse_token("1234-0123456789abcdef"), Some((1234, None)));
        assert_eq!(
            parse_token("1234-0123456789abcdef-s17"),
            Some((1234, Some(17)))
        );
        for bad in [
            "",
            "1234",
            "-0123456789abcdef",
            "12a-0123456789abcdef",
            "1-0123456789ABCDEF",
            "1-0123",
            "../x",
            "1-0123456789abcdef/",
            "1-0123456789abcdef-s",
            "1-0123456789abcdef-s123456",
            "1-0123456789abcdef-sx",
            "1-0123456789abcdef-s1/../x",
        ] {
            assert!(!valid_token(bad), "{bad}");
        }
        assert_eq!(token_pid("12-0123456789abcdef-s3"), Some(12));
    }
}
