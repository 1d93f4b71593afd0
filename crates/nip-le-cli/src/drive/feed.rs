//! Following a JSON-lines file that anyone appends to: the stand-in for the
//! relay's fan-out used by `nip-le run --mentions`, the example app and the
//! tests. Reads are incremental and capped; a truncated or replaced file is
//! followed again from its start; a partial last line waits for its newline.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Longest chunk read per poll.
const MAX_READ: u64 = 1 << 20;

/// An incremental reader of new complete JSON lines.
#[derive(Debug)]
pub struct FeedFollower {
    path: PathBuf,
    offset: u64,
    pending: Vec<u8>,
}

impl FeedFollower {
    /// Follows `path` from its current end (only lines appended from now on).
    pub fn from_end(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        Self::from_offset(path, offset)
    }

    /// Follows `path` from byte `offset`.
    pub fn from_offset(path: impl Into<PathBuf>, offset: u64) -> Self {
        Self {
            path: path.into(),
            offset,
            pending: Vec::new(),
        }
    }

    /// The followed file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The JSON values of the complete lines appended since the last poll.
    /// Lines that are not JSON are skipped; a missing file yields nothing.
    pub fn poll(&mut self) -> Vec<Value> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            // Truncated or replaced: start over.
            self.offset = 0;
            self.pending.clear();
        }
        if len == self.offset || f.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut buf = Vec::new();
        if (&mut f).take(MAX_READ).read_to_end(&mut buf).is_err() {
            return Vec::new();
        }
        self.offset += buf.len() as u64;
        self.pending.extend_from_slice(&buf);
        let mut out = Vec::new();
        while let Some(nl) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                out.push(v);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn yields_complete_new_lines_only() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("feed.jsonl");
        std::fs::write(&p, b"{\"id\":0}\n").unwrap();
        let mut f = FeedFollower::from_end(&p);
        assert!(f.poll().is_empty());
        let mut w = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        w.write_all(b"{\"id\":1}\nnot json\n{\"id\":").unwrap();
        assert_eq!(f.poll(), vec![serde_json::json!({"id":1})]);
        w.write_all(b"2}\n").unwrap();
        assert_eq!(f.poll(), vec![serde_json::json!({"id":2})]);
        // Truncated and rewritten: followed from the start again.
        std::fs::write(&p, b"{\"id\":3}\n").unwrap();
        assert_eq!(f.poll(), vec![serde_json::json!({"id":3})]);
        assert!(FeedFollower::from_end(tmp.path().join("absent"))
            .poll()
            .is_empty());
    }
}
