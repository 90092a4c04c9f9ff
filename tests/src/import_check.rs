//! The one import checker of the layers tests (`shim/tests/layers.rs`,
//! `collector/tests/layers.rs`, which include this file with `#[path]`): a crate's module map
//! as rows (a module, a file or a directory and everything in it, and the `crate::` roots it
//! may name), checked on the source, so that an import against the map fails a test instead
//! of waiting for a review. Also checks that every module has a row and that no two rows
//! allow a circle.
//!
//! Source, not compiler output: comments are dropped (a comment may name any module), `use`
//! groups are read whole (`use crate::{a, b::c}` names `a` and `b`), `$crate::` and
//! `other_crate::` are not this crate's root.

#![allow(dead_code)] // each includer uses what its map needs

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A module map: each module (`name.rs`, or a directory) and the roots it may name.
pub type Rows<'a> = &'a [(&'a str, &'a [&'a str])];

/// The files of a module: the file, or every file under the directory, sorted.
pub fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut v = Vec::new();
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            v.extend(sources(&entry.path()));
        }
    }
    v.sort();
    v
}

/// The source without comments, lines kept (so that line numbers hold).
pub fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The roots named after each `prefix` (`crate::`, `super::`, `analysis::`) in `code`, with
/// their line: `prefix::x` names `x`, `prefix::{x::y, z}` names `x` and `z` (`self` is not a
/// root).
pub fn named(code: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut offset = 0;
    while let Some(at) = code[offset..].find(prefix) {
        let start = offset + at + prefix.len();
        let before = code[..offset + at].chars().next_back();
        let line = code[..start].matches('\n').count() + 1;
        let after = &code[start..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            if let Some(group) = after.strip_prefix('{') {
                let mut depth = 0;
                let mut item = String::new();
                let mut items = Vec::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                        _ if depth == 0 => item.push(c),
                        _ => {}
                    }
                }
                items.push(item);
                for item in items {
                    let root = ident(item.trim());
                    if !root.is_empty() && root != "self" {
                        found.push((line, root));
                    }
                }
            } else {
                let root = ident(after);
                if !root.is_empty() {
                    found.push((line, root));
                }
            }
        }
        offset = start;
    }
    found
}

/// `file:line: prefix root` for each root a module names outside its row.
pub fn against_rows(src: &Path, rows: Rows<'_>, prefix: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for (module, allowed) in rows {
        for file in sources(&src.join(module)) {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            for (line, root) in named(&code_of(&text), prefix) {
                if !allowed.contains(&root.as_str()) {
                    wrong.push(format!("{}:{line}: {prefix}{root}", file.display()));
                }
            }
        }
    }
    wrong
}

/// The entries of `src` (files and directories) that have no row, less `skip` (`lib.rs`).
pub fn without_rows(src: &Path, rows: Rows<'_>, skip: &[&str]) -> Vec<String> {
    let mut missing: Vec<String> = std::fs::read_dir(src)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !skip.contains(&n.as_str()) && !rows.iter().any(|(m, _)| m == n))
                .collect()
        })
        .unwrap_or_default();
    missing.sort();
    missing
}

/// The module a row names (`log.rs` and `transport` are `log` and `transport`).
fn module_name(row: &str) -> &str {
    row.strip_suffix(".rs").unwrap_or(row)
}

/// Circles the rows allow (`a` may name `b`, which may name `a`, however long the way): each
/// as `a -> b -> a`. A module naming itself (its own submodules) is no circle.
pub fn circles(rows: Rows<'_>) -> Vec<String> {
    let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (module, allowed) in rows {
        let m = module_name(module);
        let e = edges.entry(m).or_default();
        e.extend(allowed.iter().copied().filter(|a| *a != m));
    }
    let mut found = Vec::new();
    // Depth-first from each module, a path at a time (the maps have some 30 rows).
    for &start in edges.keys() {
        let mut stack: Vec<(Vec<&str>, usize)> = vec![(vec![start], 0)];
        while let Some((path, next)) = stack.pop() {
            let at = *path.last().unwrap_or(&start);
            let Some(targets) = edges.get(at) else {
                continue;
            };
            if next < targets.len() {
                stack.push((path.clone(), next + 1));
                let t = targets[next];
                if t == start {
                    let mut c = path.clone();
                    c.push(t);
                    found.push(c.join(" -> "));
                } else if !path.contains(&t) && t > start {
                    let mut p = path.clone();
                    p.push(t);
                    stack.push((p, 0));
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_and_grouped_imports_are_seen_and_comments_are_not() {
        let code = code_of(
            "use crate::a::b;\nuse crate::{c, d::e, self};\n// crate::f\n$crate::g\nlet x = crate::h();",
        );
        assert_eq!(
            named(&code, "crate::"),
            vec![
                (1, "a".to_string()),
                (2, "c".to_string()),
                (2, "d".to_string()),
                (5, "h".to_string())
            ]
        );
    }

    #[test]
    fn a_circle_of_rows_is_found_however_long() {
        let rows: Rows<'_> = &[
            ("a.rs", &["b"]),
            ("b.rs", &["c"]),
            ("c", &["a", "c"]),
            ("d.rs", &["a"]),
        ];
        assert_eq!(circles(rows), vec!["a -> b -> c -> a".to_string()]);
        let rows: Rows<'_> = &[("a.rs", &["b"]), ("b.rs", &[]), ("c", &["c", "a"])];
        assert!(circles(rows).is_empty());
    }
}
