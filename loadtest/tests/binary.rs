//! The `recload` binary as a user runs it: flags read from `RECLOAD_*` variables when not given, a failed command
//! reported in one sentence on stderr with exit status 1, and clap's own refusals with status 2. Each case runs the
//! binary with only the variables it sets, and none reaches a server (nothing listens at port 1).

use std::process::Command;

const NOWHERE: &str = "http://127.0.0.1:1";

/// Exit status, stdout and stderr of `recload args` with only `vars` set.
fn recload(vars: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_recload"))
        .env_clear()
        .envs(vars.iter().copied())
        .args(args)
        .output()
        .expect("recload runs");
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("UTF-8 output");
    (out.status.code(), text(out.stdout), text(out.stderr))
}

#[test]
fn a_variable_stands_for_its_flag_and_errors_are_one_sentence() {
    let (code, stdout, stderr) = recload(
        &[("RECLOAD_MAX_ERROR_RATIO", "2"), ("RECLOAD_URL", NOWHERE)],
        &["sweep"],
    );
    assert_eq!(code, Some(1));
    assert_eq!(stdout, "");
    assert_eq!(stderr, "error: --max-error-ratio must be between 0 and 1\n");

    let (code, _, stderr) = recload(
        &[("RECLOAD_WORKLOAD", "recommend"), ("RECLOAD_USERS", "3")],
        &["run", "--rate", "1", "--url", NOWHERE],
    );
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "error: --pipeline is required for --workload recommend\n"
    );

    // A flag given on the command line wins over its variable.
    let (code, _, stderr) = recload(
        &[("RECLOAD_THREADS", "4")],
        &["run", "--rate", "1", "--url", NOWHERE, "--threads", "0"],
    );
    assert_eq!(code, Some(1));
    assert_eq!(stderr, "error: --threads must be at least 1\n");
}

#[test]
fn clap_refuses_a_bad_variable_as_it_refuses_a_bad_flag() {
    let (code, stdout, stderr) = recload(&[("RECLOAD_DURATION", "soon")], &["run", "--rate", "1"]);
    assert_eq!(code, Some(2));
    assert_eq!(stdout, "");
    assert!(
        stderr.starts_with(
            "error: invalid value 'soon' for '--duration <DURATION>': \"soon\" is not a duration like 10s or 500ms ("
        ),
        "{stderr}"
    );
}
