//! The house rules, checked on the source of the engine, the CLI, the lab
//! and the plugin: no file over 600 lines, and no import circle among a crate's
//! files. An arrow is a `crate::`, `super::`, `self::` or child-module path
//! in code, a `use` or a re-export, followed through re-exports to the file
//! that defines the name; an arrow into a module's own child counts, one
//! from a child up to its own ancestors does not. `mod` declarations,
//! comments and items only tests compile are not arrows.

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

/// The code of a file without comments, string and char contents, and
/// items that only tests compile; and the names of the module files those
/// items declare (`#[cfg(test)] mod tests;`), which are not rooms.
fn code(text: &str) -> (String, Vec<String>) {
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
            // A char literal ('{', '\'', '\n'), not a lifetime ('a).
            '\'' => {
                let mut ahead = chars.clone();
                let first = ahead.next();
                let closes = match first {
                    Some('\\') => true,
                    Some(_) => ahead.next() == Some('\''),
                    None => false,
                };
                if closes {
                    let mut escaped = false;
                    for c in chars.by_ref() {
                        if !escaped && c == '\'' {
                            break;
                        }
                        escaped = !escaped && c == '\\';
                    }
                    out.push_str("' '");
                } else {
                    out.push(c);
                }
            }
            _ => out.push(c),
        }
    }
    strip_test_items(&out)
}

