//! `recserve check-repository` must judge model repositories as the server's start-up load does ("a model that
//! passes the check loads"), and as the format document says. `python -m recserve_models fixture` writes small
//! valid and broken repositories with the decision the format document intends for each, and the file or
//! directory a refusal must name (`<fixture>/check-cases/cases.json`); this test runs the `check-repository`
//! subcommand of the built binary on every one of them, loads each with the server's own start-up code, and
//! requires both to decide as intended, with a refusal that names the file at fault.

mod common;

use std::path::Path;
use std::process::Command;

use common::{config, fixture_dir, ort_library};
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

/// `recserve check-repository --json ROOT`: the refusals it reports (none when every version loads).
fn check_repository(root: &Path) -> Result<(), String> {
    let output = Command::new(env!("CARGO_BIN_EXE_recserve"))
        .arg("check-repository")
        .arg("--json")
        .arg("--ort-library")
        .arg(ort_library())
        .arg(root)
        .env_remove("RECSERVE_CONFIG")
        .output()
        .expect("run recserve check-repository");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: check-repository did not print JSON ({e}); stderr: {stderr}",
            root.display()
        )
    });
    let mut problems: Vec<String> = report["error"]
        .as_str()
        .map(str::to_owned)
        .into_iter()
        .collect();
    for model in report["models"].as_object().expect("models").values() {
        for version in model["versions"].as_object().expect("versions").values() {
            problems.extend(version["error"].as_str().map(str::to_owned));
        }
    }
    let code = output.status.code();
    match (problems.is_empty(), code) {
        (true, Some(0)) => Ok(()),
        (false, Some(1)) => Err(problems.join("\n")),
        _ => panic!(
            "{}: check-repository exited with {code:?} reporting {problems:?}; stderr: {stderr}",
            root.display()
        ),
    }
}

#[test]
fn check_repository_and_the_server_decide_every_case_as_intended() {
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
        let intended = case["intended"].as_str().expect("intended");
        let checked = check_repository(&root);
        let loaded = load_like_the_server(&root);
        let decision = |r: &Result<(), String>| if r.is_ok() { "load" } else { "refuse" };
        if decision(&checked) != intended || decision(&loaded) != intended {
            mismatches.push(format!(
                "{name}: intended {intended}, check-repository decided {} ({checked:?}), the server {} ({loaded:?})",
                decision(&checked),
                decision(&loaded)
            ));
            continue;
        }
        if let (Err(check_message), Err(load_message)) = (&checked, &loaded) {
            refused += 1;
            let blame = case["blame"].as_str().expect("blame");
            for (who, message) in [
                ("check-repository's", check_message),
                ("the server's", load_message),
            ] {
                if !message.contains(blame) {
                    mismatches.push(format!(
                        "{name}: {who} refusal does not name {blame:?}: {message}"
                    ));
                }
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    assert!(refused >= 30, "only {refused} cases were refused");
}
