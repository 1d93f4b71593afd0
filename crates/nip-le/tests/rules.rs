//! The rule catalogue: the rules of docs/lock-contract.md (`LC`),
//! docs/extensions.md (`EX`), docs/work-ledger.md (`WL`) and
//! docs/cross-host.md (`XH`) carry ids, numbered in order without a gap or
//! a repeat; every rule the simulator's invariants guard is one of them;
//! and docs/simulator.md lists every invariant by its id with those rules.
#![cfg(feature = "sim")]

use std::collections::BTreeSet;
use std::path::PathBuf;

use nip_le::sim::Invariant;

const DOCS: [(&str, &str); 4] = [
    ("lock-contract.md", "LC"),
    ("extensions.md", "EX"),
    ("work-ledger.md", "WL"),
    ("cross-host.md", "XH"),
];

fn doc(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The ids a doc gives its rules: a code span opening a bullet or a
/// paragraph, `` `LC3` ``.
fn rule_ids(text: &str, prefix: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    for line in text.lines() {
        let rest = line.strip_prefix("- ").unwrap_or(line);
        let Some(tail) = rest.strip_prefix('`').and_then(|r| r.strip_prefix(prefix)) else {
            continue;
        };
        let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() && tail[digits.len()..].starts_with("` ") {
            ids.push(digits.parse().unwrap());
        }
    }
    ids
}

#[test]
fn every_doc_numbers_its_rules_in_order() {
    for (name, prefix) in DOCS {
        let ids = rule_ids(&doc(name), prefix);
        assert!(!ids.is_empty(), "{name} names no rule");
        let expected: Vec<u32> = (1..=ids.len() as u32).collect();
        assert_eq!(
            ids, expected,
            "{name}: rule ids out of order, repeated or missing"
        );
    }
}

#[test]
fn every_invariant_guards_rules_that_exist_and_is_listed() {
    let mut known = BTreeSet::new();
    for (name, prefix) in DOCS {
        for n in rule_ids(&doc(name), prefix) {
            known.insert(format!("{prefix}{n}"));
        }
    }
    let simulator = doc("simulator.md");
    let mut seen = BTreeSet::new();
    for inv in Invariant::ALL {
        assert!(seen.insert(inv.id()), "{} repeated", inv.id());
        assert!(!inv.guards().is_empty(), "{} guards nothing", inv.id());
        for rule in inv.guards() {
            assert!(
                known.contains(*rule),
                "{} guards {rule}, which no doc names",
                inv.id()
            );
        }
        // Listed: its id, what a failed seed calls it, and its rules.
        let row = simulator
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", inv.id())))
            .unwrap_or_else(|| panic!("docs/simulator.md lists no row for {}", inv.id()));
        assert!(row.contains(inv.what()), "{}: {row}", inv.id());
        for rule in inv.guards() {
            assert!(
                row.contains(&format!("`{rule}`")),
                "{} row lacks {rule}: {row}",
                inv.id()
            );
        }
    }
}
