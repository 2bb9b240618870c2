//! Test support shared by recload's integration tests and, through a `#[path]` module, its unit tests: where the
//! generated test repository is (`python -m recserve_models fixture --out DIR`, which `scripts/test.sh` runs and
//! points `RECSERVE_TEST_FIXTURE` at; `target/test-fixture` when that is not set).

use std::path::{Path, PathBuf};

/// The test repository (the fixture's `repo` directory); panics, saying how to make it, when it is missing.
pub fn fixture_repo() -> PathBuf {
    let dir = std::env::var_os("RECSERVE_TEST_FIXTURE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-fixture"));
    let repo = dir.join("repo");
    assert!(
        repo.is_dir(),
        "no test repository at {}: run scripts/test.sh, which generates it, or set RECSERVE_TEST_FIXTURE",
        repo.display()
    );
    repo
}
