//! The executor threads' priority, read from /proc. In a test binary of its own: the test reads every thread of its
//! process, and a server started by another test running beside it would show threads at other nice values.

mod common;

use common::{TestServer, config, fixture_dir, fixture_repo};

/// The tests read every thread of the process: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every thread of this process whose name starts with `prefix`, with its nice value and scheduling policy
/// (0 `SCHED_OTHER`, 5 `SCHED_IDLE`).
fn threads(prefix: &str) -> Vec<(String, i32, i32)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("task").path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        // The command (field 2) is in parentheses and has no spaces here.
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let after_comm = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
        // Fields 19 and 41 of stat: the nice value and the policy (indices 16 and 38 after the command).
        let field = |i: usize| -> i32 {
            after_comm
                .split(' ')
                .nth(i)
                .and_then(|v| v.parse().ok())
                .unwrap_or(i32::MIN)
        };
        if name.starts_with(prefix) {
            found.push((name.trim().to_owned(), field(16), field(38)));
        }
    }
    found
}

/// The executor threads run at `--executor-niceness` (here 7), below the transport's threads (nice 0): this test
/// process hosts the server, so its threads are ours to inspect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_threads_run_at_the_configured_niceness() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.executor_niceness = Some(7);
        a.executors = Some(2);
    }))
    .await;
    let executors: Vec<(String, i32)> = threads("exec-")
        .into_iter()
        .map(|(name, nice, _)| (name, nice))
        .collect();
    for (name, nice, _) in threads("tokio-runtime") {
        assert_eq!(nice, 0, "transport thread {name:?}");
    }
    // Two executors per ranking model, and each recall model's.
    assert!(executors.len() >= 2, "{executors:?}");
    assert!(executors.iter().all(|(_, n)| *n == 7), "{executors:?}");
    drop(server);
}

/// A shadow version's executors run at nice 19 under `SCHED_IDLE` (once they take their first copy), the
/// answering version's at `--executor-niceness` under `SCHED_OTHER`: on a busy core the shadow yields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_versions_executors_run_at_the_lowest_priority() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("recserve.toml");
    let pipelines =
        std::fs::read_to_string(fixture_dir().join("recserve.toml")).expect("fixture config");
    std::fs::write(
        &file,
        format!(
            "{pipelines}\n[models.deepfm-fp32]\nversions = {{ latest = 2 }}\n\
             shadow = {{ version = 1, percent = 100 }}\n[models.deepfm-fp32.traffic]\n2 = 1\n"
        ),
    )
    .expect("write config");
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.executor_niceness = Some(7);
        a.executors = Some(1);
        a.config = Some(file);
    }))
    .await;
    let request = common::cases()["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["model"] == "deepfm-fp32" && c["version"] == 1)
        .expect("a case")["request"]
        .clone();
    for _ in 0..3 {
        let (status, _) = server.post("/v1/models/deepfm-fp32/rank", &request).await;
        assert_eq!(status, 200);
    }
    // Thread names are cut at 15 bytes: both versions' single executor are `exec-deepfm-fp3`.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut nice: Vec<(i32, i32)> = threads("exec-deepfm-fp3")
            .into_iter()
            .map(|(_, nice, policy)| (nice, policy))
            .collect();
        nice.sort_unstable();
        if nice == [(7, 0), (19, 5)] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "executors of deepfm-fp32 at (nice, policy) {nice:?}, not [(7, 0), (19, 5)]"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    drop(server);
}
