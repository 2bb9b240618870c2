//! The top-level modules of `src/` depend on each other in one direction only: this test reads every `crate::…`
//! path of the server's code (not its tests: `#[cfg(test)]` modules and the files they declare are skipped, and
//! `testing` is test support that nothing else may import) and fails on a cycle, naming the files of each edge in
//! it. The layers it keeps (docs/architecture.md): `api` → `service` → `pipeline`, `ranking`, `recall` →
//! `registry` → `batching`, `executor`, `embedding`, `gpu`, `metrics`, `config` → `repository` → `error`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module → (module it imports → files that import it).
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
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

/// Files declared by `#[cfg(test)] mod name;`: test code, which may import anything.
fn test_only_files(files: &[(PathBuf, String)]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for (file, text) in files {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            if pair[0] != "#[cfg(test)]" {
                continue;
            }
            let declaration = pair[1]
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            if let Some(name) = declaration
                .strip_prefix("mod ")
                .and_then(|d| d.strip_suffix(';'))
            {
                let dir = module_dir(file);
                out.insert(dir.join(format!("{name}.rs")));
                out.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// The code of a file without its comments and without a trailing `#[cfg(test)] mod tests { … }`.
fn server_code(text: &str) -> String {
    let code = match text.find("\n#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    code.lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named by the `crate::` paths of `code` (`crate::a::b`, `crate::{a, b::c}`).
fn imported_modules(code: &str) -> BTreeSet<String> {
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
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            out.extend(group[..end].split(',').map(ident));
        } else {
            out.insert(ident(after));
        }
        rest = after;
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

fn graph(src: &Path) -> Graph {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let files: Vec<(PathBuf, String)> = paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read");
            (p, text)
        })
        .collect();
    let test_only = test_only_files(&files);
    let mut graph = Graph::new();
    for (file, text) in &files {
        if test_only.contains(file) {
            continue;
        }
        let relative = file.strip_prefix(src).expect("under src");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .expect("a component")
            .trim_end_matches(".rs")
            .to_owned();
        if top == "lib" || top == "main" {
            continue;
        }
        for module in imported_modules(&server_code(text)) {
            if module != top {
                graph
                    .entry(top.clone())
                    .or_default()
                    .entry(module)
                    .or_default()
                    .insert(relative.display().to_string());
            }
        }
    }
    graph
}

/// One cycle of `graph`, as its modules in order, if it has any.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        module: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            return Some(path[at..].to_vec());
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flat_map(BTreeMap::keys) {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_import_each_other_in_one_direction() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    let layers: Vec<String> = graph
        .iter()
        .map(|(m, deps)| {
            format!(
                "{m} -> {}",
                deps.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    if let Some(cycle) = find_cycle(&graph) {
        let edges: Vec<String> = cycle
            .iter()
            .zip(cycle.iter().cycle().skip(1))
            .map(|(a, b)| format!("  {a} -> {b}: {:?}", graph[a][b]))
            .collect();
        panic!(
            "import cycle {}:\n{}\n\nall imports:\n{}",
            cycle.join(" -> "),
            edges.join("\n"),
            layers.join("\n")
        );
    }
    assert!(
        !graph.values().any(|deps| deps.contains_key("testing")),
        "server code imports the test support module `testing`:\n{}",
        layers.join("\n")
    );
    assert!(
        graph.len() > 10,
        "the module graph is suspiciously small:\n{}",
        layers.join("\n")
    );
}

#[test]
fn the_checker_finds_cycles_and_reads_every_form_of_path() {
    assert_eq!(
        imported_modules(
            "use crate::a::B;\nlet x = crate::b::f();\nuse crate::{c, d::e};\nuse crate::{self};"
        ),
        BTreeSet::from(["a", "b", "c", "d"].map(String::from))
    );
    assert_eq!(
        server_code("use crate::a; // crate::b\n#[cfg(test)]\nmod tests {\n    use crate::c;\n}\n"),
        "use crate::a; "
    );
    let mut g = Graph::new();
    let edge = |g: &mut Graph, a: &str, b: &str| {
        g.entry(a.into()).or_default().entry(b.into()).or_default();
    };
    edge(&mut g, "api", "service");
    edge(&mut g, "service", "ranking");
    assert_eq!(find_cycle(&g), None);
    edge(&mut g, "ranking", "service");
    assert_eq!(
        find_cycle(&g),
        Some(vec!["service".to_owned(), "ranking".to_owned()])
    );
}
