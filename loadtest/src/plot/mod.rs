//! The charts, drawn with plotters as self-contained SVG (text is left to the viewer's fonts). A sweep's chart
//! ([`svg`]): p99 (thick, dots) and p50 (thin) against the achieved rate of each step, on a logarithmic latency
//! axis labelled at 1, 2 and 5 of every decade, the SLAs as dashed red lines labelled at their ends, and at each
//! SLA the highest rate that met it, marked on the chart and written in the subtitle beside the model, the
//! candidates per request and the time per step. A run's chart ([`run::svg`]): its latency percentiles as bars
//! against the SLAs, with the verdict in the subtitle. Both have a legend above the plot, where it hides no data.

pub mod run;
mod ticks;

use plotters::coord::Shift;
use plotters::coord::combinators::WithKeyPoints;
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub use ticks::{linear_ticks, log_ticks, tick_label, tick_label_exact};

use crate::report::RunReport;
use crate::sweep::{SlaResult, SweepReport};
use crate::target::TargetInfo;
use crate::workload::WorkloadInfo;

/// A chart that could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot: no step of the given sweeps has a successful request")]
    Empty,
    #[error("nothing to plot: no request of the run succeeded")]
    EmptyRun,
    #[error("drawing the chart failed: {0}")]
    Draw(String),
}

fn draw_error<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Colours of successive series: readable on white and distinct for colour-blind readers (Okabe–Ito, without its
/// vermillion, which is too close to the SLA red).
const COLOURS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];
/// SLA lines and their labels: a colour no series uses.
const SLA: RGBColor = RGBColor(200, 16, 46);
/// Grid lines: light, so the data and the SLA lines stand out.
const GRID: RGBColor = RGBColor(221, 221, 221);
/// Axes and text.
const INK: RGBColor = RGBColor(34, 34, 34);
/// Dash and gap of the SLA lines, and of the dotted markers, in pixels.
const SLA_DASH: (u32, u32) = (8, 5);
const MARKER_DASH: (u32, u32) = (2, 3);

const WIDTH: u32 = 960;
const PLOT_HEIGHT: u32 = 420;
/// Room right of the plot for the SLA labels.
const RIGHT: u32 = 96;
/// Font sizes as plotters takes them (it writes `size / 1.24` pixels into the SVG).
const TITLE_SIZE: f64 = 25.0;
const SUBTITLE_SIZE: f64 = 16.0;
const LABEL_SIZE: f64 = 15.0;
/// Pixels from one subtitle line to the next.
const SUBTITLE_LINE: u32 = 18;
/// The legend's inner margin, and its line height in font sizes (plotters' multi-line text).
const LEGEND_MARGIN: u32 = 5;
const LEGEND_LINE: f64 = 1.25;

/// The `#RRGGBB` plotters writes for `c`.
#[cfg(test)]
fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

fn font(size: f64, colour: RGBColor) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&colour)
}

/// The drawing area of a chart being written.
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
/// A latency axis: logarithmic, with its ticks as key points.
type LatencyAxis = WithKeyPoints<LogCoord<f64>>;
type Chart<'a, 'b, X> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, LatencyAxis>>;

/// Pixels the legend of `entries` lines takes above the plot, with a gap under it.
fn legend_height(entries: usize) -> u32 {
    (entries as f64 * LEGEND_LINE * LABEL_SIZE).ceil() as u32 + 2 * LEGEND_MARGIN + 10
}

/// The height of a chart with `lines` subtitle lines and a legend of `entries` lines.
fn chart_height(lines: usize, entries: usize) -> u32 {
    header_height(lines) + legend_height(entries) + PLOT_HEIGHT + 80
}

fn header_height(lines: usize) -> u32 {
    44 + SUBTITLE_LINE * lines as u32 + 10
}

