//! The executor threads' priority, read from /proc. In a test binary of its own: the test reads every thread of its
//! process, and a server started by another test running beside it would show threads at other nice values.

mod common;

use common::{TestServer, config, fixture_repo};

/// The executor threads run at `--executor-niceness` (here 7), below the transport's threads (nice 0): this test
/// process hosts the server, so its threads are ours to inspect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_threads_run_at_the_configured_niceness() {
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.executor_niceness = Some(7);
        a.executors = Some(2);
    }))
    .await;
    let mut executors = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("task").path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        // Field 19 of stat is the nice value; the command (field 2) is in parentheses and has no spaces here.
        let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
        let after_comm = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
        let nice: i32 = after_comm
            .split(' ')
            .nth(16)
            .and_then(|v| v.parse().ok())
            .unwrap_or(i32::MIN);
        if name.starts_with("exec-") {
            executors.push((name.trim().to_owned(), nice));
        } else if name.starts_with("tokio-runtime") {
            assert_eq!(nice, 0, "transport thread {name:?}");
        }
    }
    // Two executors per ranking model, and each recall model's.
    assert!(executors.len() >= 2, "{executors:?}");
    assert!(executors.iter().all(|(_, n)| *n == 7), "{executors:?}");
    drop(server);
}
