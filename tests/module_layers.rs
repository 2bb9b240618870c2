//! The modules of the server's code import each other downward only, through the layers of [`LAYERS`]
//! (docs/architecture.md): this test reads every path of the server's code that names a top-level module
//! (`crate::a::…`, `crate::{a, b}`, and `recserve_core::a` from the outer crate) and fails on an import of a module
//! in the same layer or a higher one, naming the files. Test code is left out: the files declared by a
//! `#[cfg(test)] mod name;` and every item marked `#[cfg(test)]`, wherever in a file it stands. `testing` is test
//! support that no server code may import. The crate boundary itself is Cargo's: `recserve-core` cannot import
//! the outer crate at all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, from the top: a module may import only modules of the layers below its own.
const LAYERS: &[&[&str]] = &[
    // Test support (behind the `testing` feature): it may import anything, and nothing may import it.
    &["testing"],
    // The server crate (`recserve`).
    &["main"],
    &["server", "check"],
    &["api"],
    &["service", "telemetry", "tls"],
    &["config"],
    // The core crate (`recserve-core`).
    &["models"],
    &["pipeline"],
    &["ranking", "recall"],
    &["registry"],
    &["executor"],
    &["gpu", "metrics"],
    &["embedding"],
    &["batching"],
    &["repository", "threads", "trace"],
    &["error"],
];

/// Where each crate's code is, and the name the other crate imports it by.
const CRATES: &[(&str, &str)] = &[("src", "recserve"), ("core/src", "recserve_core")];

/// Module → (module it imports → files that import it).
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the source folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The directory holding the submodules a file declares (`a/mod.rs` and `a.rs` both declare into `a/`).
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().expect("parent").to_path_buf();
    match file.file_name().and_then(|n| n.to_str()) {
        Some("mod.rs" | "lib.rs" | "main.rs") => parent,
        _ => parent.join(file.file_stem().expect("stem")),
    }
}

