//! The fuzz harness (proptest) of the server's decoders and contracts: each target tries [`cases`] inputs
//! (`RECSERVE_FUZZ_CASES`, default [`DEFAULT_CASES`]) and must give a value or a clear error for every one, never a
//! panic. The targets are beside the code they fuzz (`recall/tests.rs` here, `fuzz.rs` in the server crate).

use std::time::Instant;

use proptest::prop_assert;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::error::{ECHO_CHARS, MESSAGE_CHARS, ServiceError};

/// Inputs per target unless `RECSERVE_FUZZ_CASES` says otherwise.
pub const DEFAULT_CASES: u32 = 5_000;

/// Inputs per target.
pub fn cases() -> u32 {
    std::env::var("RECSERVE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// What a decoder made of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A value, checked against what it must hold.
    Accepted,
    /// A clear error ([`clear`]).
    Refused,
}

/// Runs `check` on [`cases`] inputs drawn from `strategy`; a panic or an error fails the test with the shrunk input.
/// Prints the target's name, inputs, how many were accepted, and the time (`cargo test fuzz -- --nocapture`).
pub fn run<S: Strategy>(
    name: &str,
    strategy: S,
    check: impl Fn(S::Value) -> Result<Outcome, TestCaseError>,
) {
    let cases = cases();
    let mut runner = TestRunner::new(Config {
        cases,
        // Nothing is written into the source tree; a failure prints its input, shrunk for at most 30 s.
        failure_persistence: None,
        max_shrink_time: 30_000,
        ..Config::default()
    });
    let accepted = std::cell::Cell::new(0usize);
    let started = Instant::now();
    let result = runner.run(&strategy, |input| {
        let outcome = check(input)?;
        if outcome == Outcome::Accepted {
            accepted.set(accepted.get() + 1);
        }
        Ok(())
    });
    eprintln!(
        "fuzz {name}: {cases} inputs ({} accepted) in {:.2} s",
        accepted.get(),
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("fuzz {name}: {e}");
    }
}

/// A clear error: a message, bounded however large the input (client text in it is cut, [`crate::error::elide`]).
pub fn clear(error: &ServiceError) -> Result<Outcome, TestCaseError> {
    let message = error.to_string();
    // The field (cut to ECHO_CHARS and a note) and the problem (cut to MESSAGE_CHARS and a note) of an invalid
    // input; every other message is shorter.
    let bound = 2 * ECHO_CHARS + MESSAGE_CHARS + 200;
    prop_assert!(!message.is_empty(), "an empty message for {error:?}");
    prop_assert!(
        message.chars().count() <= bound,
        "a message of {} characters: {message}",
        message.chars().count()
    );
    Ok(Outcome::Refused)
}
