//! A local Redis Cluster of an example's own (`scripts/redis-cluster.sh`: 3 masters, 3 replicas on loopback ports),
//! stopped by PID when dropped, and `redis-cli` against one of its nodes. Shared by the Redis tier's examples.
#![allow(dead_code, reason = "each example that includes it uses part of it")]

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// `host:port` of every node.
    pub nodes: Vec<String>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/redis-cluster.sh")
}

impl Cluster {
    pub fn start() -> Result<Cluster, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new(script())
            .arg("start")
            .arg(dir.path())
            .output()
            .map_err(|e| format!("scripts/redis-cluster.sh: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let nodes = String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(',')
            .map(str::to_owned)
            .collect();
        Ok(Cluster { dir, nodes })
    }

    pub fn ports(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.rsplit(':').next().unwrap_or_default().to_owned())
            .collect()
    }

    /// The PID of node `port`, as the script recorded it.
    pub fn pid(&self, port: &str) -> Result<u32, String> {
        std::fs::read_to_string(self.dir.path().join(format!("{port}.pid")))
            .map_err(|e| e.to_string())?
            .trim()
            .parse()
            .map_err(|e| format!("{port}.pid: {e}"))
    }

    /// Starts the killed node `port` again (`scripts/redis-cluster.sh restart`).
    pub fn restart(&self, port: &str) -> Result<(), String> {
        let out = Command::new(script())
            .arg("restart")
            .arg(self.dir.path())
            .arg(port)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
    }
}

/// `redis-cli -p PORT ARGS...`'s output (empty when it could not run).
pub fn cli(port: &str, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", port])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}
