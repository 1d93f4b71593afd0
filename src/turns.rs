//! The takes of each webview, so that a take ends with the page that took
//! it: a reload (or a script error that reloads), a navigation or a closed
//! window loses the page's turns in flight, and the engine would keep
//! them in flight for as long as this process lives (nobody answers them).
//! The plugin gives them back the moment the page goes, so they are owed
//! again at once. They are also what a webview may settle: a page may
//! `done` or `give_back` only an event a page of this process took, so a
//! follower's page (or any page) cannot silence a mention it never
//! answered, on this host or, through etcd, on every host.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

/// Most takes one page holds of one agent without settling them: a
/// quarter of what the engine lets the whole process hold
/// (`TakeOutcome::TooManyOpen` past it), so one page cannot use up the
/// share of the others.
pub(crate) const MAX_PAGE_TAKES: usize = 256;

/// Takes granted to a webview's page and not yet done or given back.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    by_webview: Mutex<HashMap<String, BTreeSet<(String, String)>>>,
}

impl Turns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeSet<(String, String)>>> {
        // A panic elsewhere while holding it leaves plain data: go on.
        self.by_webview
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The page in `webview` took `event_id` of `pubkey`.
    pub(crate) fn took(&self, webview: &str, pubkey: &str, event_id: &str) {
        self.lock()
            .entry(webview.to_owned())
            .or_default()
            .insert((pubkey.to_owned(), event_id.to_owned()));
    }

    /// How many takes of `pubkey` the page in `webview` holds.
    pub(crate) fn count(&self, webview: &str, pubkey: &str) -> usize {
        (self.lock().get(webview))
            .map_or(0, |takes| takes.iter().filter(|(k, _)| k == pubkey).count())
    }

    /// Whether a page of this process took `event_id` of `pubkey` and has
    /// not finished it.
    pub(crate) fn holds(&self, pubkey: &str, event_id: &str) -> bool {
        let key = (pubkey.to_owned(), event_id.to_owned());
        self.lock().values().any(|takes| takes.contains(&key))
    }

    /// The turn on `event_id` ended (done or given back), in any webview.
    pub(crate) fn ended(&self, pubkey: &str, event_id: &str) {
        let key = (pubkey.to_owned(), event_id.to_owned());
        let mut map = self.lock();
        for takes in map.values_mut() {
            takes.remove(&key);
        }
        map.retain(|_, s| !s.is_empty());
    }

    /// The page in `webview` is gone: its takes, to give back.
    pub(crate) fn forget(&self, webview: &str) -> Vec<(String, String)> {
        self.lock()
            .remove(webview)
            .map(|s| s.into_iter().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_end_with_their_turn_or_their_page() {
        let t = Turns::default();
        t.took("main", "k", "a");
        t.took("main", "k", "b");
        t.took("other", "k", "c");
        assert!(t.holds("k", "a") && t.holds("k", "c") && !t.holds("k", "z"));
        t.ended("k", "a");
        assert!(!t.holds("k", "a"));
        assert_eq!(t.forget("main"), [("k".to_owned(), "b".to_owned())]);
        assert!(t.forget("main").is_empty(), "once");
        assert_eq!(t.forget("other").len(), 1);
    }

    #[test]
    fn a_page_counts_its_own_takes_of_each_agent() {
        let t = Turns::default();
        for id in ["a", "b"] {
            t.took("main", "k", id);
        }
        t.took("main", "j", "c");
        t.took("other", "k", "d");
        assert_eq!((t.count("main", "k"), t.count("main", "j")), (2, 1));
        assert_eq!((t.count("other", "k"), t.count("none", "k")), (1, 0));
    }
}
