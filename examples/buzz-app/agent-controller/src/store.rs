//! The agents this app runs, kept on disk like Buzz's local agent store
//! (`restore()` at launch; created, imported and deleted at runtime). Every
//! app process of the user reads the same file, so an agent added in one
//! shows up in the others (they look again every second). Hostile input
//! like every file: a capped read, and content that does not parse is
//! reported and read as no agents.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Largest store read.
const MAX_STORE_BYTES: u64 = 1 << 20;

/// One agent of the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredAgent {
    /// Its public key (64 hex characters; checked when it is run).
    pub pubkey: String,
    /// What the agent card shows.
    pub name: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    agents: Vec<StoredAgent>,
}

/// The store at one path.
#[derive(Debug, Clone)]
pub struct Store {
    path: PathBuf,
}

impl Store {
    /// The store kept at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The agents on disk (none when the file is absent); an error for a
    /// file that cannot be read or does not parse.
    pub fn restore(&self) -> Result<Vec<StoredAgent>, String> {
        let f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let mut bytes = Vec::new();
        f.take(MAX_STORE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        if bytes.len() as u64 > MAX_STORE_BYTES {
            return Err(format!("{}: larger than 1 MiB", self.path.display()));
        }
        let file: File =
            serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", self.path.display()))?;
        Ok(file.agents)
    }

    /// The agents to run at launch: every stored agent, once each.
    pub fn launch_ids(&self) -> Result<Vec<String>, String> {
        let mut ids: Vec<String> = Vec::new();
        for a in self.restore()? {
            let id = a.pubkey.to_ascii_lowercase();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// Adds (or renames) an agent.
    pub fn add(&self, agent: StoredAgent) -> Result<(), String> {
        let mut agents = self.restore()?;
        agents.retain(|a| !a.pubkey.eq_ignore_ascii_case(&agent.pubkey));
        agents.push(agent);
        self.save(agents)
    }

    /// Removes an agent; whether it was there.
    pub fn remove(&self, pubkey: &str) -> Result<bool, String> {
        let mut agents = self.restore()?;
        let before = agents.len();
        agents.retain(|a| !a.pubkey.eq_ignore_ascii_case(pubkey));
        let removed = agents.len() != before;
        self.save(agents)?;
        Ok(removed)
    }

    /// Writes the store whole: beside it, then renamed over it.
    fn save(&self, agents: Vec<StoredAgent>) -> Result<(), String> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let bytes = serde_json::to_vec_pretty(&File { agents }).map_err(|e| e.to_string())?;
        let tmp = self
            .path
            .with_extension(format!("{}.new", std::process::id()));
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &self.path))
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_are_restored_added_removed_and_hostile_content_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Store::new(tmp.path().join("agents.json"));
        assert_eq!(s.restore().unwrap(), vec![]);
        let a = |n: &str| StoredAgent {
            pubkey: n.repeat(64),
            name: format!("agent {n}"),
        };
        s.add(a("a")).unwrap();
        s.add(a("b")).unwrap();
        s.add(StoredAgent {
            pubkey: "A".repeat(64),
            name: "renamed".into(),
        })
        .unwrap();
        assert_eq!(
            s.launch_ids().unwrap(),
            vec!["b".repeat(64), "a".repeat(64)]
        );
        assert!(s.remove(&"b".repeat(64)).unwrap());
        assert!(!s.remove(&"b".repeat(64)).unwrap());
        assert_eq!(s.launch_ids().unwrap(), vec!["a".repeat(64)]);
        std::fs::write(s.path(), b"{not json").unwrap();
        assert!(s.restore().is_err());
        std::fs::write(s.path(), vec![b' '; 2 << 20]).unwrap();
        assert!(s.restore().unwrap_err().contains("1 MiB"));
    }
}
