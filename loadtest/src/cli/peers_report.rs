//! `recload peers-report`: the peer-benchmark section of docs/benchmarks.md, rendered from a
//! `loadtest/peers/run.sh` results directory and spliced into the document in place (or printed, for `--doc -`).

use std::path::Path;

use super::output::{io_error, write_out};
use super::{CliError, PeersReportArgs};
use crate::peers_doc;

pub(super) fn peers_report_command(args: &PeersReportArgs) -> Result<(), CliError> {
    let which = peers_doc::Section::new(args.section.as_deref())?;
    let section = peers_doc::render(&args.results, &which)?;
    if args.doc == Path::new("-") {
        print!("{section}");
        return Ok(());
    }
    let current = match std::fs::read_to_string(&args.doc) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmarks\n".to_owned(),
        Err(e) => return Err(io_error(&args.doc)(e)),
    };
    write_out(&args.doc, &peers_doc::splice(&current, &section, &which)?)?;
    println!("wrote the peer-benchmark section of {}", args.doc.display());
    Ok(())
}