/// The code of a Rust file with its comments, string and character literals blanked (so that what is left can be
/// searched for paths and braces without being fooled by text).
fn blank_text(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(text.len(), |n| i + n);
            i = end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(text.len(), |n| i + n + 2);
            out.push(' ');
            i = end;
        } else if let Some(hashes) = raw_string_start(rest) {
            let open = rest.find('"').expect("a raw string's quote") + 1;
            let close = format!("\"{}", "#".repeat(hashes));
            let end = rest[open..]
                .find(&close)
                .map_or(text.len(), |n| i + open + n + close.len());
            out.push_str("\"\"");
            i = end;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if bytes[i] == b'\'' {
            // A character literal ('x', '\n', '\u{1F600}'), or a lifetime ('a), which has no closing quote.
            let literal = if rest[1..].starts_with('\\') {
                rest[2..].find('\'').map(|n| n + 3)
            } else {
                rest[1..]
                    .char_indices()
                    .nth(1)
                    .filter(|&(_, c)| c == '\'')
                    .map(|(n, _)| n + 2)
            };
            match literal {
                Some(len) => {
                    out.push_str("' '");
                    i += len;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let c = rest.chars().next().expect("a character");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The number of `#` of a raw string literal that starts `text` (`r"`, `r#"`, `br"`), if one does.
fn raw_string_start(text: &str) -> Option<usize> {
    let after = text.strip_prefix("br").or_else(|| text.strip_prefix('r'))?;
    let hashes = after.chars().take_while(|&c| c == '#').count();
    after[hashes..].starts_with('"').then_some(hashes)
}

/// `code` without the items marked `#[cfg(test)]` (a module, function, `use` or any other item: up to its closing
/// brace or its semicolon), and the names of the modules declared test-only by `#[cfg(test)] mod name;`.
fn without_test_items(code: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut declared = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (n, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = n + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = n + 1;
                    break;
                }
                _ => {}
            }
        }
        let declaration = item[..end].trim();
        if let Some(name) = declaration
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ")
            .strip_prefix("mod ")
            .and_then(|d| d.strip_suffix(';'))
        {
            declared.push(name.trim().to_owned());
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, declared)
}

/// The top-level modules named by the paths of `code` that start with `root::` (`root::a::b`, `root::{a, b::c}`).
fn imported_modules(code: &str, root: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| {
        s.trim()
            .split("::")
            .next()
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<String>()
    };
    let prefix = format!("{root}::");
    let mut rest = code;
    while let Some(at) = rest.find(&prefix) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + prefix.len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `xcrate::`, `my_crate::`: another name
        }
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            out.extend(group[..end].split(',').map(ident));
        } else {
            out.insert(ident(after));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

fn graph(root: &Path) -> Graph {
    let mut graph = Graph::new();
    for &(dir, _) in CRATES {
        let src = root.join(dir);
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        let mut code = BTreeMap::new();
        let mut test_only = BTreeSet::new();
        for path in paths {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let (server, declared) = without_test_items(&blank_text(&text));
            for name in declared {
                let dir = module_dir(&path);
                test_only.insert(dir.join(format!("{name}.rs")));
                test_only.insert(dir.join(&name));
            }
            code.insert(path, server);
        }
        for (file, server) in &code {
            if test_only.iter().any(|t| file.starts_with(t)) {
                continue;
            }
            let relative = file.strip_prefix(&src).expect("under its folder");
            let top = relative
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .expect("a component")
                .trim_end_matches(".rs")
                .to_owned();
            if top == "lib" {
                continue;
            }
            let mut imported = imported_modules(server, "crate");
            imported.extend(imported_modules(server, "recserve_core"));
            imported.extend(imported_modules(server, "recserve"));
            for module in imported {
                if module != top {
                    graph
                        .entry(top.clone())
                        .or_default()
                        .entry(module)
                        .or_default()
                        .insert(
                            file.strip_prefix(root)
                                .expect("in the repository")
                                .display()
                                .to_string(),
                        );
                }
            }
        }
    }
    graph
}

/// The layer of `module` (0 is the top), if [`LAYERS`] names it.
fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// Every import of `graph` that does not go down a layer, or names a module no layer holds, as a line.
fn wrong_way(graph: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (module, imports) in graph {
        for (imported, files) in imports {
            let ok = match (layer(module), layer(imported)) {
                (Some(from), Some(to)) => to > from,
                _ => false,
            };
            if !ok {
                out.push(format!(
                    "{module} (layer {:?}) imports {imported} (layer {:?}) in {files:?}",
                    layer(module),
                    layer(imported)
                ));
            }
        }
    }
    out
}

#[test]
fn modules_import_only_the_layers_below_their_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graph = graph(root);
    let all: Vec<String> = graph
        .iter()
        .map(|(m, deps)| {
            format!(
                "{m} -> {}",
                deps.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    let wrong = wrong_way(&graph);
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}\n\nall imports:\n{}",
        wrong.join("\n"),
        all.join("\n")
    );
    assert!(
        graph.len() > 10,
        "the module graph is suspiciously small:\n{}",
        all.join("\n")
    );
}

#[test]
fn the_checker_reads_every_form_of_path_and_leaves_out_test_code_wherever_it_stands() {
    assert_eq!(
        imported_modules(
            "use crate::a::B;\nlet x = crate::b::f();\nuse crate::{c, d::e};\nuse crate::{self};\nuse xcrate::z;",
            "crate"
        ),
        BTreeSet::from(["a", "b", "c", "d"].map(String::from))
    );
    let text = "use crate::a; // crate::b\n#[cfg(test)]\nmod reference;\n#[cfg(test)]\nmod tests {\n    use crate::c;\n    fn f() { let _ = ('{', \"}\"); }\n}\nuse crate::d;\nlet s = \"crate::e\";\n#[cfg(test)]\nuse crate::f;\nfn g<'a>(x: &'a str) {}\n";
    let (code, declared) = without_test_items(&blank_text(text));
    assert_eq!(
        imported_modules(&code, "crate"),
        BTreeSet::from(["a", "d"].map(String::from)),
        "{code}"
    );
    assert_eq!(declared, vec!["reference".to_owned()]);

    let mut g = Graph::new();
    let edge = |g: &mut Graph, a: &str, b: &str| {
        g.entry(a.into())
            .or_default()
            .entry(b.into())
            .or_default()
            .insert("f.rs".into());
    };
    edge(&mut g, "api", "service");
    edge(&mut g, "service", "ranking");
    assert!(wrong_way(&g).is_empty());
    edge(&mut g, "ranking", "service");
    edge(&mut g, "ranking", "recall");
    edge(&mut g, "nowhere", "error");
    let wrong = wrong_way(&g);
    assert_eq!(wrong.len(), 3, "{wrong:?}");
    assert!(
        wrong[0].starts_with("nowhere (layer None) imports error"),
        "{wrong:?}"
    );
    assert!(
        wrong[1].starts_with("ranking (layer Some(8)) imports recall"),
        "{wrong:?}"
    );
    assert!(
        wrong[2].starts_with("ranking (layer Some(8)) imports service"),
        "{wrong:?}"
    );
}