/// Draws the title and the subtitle lines at the top of `root`; returns the band below them for a legend of
/// `entries` lines, and the area below that for the chart.
fn header<'a>(
    root: &Area<'a>,
    title: &str,
    lines: &[String],
    entries: usize,
) -> Result<(Area<'a>, Area<'a>), PlotError> {
    let centre = (WIDTH / 2) as i32;
    let top = Pos::new(HPos::Center, VPos::Top);
    root.draw(&Text::new(
        title,
        (centre, 12),
        font(TITLE_SIZE, INK).pos(top),
    ))
    .map_err(draw_error)?;
    for (i, line) in lines.iter().enumerate() {
        root.draw(&Text::new(
            line.as_str(),
            (centre, 44 + (SUBTITLE_LINE * i as u32) as i32),
            font(SUBTITLE_SIZE, INK).pos(top),
        ))
        .map_err(draw_error)?;
    }
    let below = root.split_vertically(header_height(lines.len())).1;
    Ok(below.split_vertically(legend_height(entries)))
}

/// A whole chart as SVG text: the title, the subtitle `lines` and the legend's `entries` at the top, then `draw`
/// on the area below them.
fn canvas(
    title: &str,
    lines: &[String],
    entries: &[(Glyph, String)],
    draw: impl FnOnce(&Area<'_>) -> Result<(), PlotError>,
) -> Result<String, PlotError> {
    let mut out = String::new();
    {
        let size = (WIDTH, chart_height(lines.len(), entries.len()));
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error)?;
        let (band, area) = header(&root, title, lines, entries.len())?;
        legend(&band, entries)?;
        draw(&area)?;
        root.present().map_err(draw_error)?;
    }
    Ok(out)
}

/// A chart on `area` over `x` and the latency `y_ticks` (from [`log_ticks`]): its grid (light grey, at the key points only), axes, tick labels and axis titles.
/// `x_labels`: how many labels x has at most; `x_grid`: whether x has grid lines too.
fn chart<'a, 'b, X, XT>(
    area: &'a Area<'b>,
    (x, x_labels, x_grid): (X, usize, bool),
    y_ticks: &[f64],
    (x_desc, x_label): (&str, &dyn Fn(&XT) -> String),
) -> Result<Chart<'a, 'b, X>, PlotError>
where
    X: Ranged<ValueType = XT> + ValueFormatter<XT>,
    XT: std::fmt::Debug + Clone,
{
    let (lo, hi) = (y_ticks[0], *y_ticks.last().expect("log ticks"));
    let y = (lo..hi).log_scale().with_key_points(y_ticks.to_vec());
    let mut chart = ChartBuilder::on(area)
        .margin_left(12)
        .margin_right(RIGHT)
        .margin_bottom(12)
        .x_label_area_size(52)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
        .map_err(draw_error)?;
    let y_label = |v: &f64| tick_label(*v);
    let mut mesh = chart.configure_mesh();
    mesh.bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .axis_style(INK)
        .label_style(font(LABEL_SIZE, INK))
        .axis_desc_style(font(SUBTITLE_SIZE, INK))
        .x_desc(x_desc)
        .y_desc("latency (ms, log scale)")
        .x_labels(x_labels)
        .x_label_formatter(x_label)
        .y_label_formatter(&y_label);
    if !x_grid {
        mesh.disable_x_mesh();
    }
    mesh.draw().map_err(draw_error)?;
    Ok(chart)
}

/// How an entry of a legend is drawn.
#[derive(Clone, Copy)]
enum Glyph {
    /// A line of this colour and width with a dot of this radius (a latency series).
    LineDot(RGBColor, u32, u32),
    /// A dashed line: dash and gap in pixels.
    Dashed(RGBColor, (u32, u32)),
    /// A bar's colour.
    Bar(RGBColor),
}

