//! `recload plot`: one latency-vs-throughput chart (SVG) of the sweep reports named on the command line.

use super::output::{io_error, write_out};
use super::{CliError, PlotArgs};
use crate::plot;
use crate::sweep::{SWEEP_SCHEMA, SweepReport};

pub(super) fn plot_command(args: &PlotArgs) -> Result<(), CliError> {
    let sweeps = args
        .sweeps
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(io_error(path))?;
            serde_json::from_str::<SweepReport>(&text).map_err(|e| CliError::Describe {
                what: path.display().to_string(),
                problem: format!("not a {SWEEP_SCHEMA} report: {e}"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    write_out(&args.out, &plot::svg(&args.title, &sweeps)?)
}