/// Removes every item under `#[cfg(test)]` or `#[cfg(all(test, …))]`.
fn strip_test_items(code: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut test_mods = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(") {
        let attr_end = match rest[at..].find(")]") {
            Some(e) => at + e + 2,
            None => break,
        };
        let inner = &rest[at + "#[cfg(".len()..attr_end - 2];
        let test_only = inner == "test"
            || (inner.starts_with("all(") && inner.contains("test") && !inner.contains("not(test"));
        if !test_only {
            out.push_str(&rest[..attr_end]);
            rest = &rest[attr_end..];
            continue;
        }
        out.push_str(&rest[..at]);
        let item = &rest[attr_end..];
        // The item ends at its first `;` outside braces, or at the brace
        // that closes its first `{`.
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        let words: Vec<&str> = item[..end]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(i) = words.iter().position(|w| *w == "mod") {
            if item[..end].trim_end().ends_with(';') {
                if let Some(name) = words.get(i + 1) {
                    test_mods.push((*name).to_owned());
                }
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, test_mods)
}

/// Paths written in `code` that start at `crate`, `super` or `self`, or
/// at one of the module's own `children` (`files::probe` in a mod.rs that
/// declares `mod files`, read as `self::files::probe`), with `use` groups
/// expanded.
fn paths(code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let tokens = tokenize(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        // Not a path continued, nor a visibility (`pub(in crate::agent)`).
        let path_start = tokens.get(i + 1).map(String::as_str) == Some("::")
            && (i == 0 || (tokens[i - 1] != "::" && tokens[i - 1] != "in"));
        if path_start && matches!(t, "crate" | "super" | "self") {
            i = expand(&tokens, i, Vec::new(), &mut out);
        } else if path_start && children.contains(t) {
            i = expand(&tokens, i, vec!["self".to_owned()], &mut out);
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
/// that is a file of ours), with the path made absolute.
fn resolve(
    from: &[String],
    path: &[String],
    mods: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<(Vec<String>, Vec<String>)> {
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
    let module = (0..=abs.len())
        .rev()
        .map(|n| abs[..n].to_vec())
        .find(|m| mods.contains_key(m))?;
    Some((module, abs))
}

/// The names a module brings in with `use` (a child may name them through
/// it, and anyone when they are public): name → the path as written.
fn uses(code: &str, children: &BTreeSet<String>) -> BTreeMap<String, Vec<String>> {
    let tokens = tokenize(code);
    let mut out = BTreeMap::new();
    for i in 0..tokens.len() {
        if tokens[i] != "use" {
            continue;
        }
        let first = tokens.get(i + 1).map(String::as_str).unwrap_or("");
        let prefix = if children.contains(first) {
            vec!["self".to_owned()]
        } else {
            Vec::new()
        };
        let mut found = Vec::new();
        expand(&tokens, i + 1, prefix, &mut found);
        for p in found {
            if let Some(name) = p.last().filter(|n| *n != "self") {
                out.insert(name.clone(), p);
            }
        }
    }
    out
}

/// Where a name in a module really lives: a path that lands on a name the
/// module only re-exports (`crate::Error`, `super::AgentTimings`) is
/// followed to the module that the `use` names.
fn follow(
    mut module: Vec<String>,
    mut abs: Vec<String>,
    mods: &BTreeMap<Vec<String>, PathBuf>,
    used: &BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
) -> Vec<String> {
    for _ in 0..16 {
        let Some(name) = abs.get(module.len()) else {
            break;
        };
        let Some(written) = used.get(&module).and_then(|u| u.get(name)) else {
            break;
        };
        let Some((to, mut to_abs)) = resolve(&module, written, mods) else {
            break;
        };
        to_abs.extend(abs[module.len() + 1..].iter().cloned());
        (module, abs) = (to, to_abs);
    }
    module
}

/// The source trees checked: the engine, the CLI, the lab and the plugin
/// (each its own crate: `crate::` in one never names another).
fn sources() -> Vec<PathBuf> {
    let engine = Path::new(env!("CARGO_MANIFEST_DIR"));
    vec![
        engine.join("src"),
        engine.join("../nip-le-cli/src"),
        engine.join("../nip-le-lab/src"),
        engine.join("../../src"),
    ]
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
fn no_file_is_over_600_lines() {
    let mut long = Vec::new();
    for src in sources() {
        let mut mods = BTreeMap::new();
        modules(&src, &[], &mut mods);
        long.extend(mods.values().filter_map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let n = text.lines().count();
            (n > MAX_LINES && !generated(&text)).then(|| format!("{} ({n} lines)", p.display()))
        }));
    }
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:#?}");
}

#[test]
fn no_import_circle_in_any_crate() {
    let circles: Vec<String> = sources().iter().flat_map(|s| circles(s)).collect();
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

/// The import circles among the files under `src`, each spelled once.
fn circles(src: &Path) -> BTreeSet<String> {
    let mut mods = BTreeMap::new();
    modules(src, &[], &mut mods);
    let mut codes: BTreeMap<Vec<String>, String> = BTreeMap::new();
    let mut test_files: Vec<Vec<String>> = Vec::new();
    for (m, path) in &mods {
        let (c, test_mods) = code(&std::fs::read_to_string(path).unwrap());
        codes.insert(m.clone(), c);
        test_files.extend(test_mods.into_iter().map(|t| [m.clone(), vec![t]].concat()));
    }
    // Files only tests compile are not rooms, nor anything under them.
    mods.retain(|m, _| !test_files.iter().any(|t| m.starts_with(t)));
    codes.retain(|m, _| mods.contains_key(m));
    let children_of = |m: &Vec<String>| -> BTreeSet<String> {
        mods.keys()
            .filter(|c| c.len() == m.len() + 1 && c.starts_with(m))
            .map(|c| c[m.len()].clone())
            .collect()
    };
    let used: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = codes
        .iter()
        .map(|(m, c)| (m.clone(), uses(c, &children_of(m))))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, c) in &codes {
        for p in paths(c, &children_of(m)) {
            let Some((to, abs)) = resolve(m, &p, &mods) else {
                continue;
            };
            let to = follow(to, abs, &mods, &used);
            // An arrow into a module's own child counts (the election
            // reached `presence/files.rs` through `presence/mod.rs`, and
            // files.rs the lock file layer, which called the election); a
            // child naming what its own ancestors define does not: it is
            // inside them.
            if !m.starts_with(&to) {
                edges.entry(m.clone()).or_default().insert(to);
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
            circles.insert(format!("{}: {}", src.display(), c.join(" → ")));
        }
    }
    circles
}
