//! The server's loader and the toolchain's `check` must judge model repositories alike ("a model that passes
//! `check` loads"). `python -m recserve_models fixture` writes small valid and broken repositories with `check`'s
//! decision on each (`<fixture>/check-cases/cases.json`); this test loads every one of them with the server's own
//! code and requires the same decision, and a refusal that names the same file.

mod common;

use std::path::Path;

use common::{config, fixture_dir};
use recserve::service::{Limits, Service};
use recserve_core::metrics::Metrics;
use serde_json::Value;

/// The full start-up load: discovery, `model.toml`, tables, dense graph sessions and their warm-up.
fn load_like_the_server(root: &Path) -> Result<(), String> {
    let config = config(root, |_| {});
    let service = Service::new(
        Metrics::new(),
        Limits {
            max_body_bytes: config.max_body_bytes,
        },
    );
    service.load(&config).map_err(|e| e.to_string())
}

#[test]
fn the_server_and_check_decide_every_case_alike() {
    let dir = fixture_dir().join("check-cases");
    let text = std::fs::read_to_string(dir.join("cases.json")).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: regenerate the fixture (scripts/test.sh)",
            dir.display()
        )
    });
    let cases: Vec<Value> = serde_json::from_str(&text).expect("cases.json is JSON");
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let mut refused = 0;
    let mut mismatches = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let root = dir.join(name);
        let result = load_like_the_server(&root);
        let python = case["python"].as_str().expect("python");
        let server = if result.is_ok() { "load" } else { "refuse" };
        if server != python {
            mismatches.push(format!(
                "{name}: the server decided {server} ({result:?}), check decided {python} ({})",
                case["python_error"]
            ));
            continue;
        }
        if let Err(message) = &result {
            refused += 1;
            let blame = case["blame"].as_str().expect("blame");
            if !message.contains(blame) {
                mismatches.push(format!(
                    "{name}: the server's refusal does not name {blame:?}: {message}"
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert!(refused >= 30, "only {refused} cases were refused");
}
