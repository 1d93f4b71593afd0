//! The engine's house rules, checked on its own source: no file over 600
//! lines, and no import circle among its files (an arrow is a `crate::` or
//! `super::` path in code, a `use` or a re-export; `mod` declarations,
//! comments and `#[cfg(test)]` modules are not arrows).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;

/// Every `.rs` file under `dir`, with its module path.
fn modules(dir: &Path, prefix: &[String], out: &mut BTreeMap<Vec<String>, PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let path = e.path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut p = prefix.to_vec();
            p.push(name);
            modules(&path, &p, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let mut p = prefix.to_vec();
            if name != "mod" && name != "lib" {
                p.push(name);
            }
            out.insert(p, path);
        }
    }
}

/// The code of a file without comments, string contents and test modules.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// Paths written in `code` that start at `crate`, `super` or `self`, with
/// `use` groups expanded.
fn paths(code: &str) -> Vec<Vec<String>> {
    let tokens = tokenize(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        let starts = matches!(t, "crate" | "super" | "self")
            && tokens.get(i + 1).map(String::as_str) == Some("::")
            && (i == 0 || tokens[i - 1] != "::");
        if starts {
            i = expand(&tokens, i, Vec::new(), &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// Expands the path starting at `tokens[i]` under `prefix`; returns the
/// index after it.
fn expand(
    tokens: &[String],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match tokens.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                loop {
                    i = expand(tokens, i, prefix.clone(), out);
                    match tokens.get(i).map(String::as_str) {
                        Some(",") => i += 1,
                        Some("}") => return i + 1,
                        _ => return i,
                    }
                    if tokens.get(i).map(String::as_str) == Some("}") {
                        return i + 1;
                    }
                }
            }
            Some(t) if t.chars().all(|c| c.is_alphanumeric() || c == '_') && !t.is_empty() => {
                prefix.push(t.to_owned());
                i += 1;
                if tokens.get(i).map(String::as_str) == Some("::") {
                    i += 1;
                    continue;
                }
                out.push(prefix);
                return i;
            }
            _ => {
                if !prefix.is_empty() {
                    out.push(prefix);
                }
                return i;
            }
        }
    }
}

fn tokenize(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push("::".into());
        } else if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// The module a path written in module `from` names (the longest prefix
/// that is a file of ours).
fn resolve(
    from: &[String],
    path: &[String],
    mods: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<Vec<String>> {
    let mut abs: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("self") => {
            abs = from.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            abs = from.to_vec();
            while rest.first().map(String::as_str) == Some("super") {
                abs.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    abs.extend(rest.iter().cloned());
    (0..=abs.len())
        .rev()
        .map(|n| abs[..n].to_vec())
        .find(|m| mods.contains_key(m))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Whether a file is generated (`scripts/etcd-proto.sh` marks its output
/// so, and checks in CI that it is what the generator makes): read by no
/// one, it keeps the generator's shape.
fn generated(text: &str) -> bool {
    text.lines()
        .next()
        .is_some_and(|l| l.starts_with("// @generated"))
}

#[test]
fn no_engine_file_is_over_600_lines() {
    let mut mods = BTreeMap::new();
    modules(&src(), &[], &mut mods);
    let long: Vec<String> = mods
        .values()
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let n = text.lines().count();
            (n > MAX_LINES && !generated(&text)).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:#?}");
}

#[test]
fn no_import_circle_among_engine_files() {
    let mut mods = BTreeMap::new();
    modules(&src(), &[], &mut mods);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, path) in &mods {
        let text = std::fs::read_to_string(path).unwrap();
        // `self::`/`super::` in a mod.rs are relative to that module.
        for p in paths(&code(&text)) {
            if let Some(to) = resolve(m, &p, &mods) {
                // A module's own children are its rooms, not arrows back.
                if to != *m && !to.starts_with(m) {
                    edges.entry(m.clone()).or_default().insert(to);
                }
            }
        }
    }
    let name = |m: &Vec<String>| {
        if m.is_empty() {
            "lib".to_owned()
        } else {
            m.join("::")
        }
    };
    let mut circles = BTreeSet::new();
    for start in mods.keys() {
        // A path back to `start`, breadth first.
        let mut prev: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        let mut queue = vec![start.clone()];
        let mut found = None;
        while let Some(m) = queue.pop() {
            for to in edges.get(&m).into_iter().flatten() {
                if to == start {
                    found = Some(m.clone());
                    break;
                }
                if !prev.contains_key(to) {
                    prev.insert(to.clone(), m.clone());
                    queue.insert(0, to.clone());
                }
            }
            if found.is_some() {
                break;
            }
        }
        if let Some(mut m) = found {
            let mut circle = vec![name(start)];
            let mut back = vec![name(&m)];
            while m != *start {
                m = prev[&m].clone();
                if m != *start {
                    back.push(name(&m));
                }
            }
            back.reverse();
            circle.extend(back);
            circle.push(name(start));
            // One spelling per circle: start at its smallest room.
            let ring = &circle[..circle.len() - 1];
            let i = (0..ring.len()).min_by_key(|&i| &ring[i]).unwrap();
            let mut c: Vec<String> = ring[i..].iter().chain(&ring[..i]).cloned().collect();
            c.push(c[0].clone());
            circles.insert(c.join(" → "));
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}
