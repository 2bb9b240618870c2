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

#[cfg(test)]
mod tests {
    use super::super::testing::{arg, plot};
    use super::*;

    const SWEEP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/sweep-a.json");

    #[test]
    fn sweeps_are_drawn_into_one_svg() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("charts/sweep.svg");
        plot_command(&plot(&["--out", arg(&out), SWEEP, SWEEP])).expect("drawn");
        let svg = std::fs::read_to_string(&out).expect("written");
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    }

    #[test]
    fn a_file_that_is_not_a_sweep_report_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = dir.path().join("run.json");
        std::fs::write(&run, r#"{"schema": "recload.run/v1"}"#).expect("write");
        let out = dir.path().join("chart.svg");
        let err = plot_command(&plot(&["--out", arg(&out), arg(&run)])).expect_err("not a sweep");
        assert!(
            err.to_string().starts_with(&format!(
                "{}: not a recload.sweep/v1 report: ",
                run.display()
            )),
            "{err}"
        );
        assert!(!out.exists(), "nothing drawn");
    }
}