/// The legend, on `band` above the plot, where it hides no data. Plotters draws a legend inside a chart's
/// plotting area, so the legend is a chart of its own over the band: no axes, one empty series per entry.
fn legend(band: &Area<'_>, entries: &[(Glyph, String)]) -> Result<(), PlotError> {
    let mut chart = ChartBuilder::on(band)
        .margin_left(84)
        .build_cartesian_2d(0.0..1.0, 0.0..1.0)
        .map_err(draw_error)?;
    for (glyph, text) in entries {
        let entry = chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), u32>>())
            .map_err(draw_error)?
            .label(text.as_str());
        match *glyph {
            Glyph::LineDot(colour, width, r) => entry.legend(move |at| {
                EmptyElement::at(at)
                    + PathElement::new([(0, 0), (24, 0)], colour.stroke_width(width))
                    + Circle::new((12, 0), r, colour.filled())
            }),
            Glyph::Dashed(colour, (dash, gap)) => entry.legend(move |(x, y)| {
                DashedPathElement::new([(x, y), (x + 24, y)], dash, gap, colour.stroke_width(2))
            }),
            Glyph::Bar(colour) => entry.legend(move |(x, y)| {
                Rectangle::new([(x + 6, y - 6), (x + 18, y + 6)], colour.filled())
            }),
        };
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .margin(LEGEND_MARGIN)
        .label_font(font(LABEL_SIZE, INK))
        .background_style(WHITE)
        .border_style(TRANSPARENT)
        .draw()
        .map_err(draw_error)
}

/// The SLAs as horizontal lines across the plot, dashed in [`SLA`], each labelled at its right end (`SLA 5 ms`);
/// [`Glyph::Dashed`] with [`SLA_DASH`] in [`SLA`] names them in a legend.
fn sla_lines<X, XT>(chart: &mut Chart<'_, '_, X>, slas_ms: &[f64]) -> Result<(), PlotError>
where
    X: Ranged<ValueType = XT> + ValueFormatter<XT>,
    XT: std::fmt::Debug + Clone + 'static,
{
    let x = chart.x_range();
    let label_style = font(LABEL_SIZE, SLA).pos(Pos::new(HPos::Left, VPos::Center));
    for &sla in slas_ms {
        chart
            .draw_series(DashedLineSeries::new(
                [(x.start.clone(), sla), (x.end.clone(), sla)],
                SLA_DASH.0,
                SLA_DASH.1,
                SLA.stroke_width(2),
            ))
            .map_err(draw_error)?;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x.end.clone(), sla))
                    + Text::new(
                        format!("SLA {} ms", tick_label_exact(sla)),
                        (6, 0),
                        label_style.clone(),
                    ),
            ))
            .map_err(draw_error)?;
    }
    Ok(())
}

/// The rate axis of a sweep chart: from 0 to the first tick at or above `x_max`, and how many labels it takes
/// to label every tick.
fn rate_axis(x_max: f64) -> (RangedCoordf64, usize, bool) {
    let ticks = linear_ticks(x_max);
    let end = *ticks.last().expect("linear ticks");
    ((0.0..end).into(), ticks.len(), true)
}

/// The model a workload loads: the KServe v2 model, else the name in the path (`/v1/models/NAME/rank`), else the
/// path.
pub fn model_of(workload: &WorkloadInfo, target: &TargetInfo) -> String {
    if let Some(model) = &target.v2_model {
        return model.clone();
    }
    let mut parts = workload.path.split('/');
    while let Some(part) = parts.next() {
        if part == "models"
            && let Some(name) = parts.next().filter(|n| !n.is_empty())
        {
            return name.to_owned();
        }
    }
    workload.path.clone()
}

/// What each request asks: `rank, 100 candidates per request` or `recall, k = 100`.
pub fn request_of(workload: &WorkloadInfo) -> String {
    match (workload.candidates, workload.k) {
        (Some(n), _) => format!("{}, {n} candidates per request", workload.kind),
        (None, Some(k)) => format!("{}, k = {k}", workload.kind),
        (None, None) => workload.kind.clone(),
    }
}

/// A rate as the chart writes it: `1,250/s`.
fn rate(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out + "/s"
}

/// One SLA's answer from a sweep's result: `p99 ≤ 5 ms: 1,200/s`, `p99 ≤ 5 ms: ≥ 3,000/s (never missed)` when
/// every rate met it, `p99 ≤ 5 ms: missed from the lowest rate, 100/s` when none did.
pub fn sla_answer(s: &SlaResult) -> String {
    let bound = format!("p99 ≤ {} ms", tick_label_exact(s.p99_ms));
    match (s.max_rps, s.first_failing_rps) {
        (Some(max), Some(_)) => format!("{bound}: {}", rate(max)),
        (Some(max), None) => format!("{bound}: ≥ {} (never missed)", rate(max)),
        (None, Some(fail)) => format!("{bound}: missed from the lowest rate, {}", rate(fail)),
        (None, None) => format!("{bound}: no rate run"),
    }
}

