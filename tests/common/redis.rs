//! The Redis tier's end-to-end helpers: the cluster scripts/test.sh started (`RECSERVE_TEST_REDIS`), or one of a
//! test's own (`scripts/redis-cluster.sh`); demo models moved to the Redis tier and published with
//! `python -m recserve_models publish`.

use std::path::Path;

use serde_json::Value;

use super::{config, copy_dir};

/// The cluster's nodes, as scripts/test.sh started it. No cluster is a failure, never a skip.
pub fn cluster() -> String {
    std::env::var("RECSERVE_TEST_REDIS").unwrap_or_else(|_| {
        panic!(
            "RECSERVE_TEST_REDIS is not set: run scripts/test.sh, or start a cluster with \
             `scripts/redis-cluster.sh start DIR` and export RECSERVE_TEST_REDIS=<the addresses it prints>"
        )
    })
}

/// Every table of the `model.toml` at `path` moved to the Redis tier with policy `unfetched`, except the tables
/// named in `overrides`, which get their own policy.
pub fn move_to_redis(path: &Path, unfetched: &str, overrides: &[(&str, &str)]) {
    let text = std::fs::read_to_string(path).expect("model.toml");
    let mut out = String::new();
    let mut table = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("name = ") {
            table = Some(name.trim_matches('"').to_owned());
        }
        out.push_str(line);
        out.push('\n');
        if line.starts_with("default_row = ") {
            let name = table.clone().unwrap_or_default();
            let policy = overrides
                .iter()
                .find(|(t, _)| *t == name)
                .map_or(unfetched, |(_, p)| *p);
            out.push_str(&format!("tier = \"redis\"\nunfetched = \"{policy}\"\n"));
        }
    }
    assert!(
        out.contains("tier = \"redis\""),
        "{} has no default_row lines",
        path.display()
    );
    std::fs::write(path, out).expect("write model.toml");
}

/// `python -m recserve_models publish DIR --redis NODES`, which must succeed.
pub fn publish(version_dir: &Path, nodes: &str) {
    let python = std::env::var("RECSERVE_TEST_PYTHON").unwrap_or_else(|_| "python".to_owned());
    let output = std::process::Command::new(&python)
        .args(["-m", "recserve_models", "publish"])
        .arg(version_dir)
        .args(["--redis", nodes])
        .env(
            "PYTHONPATH",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("models"),
        )
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python:?}: {e} (source scripts/env.sh)"));
    assert!(
        output.status.success(),
        "publish {} failed:\n{}\n{}",
        version_dir.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A repository with `name` copied from the demo's `demo` model, its tables moved to the Redis tier, published,
/// and its table file removed (so the server can only read the cluster).
pub fn redis_model(
    repository: &Path,
    demo: &str,
    name: &str,
    unfetched: &str,
    overrides: &[(&str, &str)],
) {
    redis_model_on(&cluster(), repository, demo, name, unfetched, overrides);
}

/// [`redis_model`] on the cluster of `nodes`.
pub fn redis_model_on(
    nodes: &str,
    repository: &Path,
    demo: &str,
    name: &str,
    unfetched: &str,
    overrides: &[(&str, &str)],
) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = repository.join(name);
    copy_dir(&root.join("models/demo").join(demo), &dir);
    let version = dir.join("1");
    move_to_redis(&version.join("model.toml"), unfetched, overrides);
    publish(&version, nodes);
    std::fs::remove_file(version.join("tables.safetensors")).expect("remove the table file");
}

pub fn redis_config(repository: &Path) -> recserve::config::Config {
    redis_config_on(&cluster(), repository)
}

pub fn redis_config_on(nodes: &str, repository: &Path) -> recserve::config::Config {
    config(repository, |a| {
        a.redis_url = nodes.split(',').map(str::to_owned).collect();
    })
}

/// The scores of a `/v1` rank answer, by candidate index.
pub fn scores(body: &Value) -> Vec<f64> {
    let scores = body["scores"].as_array().expect("scores");
    let mut out = vec![f64::NAN; scores.len()];
    for s in scores {
        out[s["index"].as_u64().expect("index") as usize] = s["score"].as_f64().expect("score");
    }
    out
}

/// A cluster of this test's own (`scripts/redis-cluster.sh`), stopped by PID when dropped.
pub struct OwnCluster {
    pub dir: tempfile::TempDir,
    pub nodes: String,
}

impl OwnCluster {
    pub fn start() -> OwnCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let output = std::process::Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/redis-cluster.sh"),
        )
        .arg("start")
        .arg(dir.path())
        .output()
        .expect("run scripts/redis-cluster.sh");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let nodes = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        OwnCluster { dir, nodes }
    }

    pub fn ports(&self) -> Vec<String> {
        self.nodes
            .split(',')
            .map(|n| n.rsplit(':').next().expect("port").to_owned())
            .collect()
    }

    pub fn cli(&self, port: &str, args: &[&str]) -> String {
        let output = std::process::Command::new("redis-cli")
            .args(["-p", port])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Kills node `port` by its PID (`kill -9`: no goodbye to the cluster).
    pub fn kill(&self, port: &str) {
        let pid =
            std::fs::read_to_string(self.dir.path().join(format!("{port}.pid"))).expect("pid file");
        let status = std::process::Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -9 {pid}");
    }

    /// Starts the killed node `port` again; it rejoins the cluster with its own cluster config.
    pub fn restart(&self, port: &str) {
        let output = std::process::Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/redis-cluster.sh"),
        )
        .arg("restart")
        .arg(self.dir.path())
        .arg(port)
        .output()
        .expect("run scripts/redis-cluster.sh restart");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        // Rejoined: it knows it is a replica now, synced with its master, and sees the cluster whole (until then
        // it may still claim the slots it held, and a client that asks it for the slot map is misled).
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_secs(20) {
            let replication = self.cli(port, &["info", "replication"]);
            if replication.contains("role:slave")
                && replication.contains("master_link_status:up")
                && self
                    .cli(port, &["cluster", "info"])
                    .contains("cluster_state:ok")
            {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("node {port} did not rejoin the cluster as a synced replica within 20 s");
    }

    /// The ports of the nodes that are masters now.
    pub fn masters(&self) -> Vec<String> {
        self.ports()
            .into_iter()
            .filter(|p| self.cli(p, &["role"]).starts_with("master"))
            .collect()
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/redis-cluster.sh"),
        )
        .arg("stop")
        .arg(self.dir.path())
        .status();
    }
}
