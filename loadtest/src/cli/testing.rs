//! Test support for the command-line modules: parsing a command line as `recload` would (with no `RECLOAD_*`
//! variable set, so that defaults are the documented ones), and the generated test repository, found as the
//! integration tests find it (`loadtest/tests/common`).

use std::path::Path;

use clap::Parser;

use super::{CeilingArgs, CheckArgs, Cli, Command, PlotArgs, RunArgs, SweepArgs};

#[path = "../../tests/common/mod.rs"]
mod common;
pub(super) use common::fixture_repo;

/// `recload <args>`, parsed; panics when clap refuses it.
pub(super) fn parse(args: &[&str]) -> Command {
    let set: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("RECLOAD_"))
        .collect();
    assert!(
        set.is_empty(),
        "unset {set:?}: these tests check the defaults"
    );
    match Cli::try_parse_from(std::iter::once("recload").chain(args.iter().copied())) {
        Ok(cli) => cli.command,
        Err(e) => panic!("recload {}: {e}", args.join(" ")),
    }
}

/// `$name(args)`: `recload $name <args>`, parsed as that subcommand's arguments.
macro_rules! subcommand {
    ($name:ident, $variant:ident, $args:ty) => {
        pub(super) fn $name(args: &[&str]) -> $args {
            match parse(&[&[stringify!($name)], args].concat()) {
                Command::$variant(a) => a,
                other => panic!("not a {}: {other:?}", stringify!($name)),
            }
        }
    };
}
subcommand!(run, Run, RunArgs);
subcommand!(sweep, Sweep, SweepArgs);
subcommand!(check, Check, CheckArgs);
subcommand!(plot, Plot, PlotArgs);
subcommand!(ceiling, Ceiling, Box<CeilingArgs>);

/// A path as a flag value.
pub(super) fn arg(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}
