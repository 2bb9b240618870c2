//! The latency-vs-throughput chart of one or more sweeps, as a self-contained SVG (text is left to the viewer's
//! fonts): p99 (solid, dots) and p50 (thin) against the achieved rate of each step, on a log latency axis, with
//! the SLAs as horizontal lines.

use plotters::prelude::*;

use crate::report::RunReport;
use crate::sweep::SweepReport;

/// A chart that could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot: no step of the given sweeps has a successful request")]
    Empty,
    #[error("drawing the chart failed: {0}")]
    Draw(String),
}

fn draw_error<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Colours of successive series: readable on white and distinct for colour-blind readers (Okabe–Ito).
const COLOURS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];

/// Achieved requests/s, p50 ms and p99 ms of one step.
type Point = (f64, f64, f64);

/// One sweep's points (runs that have a latency).
struct Series {
    name: String,
    /// One per run, by ascending offered rate (the sweep's order).
    line: Vec<Point>,
}

impl Series {
    fn of(sweep: &SweepReport) -> Series {
        let point = |s: &RunReport| s.latency_ms.map(|l| (s.achieved_rps, l.p50_ms, l.p99_ms));
        Series {
            name: sweep
                .label
                .clone()
                .unwrap_or_else(|| sweep.target.url.clone()),
            line: sweep.steps.iter().filter_map(point).collect(),
        }
    }
}

/// Draws `sweeps` into an SVG document titled `title`.
pub fn svg(title: &str, sweeps: &[SweepReport]) -> Result<String, PlotError> {
    let series: Vec<Series> = sweeps
        .iter()
        .map(Series::of)
        .filter(|s| !s.line.is_empty())
        .collect();
    let all = series.iter().flat_map(|s| s.line.iter());
    let (mut x_max, mut y_min, mut y_max) = (0.0f64, f64::INFINITY, 0.0f64);
    for &(x, p50, p99) in all {
        x_max = x_max.max(x);
        y_min = y_min.min(p50);
        y_max = y_max.max(p99);
    }
    if series.is_empty() {
        return Err(PlotError::Empty);
    }
    let slas: Vec<f64> = sweeps
        .first()
        .map(|s| s.sla.iter().map(|s| s.p99_ms).collect())
        .unwrap_or_default();
    for &sla in &slas {
        y_max = y_max.max(sla);
        y_min = y_min.min(sla);
    }
    // Room above the data (the axis is logarithmic) for the legend, so it never hides a point.
    let y_range = (y_min / 1.5).max(1e-3)..(y_max * 12.0);

    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (960, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            .build_cartesian_2d(0f64..x_max * 1.05, y_range.log_scale())
            .map_err(draw_error)?;
        chart
            .configure_mesh()
            .x_desc("achieved requests/s")
            .y_desc("latency (ms, log scale)")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v}"))
            .draw()
            .map_err(draw_error)?;
        for &sla in &slas {
            let grey = RGBColor(120, 120, 120);
            chart
                .draw_series(LineSeries::new(
                    [(0.0, sla), (x_max * 1.05, sla)],
                    grey.stroke_width(1),
                ))
                .map_err(draw_error)?
                .label(format!("SLA p99 ≤ {sla} ms"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey));
        }
        for (i, Series { name, line }) in series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            chart
                .draw_series(LineSeries::new(
                    line.iter().map(|&(x, _, p99)| (x, p99)),
                    colour.stroke_width(2),
                ))
                .map_err(draw_error)?
                .label(format!("{name} p99"))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(
                    line.iter()
                        .map(|&(x, _, p99)| Circle::new((x, p99), 3, colour.filled())),
                )
                .map_err(draw_error)?;
            chart
                .draw_series(LineSeries::new(
                    line.iter().map(|&(x, p50, _)| (x, p50)),
                    colour.mix(0.6).stroke_width(1),
                ))
                .map_err(draw_error)?
                .label(format!("{name} p50"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.mix(0.6)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(draw_error)?;
        root.present().map_err(draw_error)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(json: &str) -> SweepReport {
        serde_json::from_str(json).expect("sweep JSON")
    }

    #[test]
    fn draws_each_series_and_refuses_an_empty_chart() {
        let a = sweep(include_str!("../tests/data/sweep-a.json"));
        let mut b = a.clone();
        b.label = Some("peer".to_owned());
        let svg = svg("ranking, 100 candidates", &[a.clone(), b]).expect("drawn");
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        assert!(svg.contains("ranking, 100 candidates"));
        assert!(svg.contains("recserve p99") && svg.contains("peer p99"));
        assert!(svg.contains("SLA p99 ≤ 50 ms") && svg.contains("SLA p99 ≤ 200 ms"));
        // One dot per step with a latency, per series.
        let dots = svg.matches("<circle").count();
        assert_eq!(
            dots,
            2 * a.steps.iter().filter(|s| s.latency_ms.is_some()).count()
        );

        let mut empty = a;
        for s in &mut empty.steps {
            s.latency_ms = None;
        }
        assert!(matches!(super::svg("x", &[empty]), Err(PlotError::Empty)));
    }
}
