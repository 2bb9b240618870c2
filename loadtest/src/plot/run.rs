//! A run's chart: did it meet the SLA? Its latency percentiles (p50, p90, p99, p99.9, max) as bars on a
//! logarithmic axis, each labelled with its value, the SLAs as the sweep chart draws them, and the verdict per SLA
//! in the subtitle.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{
    COLOURS, Glyph, INK, LABEL_SIZE, PlotError, SLA, SLA_DASH, canvas, chart, draw_error, font,
    log_ticks, sla_lines, tick_label_exact,
};
use crate::engine::Mode;
use crate::report::RunReport;
use crate::stats::Ms;
use crate::sweep::failure;

/// Pixels between a bar and the edges of its segment.
const BAR_MARGIN: u32 = 36;

/// Whether `report` met a p99 bound of `sla_ms` with at most `max_error_ratio` of its requests failed (the
/// sweep's rule): `p99 ≤ 5 ms: met (p99 4.21 ms)` or `p99 ≤ 5 ms: missed, p99 6.10 ms > 5 ms`.
pub fn verdict(report: &RunReport, sla_ms: f64, max_error_ratio: f64) -> String {
    let bound = format!("p99 ≤ {} ms", tick_label_exact(sla_ms));
    match failure(report, sla_ms, max_error_ratio) {
        None => format!(
            "{bound}: met (p99 {})",
            Ms(report.p99_ms().unwrap_or_default())
        ),
        Some(why) => format!("{bound}: missed, {why}"),
    }
}

/// Draws `report` against the p99 bounds `slas_ms` into an SVG document titled `title`.
pub fn svg(
    title: &str,
    report: &RunReport,
    slas_ms: &[f64],
    max_error_ratio: f64,
) -> Result<String, PlotError> {
    let l = report.latency_ms.ok_or(PlotError::EmptyRun)?;
    let bars = [
        ("p50", l.p50_ms),
        ("p90", l.p90_ms),
        ("p99", l.p99_ms),
        ("p99.9", l.p999_ms),
        ("max", l.max_ms),
    ];
    let lo = slas_ms.iter().copied().fold(l.p50_ms, f64::min);
    let hi = slas_ms.iter().copied().fold(l.max_ms, f64::max);
    let y_ticks = log_ticks(lo.max(1e-3), hi.max(1e-3));

    let mode = match report.mode {
        Mode::Open { rate, .. } => format!(
            "open loop at {rate}/s (achieved {:.1}/s)",
            report.achieved_rps
        ),
        Mode::Closed { concurrency } => format!(
            "closed loop, {concurrency} workers ({:.1}/s)",
            report.achieved_rps
        ),
    };
    let mut lines = vec![format!(
        "model {} · {} · {mode} · {} s · {}",
        super::model_of(&report.workload, &report.target),
        super::request_of(&report.workload),
        tick_label_exact(report.duration_s),
        report.target.protocol
    )];
    let mut verdicts = vec![format!(
        "{} requests, {} failed",
        report.requests.scheduled, report.requests.errors
    )];
    verdicts.extend(
        slas_ms
            .iter()
            .map(|&sla| verdict(report, sla, max_error_ratio)),
    );
    lines.push(verdicts.join(" · "));
    let mut entries = vec![(
        Glyph::Bar(COLOURS[0]),
        "latency of the successful requests, from their scheduled send".to_owned(),
    )];
    if !slas_ms.is_empty() {
        entries.push((Glyph::Dashed(SLA, SLA_DASH), "SLA (p99 bound)".to_owned()));
    }

    canvas(title, &lines, &entries, |area| {
        // One segment per percentile, labelled at its centre.
        let x_label = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => usize::try_from(*i)
                .ok()
                .and_then(|i| bars.get(i))
                .map(|(name, _)| (*name).to_owned())
                .unwrap_or_default(),
            _ => String::new(),
        };
        let mut chart = chart(
            area,
            (
                (0..bars.len() as i32 - 1).into_segmented(),
                bars.len(),
                false,
            ),
            &y_ticks,
            ("percentile of the run's successful requests", &x_label),
        )?;
        let (colour, floor) = (COLOURS[0], y_ticks[0]);
        chart
            .draw_series(bars.iter().zip(0..).map(|((_, v), i)| {
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), floor),
                        (SegmentValue::Exact(i + 1), *v),
                    ],
                    colour.filled(),
                );
                bar.set_margin(0, 0, BAR_MARGIN, BAR_MARGIN);
                bar
            }))
            .map_err(draw_error)?;
        let above = font(LABEL_SIZE, INK).pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(bars.iter().zip(0..).map(|((_, v), i)| {
                EmptyElement::at((SegmentValue::CenterOf(i), *v))
                    + Text::new(Ms(*v).to_string(), (0, -5), above.clone())
            }))
            .map_err(draw_error)?;
        sla_lines(&mut chart, slas_ms)
    })
}