/// The subtitle's first line: what was measured and how long each step lasted.
pub fn subtitle(sweep: &SweepReport) -> String {
    let mut duration = format!("{} s per step", tick_label_exact(sweep.duration_s));
    if sweep.min_requests > 0 {
        duration.push_str(&format!(" (≥ {} requests)", sweep.min_requests));
    }
    format!(
        "model {} · {} · {duration} · {} · {} connections",
        model_of(&sweep.workload, &sweep.target),
        request_of(&sweep.workload),
        sweep.target.protocol,
        sweep.connections
    )
}

/// Achieved requests/s, p50 ms and p99 ms of one step.
type Point = (f64, f64, f64);

/// One sweep's points (runs that have a latency).
struct Series<'a> {
    name: String,
    sweep: &'a SweepReport,
    /// One per run, by ascending offered rate (the sweep's order).
    line: Vec<Point>,
}

impl Series<'_> {
    fn of(sweep: &SweepReport) -> Series<'_> {
        let point = |s: &RunReport| s.latency_ms.map(|l| (s.achieved_rps, l.p50_ms, l.p99_ms));
        Series {
            name: sweep
                .label
                .clone()
                .unwrap_or_else(|| sweep.target.url.clone()),
            sweep,
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
    if series.is_empty() {
        return Err(PlotError::Empty);
    }
    let slas: Vec<f64> = series[0].sweep.sla.iter().map(|s| s.p99_ms).collect();
    let (mut x_max, mut y_lo, mut y_hi) = (0.0f64, f64::INFINITY, 0.0f64);
    for &(x, p50, p99) in series.iter().flat_map(|s| s.line.iter()) {
        x_max = x_max.max(x);
        y_lo = y_lo.min(p50);
        y_hi = y_hi.max(p99);
    }
    for &sla in &slas {
        y_lo = y_lo.min(sla);
        y_hi = y_hi.max(sla);
    }
    let y_ticks = log_ticks(y_lo.max(1e-3), y_hi.max(1e-3));

    let mut lines = vec![subtitle(series[0].sweep)];
    for s in &series {
        let answers: Vec<String> = s.sweep.sla.iter().map(sla_answer).collect();
        if !answers.is_empty() {
            lines.push(format!(
                "{}: highest rate with {}",
                s.name,
                answers.join(" · ")
            ));
        }
    }
    let markers = series
        .iter()
        .any(|s| s.sweep.sla.iter().any(|r| r.max_rps.is_some()));
    let mut entries = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        entries.push((Glyph::LineDot(colour, 3, 4), format!("{} p99", s.name)));
        entries.push((Glyph::LineDot(colour, 1, 2), format!("{} p50", s.name)));
    }
    if !slas.is_empty() {
        entries.push((Glyph::Dashed(SLA, SLA_DASH), "SLA (p99 bound)".to_owned()));
    }
    if markers {
        entries.push((
            Glyph::Dashed(INK, MARKER_DASH),
            "highest rate that met the SLA".to_owned(),
        ));
    }

    canvas(title, &lines, &entries, |area| {
        let x_label = |v: &f64| format!("{v:.0}");
        let mut chart = chart(
            area,
            rate_axis(x_max),
            &y_ticks,
            ("achieved requests/s", &x_label),
        )?;
        sla_lines(&mut chart, &slas)?;
        let bottom = y_ticks[0];
        for (i, s) in series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            // Where each SLA's answer lies: the achieved rate of the run at its highest passing rate.
            for r in &s.sweep.sla {
                let (Some(max), Some(achieved)) = (r.max_rps, r.achieved_rps) else {
                    continue;
                };
                chart
                    .draw_series(DashedLineSeries::new(
                        [(achieved, bottom), (achieved, r.p99_ms)],
                        MARKER_DASH.0,
                        MARKER_DASH.1,
                        colour.stroke_width(1),
                    ))
                    .map_err(draw_error)?;
                chart
                    .draw_series(std::iter::once(
                        EmptyElement::at((achieved, r.p99_ms))
                            + Text::new(
                                format!("{} ms: {}", tick_label_exact(r.p99_ms), rate(max)),
                                (-4, -5),
                                font(LABEL_SIZE, colour).pos(Pos::new(HPos::Right, VPos::Bottom)),
                            ),
                    ))
                    .map_err(draw_error)?;
            }
            for (percentile, width, r) in [(0, 1, 2), (1, 3, 4)] {
                let at = |p: &Point| (p.0, if percentile == 0 { p.1 } else { p.2 });
                chart
                    .draw_series(LineSeries::new(
                        s.line.iter().map(at),
                        colour.stroke_width(width),
                    ))
                    .map_err(draw_error)?;
                chart
                    .draw_series(
                        s.line
                            .iter()
                            .map(|p| Circle::new(at(p), r, colour.filled())),
                    )
                    .map_err(draw_error)?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn sweep(json: &str) -> SweepReport {
        serde_json::from_str(json).expect("sweep JSON")
    }

    /// One element of the SVG plotters wrote: its tag, attributes and, for a text, its content.
    #[derive(Debug)]
    pub(crate) struct Element {
        pub tag: String,
        attrs: Vec<(String, String)>,
        pub text: String,
    }

    impl Element {
        pub fn attr(&self, name: &str) -> Option<&str> {
            self.attrs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }

        pub fn num(&self, name: &str) -> f64 {
            let v = self
                .attr(name)
                .unwrap_or_else(|| panic!("{name} of {self:?}"));
            v.parse().unwrap_or_else(|_| panic!("{name} of {self:?}"))
        }

        /// The points of a polyline.
        pub fn points(&self) -> Vec<(f64, f64)> {
            self.attr("points")
                .unwrap_or_default()
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').expect("x,y");
                    (x.parse().expect("x"), y.parse().expect("y"))
                })
                .collect()
        }
    }

    fn unescape(s: &str) -> String {
        s.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&")
    }

    /// Every element of `svg`, in order. Plotters writes one element a line, a text's content on the line after
    /// its opening tag.
    pub(crate) fn elements(svg: &str) -> Vec<Element> {
        let mut out = Vec::new();
        let mut lines = svg.lines();
        while let Some(line) = lines.next() {
            let Some(rest) = line.trim().strip_prefix('<') else {
                continue;
            };
            if rest.starts_with(['/', '?', '!']) {
                continue;
            }
            let end = rest.find([' ', '>', '/']).unwrap_or(rest.len());
            let tag = rest[..end].to_owned();
            let (mut attrs, mut s) = (Vec::new(), &rest[end..]);
            while let Some(eq) = s.find("=\"") {
                let after = &s[eq + 2..];
                let close = after.find('"').expect("a closing quote");
                attrs.push((s[..eq].trim().to_owned(), unescape(&after[..close])));
                s = &after[close + 1..];
            }
            let text = if tag == "text" {
                unescape(lines.next().unwrap_or_default())
            } else {
                String::new()
            };
            out.push(Element { tag, attrs, text });
        }
        out
    }

    /// The texts of `svg`, in order.
    pub(crate) fn texts(svg: &str) -> Vec<Element> {
        elements(svg)
            .into_iter()
            .filter(|e| e.tag == "text")
            .collect()
    }

    /// The strokes (lines and polylines) of `svg` in `colour`, as their points.
    pub(crate) fn strokes(svg: &str, colour: RGBColor) -> Vec<Vec<(f64, f64)>> {
        elements(svg)
            .iter()
            .filter(|e| e.attr("stroke") == Some(hex(colour).as_str()))
            .map(|e| match e.tag.as_str() {
                "line" => vec![(e.num("x1"), e.num("y1")), (e.num("x2"), e.num("y2"))],
                _ => e.points(),
            })
            .collect()
    }

    /// The numeric texts anchored at their end: the latency axis' labels.
    pub(crate) fn y_labels(svg: &str) -> Vec<f64> {
        texts(svg)
            .iter()
            .filter(|t| t.attr("text-anchor") == Some("end"))
            .filter_map(|t| t.text.parse().ok())
            .collect()
    }

    /// Checks the SLA lines of `svg`: labelled `labels` at their right ends in the SLA red, each a row of short
    /// red dashes across the plot at its label's height, and no other red stroke but the legend's dashes.
    pub(crate) fn assert_sla_lines(svg: &str, labels: &[&str]) {
        let red: Vec<Element> = texts(svg)
            .into_iter()
            .filter(|t| t.attr("fill") == Some(hex(SLA).as_str()))
            .collect();
        assert_eq!(
            red.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
            labels
        );
        let dashes = strokes(svg, SLA);
        for d in &dashes {
            let (first, last) = (d[0], d[d.len() - 1]);
            assert!(
                d.iter().all(|p| p.1 == first.1) && last.0 - first.0 <= f64::from(SLA_DASH.0) + 1.0,
                "an SLA-red stroke that is not a dash: {d:?}"
            );
        }
        let legend_dashes = dashes.len()
            - red
                .iter()
                .map(|label| {
                    let at: Vec<_> = dashes.iter().filter(|d| d[0].1 == label.num("y")).collect();
                    let left = at.iter().map(|d| d[0].0).fold(f64::INFINITY, f64::min);
                    let right = at.iter().map(|d| d[d.len() - 1].0).fold(0.0, f64::max);
                    assert!(at.len() >= 40, "{}: {} dashes", label.text, at.len());
                    // From the latency axis to the label.
                    assert!(
                        left < 100.0 && right > label.num("x") - 20.0,
                        "{left}..{right}"
                    );
                    at.len()
                })
                .sum::<usize>();
        assert!(
            legend_dashes <= 3,
            "{legend_dashes} SLA-red strokes away from the SLAs"
        );
    }

    #[test]
    fn draws_each_series_and_refuses_an_empty_chart() {
        let a = sweep(include_str!("../../tests/data/sweep-a.json"));
        let mut b = a.clone();
        b.label = Some("peer".to_owned());
        let svg = svg("ranking, 100 candidates", &[a.clone(), b]).expect("drawn");
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        assert!(svg.trim_end().ends_with("</svg>"));
        let texts = texts(&svg);
        assert_eq!(texts[0].text, "ranking, 100 candidates");
        for name in ["recserve p99", "recserve p50", "peer p99", "peer p50"] {
            assert!(texts.iter().any(|t| t.text == name), "{name}");
        }
        // One dot per step with a latency, per series and percentile, and one in the legend.
        let with_latency = a.steps.iter().filter(|s| s.latency_ms.is_some()).count();
        let circles = elements(&svg);
        for colour in &COLOURS[..2] {
            for r in ["4", "2"] {
                let dots = circles
                    .iter()
                    .filter(|e| e.tag == "circle" && e.attr("r") == Some(r))
                    .filter(|e| e.attr("fill") == Some(hex(*colour).as_str()))
                    .count();
                assert_eq!(dots, with_latency + 1, "r {r}, {}", hex(*colour));
            }
        }

        let mut empty = a;
        for s in &mut empty.steps {
            s.latency_ms = None;
        }
        assert!(matches!(super::svg("x", &[empty]), Err(PlotError::Empty)));
    }

    #[test]
    fn sla_lines_are_red_dashed_labelled_and_unlike_the_grid() {
        let a = sweep(include_str!("../../tests/data/sweep-a.json"));
        let svg = svg("t", std::slice::from_ref(&a)).expect("drawn");
        assert_sla_lines(&svg, &["SLA 50 ms", "SLA 200 ms"]);
        // The grid: a light grey line across the plot at every latency label.
        let grid: Vec<_> = strokes(&svg, GRID)
            .into_iter()
            .filter(|g| g[0].1 == g[g.len() - 1].1 && g[g.len() - 1].0 - g[0].0 > 600.0)
            .collect();
        assert_eq!(grid.len(), y_labels(&svg).len(), "{grid:?}");
        assert!(COLOURS.iter().all(|c| *c != SLA) && GRID != SLA);
    }

    #[test]
    fn the_latency_axis_labels_every_decade_at_one_two_and_five_around_p50_and_p99() {
        let a = sweep(include_str!("../../tests/data/sweep-a.json"));
        let svg = svg("t", std::slice::from_ref(&a)).expect("drawn");
        let labels = y_labels(&svg);
        let lowest_p50 = a
            .steps
            .iter()
            .filter_map(|s| s.latency_ms.map(|l| l.p50_ms))
            .fold(f64::INFINITY, f64::min);
        // A labelled tick at or below the lowest p50 and one at or above the highest SLA, none more than 2.5×
        // from the next.
        assert!(labels[0] <= lowest_p50, "{labels:?} vs p50 {lowest_p50}");
        assert!(*labels.last().expect("labels") >= 200.0, "{labels:?}");
        assert!(
            labels.windows(2).all(|w| w[1] / w[0] <= 2.5 + 1e-9),
            "{labels:?}"
        );
    }

    #[test]
    fn the_subtitle_names_the_model_the_request_the_step_and_each_slas_answer() {
        let a = sweep(include_str!("../../tests/data/sweep-a.json"));
        let svg = svg("t", std::slice::from_ref(&a)).expect("drawn");
        let texts: Vec<String> = texts(&svg).into_iter().map(|t| t.text).collect();
        assert_eq!(
            texts[1],
            "model deepfm-int8 · rank, 10 candidates per request · 1 s per step · http-json · 64 connections"
        );
        let answers: Vec<String> = a.sla.iter().map(sla_answer).collect();
        assert_eq!(
            texts[2],
            format!("recserve: highest rate with {}", answers.join(" · "))
        );
        // Each answer is also marked where it lies on the chart: labelled, over a dotted vertical line.
        let marked: Vec<&SlaResult> = a.sla.iter().filter(|s| s.max_rps.is_some()).collect();
        assert!(!marked.is_empty());
        for s in &marked {
            let label = format!(
                "{} ms: {}",
                tick_label_exact(s.p99_ms),
                rate(s.max_rps.expect("marked"))
            );
            assert!(texts.contains(&label), "{label}: {texts:?}");
        }
        let dots = strokes(&svg, COLOURS[0])
            .into_iter()
            .filter(|d| d.len() == 2 && d[0].0 == d[1].0 && (d[0].1 - d[1].1).abs() <= 3.0)
            .count();
        assert!(dots >= 20 * marked.len(), "{dots} dots");
    }

    fn result(max: Option<f64>, first_failing: Option<f64>) -> SlaResult {
        SlaResult {
            p99_ms: 5.0,
            max_rps: max,
            achieved_rps: max,
            p50_at_max_ms: max.map(|_| 1.0),
            p99_at_max_ms: max.map(|_| 4.0),
            first_failing_rps: first_failing,
            failure: first_failing.map(|_| "p99 6 ms > 5 ms".to_owned()),
            first_failing_step: None,
        }
    }

    #[test]
    fn each_sla_answer_says_the_highest_rate_or_why_there_is_none() {
        assert_eq!(
            sla_answer(&result(Some(1200.0), Some(1350.0))),
            "p99 ≤ 5 ms: 1,200/s"
        );
        assert_eq!(
            sla_answer(&result(Some(3000.0), None)),
            "p99 ≤ 5 ms: ≥ 3,000/s (never missed)"
        );
        assert_eq!(
            sla_answer(&result(None, Some(100.0))),
            "p99 ≤ 5 ms: missed from the lowest rate, 100/s"
        );
        assert_eq!(rate(1_234_567.4), "1,234,567/s");
        assert_eq!(rate(999.0), "999/s");
    }

    #[test]
    fn the_model_comes_from_the_v2_model_or_the_path() {
        let a = sweep(include_str!("../../tests/data/sweep-a.json"));
        assert_eq!(model_of(&a.workload, &a.target), "deepfm-int8");
        let mut t = a.target.clone();
        t.v2_model = Some("triton-deepfm".to_owned());
        assert_eq!(model_of(&a.workload, &t), "triton-deepfm");
        let mut w = a.workload.clone();
        w.path = "/v1/recommend/demo".to_owned();
        assert_eq!(model_of(&w, &a.target), "/v1/recommend/demo");
        w.candidates = None;
        w.k = Some(10);
        w.kind = "recommend".to_owned();
        assert_eq!(request_of(&w), "recommend, k = 10");
    }
}
