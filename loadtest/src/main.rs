//! The `recload` binary: parse the command line, run it, report an error in one sentence.

use std::process::ExitCode;

use clap::Parser;
use recload::cli::{Cli, execute};

fn main() -> ExitCode {
    match execute(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
    }
}