#[cfg(test)]
mod tests {
    use super::super::hex;
    use super::super::tests::{assert_sla_lines, elements, texts, y_labels};
    use super::*;
    use crate::sweep::SweepReport;

    fn run() -> RunReport {
        let sweep: SweepReport =
            serde_json::from_str(include_str!("../../tests/data/sweep-a.json"))
                .expect("sweep JSON");
        sweep
            .steps
            .into_iter()
            .find(|s| s.latency_ms.is_some() && s.requests.errors == 0)
            .expect("a step with latencies")
    }

    #[test]
    fn bars_of_each_percentile_under_labelled_sla_lines() {
        let r = run();
        let l = r.latency_ms.expect("latency");
        let svg = svg("one run", &r, &[5.0, 1000.0], 0.001).expect("drawn");
        // Five bars, rising from p50 to max, and the legend's swatch (the shortest).
        let blue = hex(COLOURS[0]);
        let mut bars: Vec<(f64, f64)> = elements(&svg)
            .iter()
            .filter(|e| e.tag == "rect" && e.attr("fill") == Some(blue.as_str()))
            .map(|e| (e.num("x"), e.num("height")))
            .collect();
        assert_eq!(bars.len(), 6, "{bars:?}");
        bars.retain(|b| b.1 > 12.0);
        assert_eq!(bars.len(), 5, "{bars:?}");
        assert!(
            bars.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{bars:?}"
        );
        let centred: Vec<String> = texts(&svg)
            .into_iter()
            .filter(|t| t.attr("text-anchor") == Some("middle"))
            .map(|t| t.text)
            .collect();
        let names = ["p50", "p90", "p99", "p99.9", "max"];
        assert_eq!(
            centred
                .iter()
                .filter(|t| names.contains(&t.as_str()))
                .collect::<Vec<_>>(),
            names
        );
        // Each bar labelled with its value.
        for v in [l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms] {
            assert!(
                centred.contains(&Ms(v).to_string()),
                "{}: {centred:?}",
                Ms(v)
            );
        }
        assert_sla_lines(&svg, &["SLA 5 ms", "SLA 1000 ms"]);
        assert!(
            centred[1]
                .starts_with("model deepfm-int8 · rank, 10 candidates per request · open loop at "),
            "{centred:?}"
        );
        assert_eq!(
            centred[2],
            format!(
                "{} requests, 0 failed · {} · {}",
                r.requests.scheduled,
                verdict(&r, 5.0, 0.001),
                verdict(&r, 1000.0, 0.001)
            )
        );
        // y labels reach from below p50 to above the largest SLA.
        let y = y_labels(&svg);
        assert!(
            y[0] <= l.p50_ms.min(5.0) && *y.last().expect("labels") >= 1000.0,
            "{y:?}"
        );
    }

    #[test]
    fn the_verdict_judges_p99_and_failed_requests() {
        let mut r = run();
        let p99 = r.p99_ms().expect("p99");
        assert_eq!(
            verdict(&r, p99 * 2.0, 0.001),
            format!(
                "p99 ≤ {} ms: met (p99 {})",
                tick_label_exact(p99 * 2.0),
                Ms(p99)
            )
        );
        assert!(
            verdict(&r, p99 / 2.0, 0.001).contains(": missed, p99 "),
            "{}",
            verdict(&r, p99 / 2.0, 0.001)
        );
        r.requests.errors = r.requests.scheduled / 2;
        assert!(verdict(&r, p99 * 2.0, 0.001).contains("% of requests failed (more than 0.10%)"));
        r.latency_ms = None;
        assert!(matches!(
            svg("x", &r, &[5.0], 0.001),
            Err(PlotError::EmptyRun)
        ));
    }
}
