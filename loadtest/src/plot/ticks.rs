//! The ticks of the charts' axes, chosen here and handed to plotters as key points: a logarithmic latency axis
//! labelled at 1, 2 and 5 of every decade, and a linear rate axis from 0 in steps of 1, 2 or 5 times a power of
//! ten.

/// Ticks of a logarithmic axis that covers `lo..=hi` (both positive): 1, 2 and 5 of every decade, from the
/// largest tick at or below `lo` to the smallest at or above `hi`. Past six decades only the powers of ten are
/// kept, so the labels do not crowd.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (lo, hi) = (lo.min(hi), lo.max(hi));
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let mantissas: &[f64] = if last - first > 6 {
        &[1.0]
    } else {
        &[1.0, 2.0, 5.0]
    };
    let all: Vec<f64> = (first..=last)
        .flat_map(|d| mantissas.iter().map(move |m| m * 10f64.powi(d)))
        .collect();
    // Tolerance for 10^d not being exact in binary.
    let below = all
        .iter()
        .rposition(|&t| t <= lo * (1.0 + 1e-9))
        .unwrap_or(0);
    let above = all
        .iter()
        .position(|&t| t >= hi * (1.0 - 1e-9))
        .unwrap_or(all.len() - 1);
    all[below..=above].to_vec()
}

/// A tick value as its label: `0.5`, `2`, `1000`, with no float noise.
pub fn tick_label(v: f64) -> String {
    let decimals = (-v.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// Ticks of a linear axis from 0 that covers `max`: the smallest step of 1, 2 or 5 times a power of ten that
/// needs at most eight intervals; the last tick is at or above `max`.
pub fn linear_ticks(max: f64) -> Vec<f64> {
    if max.is_nan() || max <= 0.0 {
        return vec![0.0, 1.0];
    }
    let rough = max / 6.0;
    let power = 10f64.powi(rough.log10().floor() as i32);
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&s| max / s <= 8.0)
        .unwrap_or(10.0 * power);
    let n = (max / step - 1e-9).ceil().max(1.0) as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// An SLA as written: `5`, `0.5`, `2.25`.
pub fn tick_label_exact(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(ticks: &[f64]) -> Vec<String> {
        ticks.iter().map(|&t| tick_label(t)).collect()
    }

    #[test]
    fn log_ticks_are_one_two_five_per_decade_around_the_range() {
        // p50 0.8 ms and p99 35 ms: every decade between them is labelled at 1, 2 and 5.
        assert_eq!(
            labels(&log_ticks(0.8, 35.0)),
            ["0.5", "1", "2", "5", "10", "20", "50"]
        );
        // Ends on a tick stay that tick.
        assert_eq!(labels(&log_ticks(1.0, 10.0)), ["1", "2", "5", "10"]);
        assert_eq!(labels(&log_ticks(0.03, 0.04)), ["0.02", "0.05"]);
        // Order of the arguments does not matter.
        assert_eq!(log_ticks(35.0, 0.8), log_ticks(0.8, 35.0));
        // Eight decades: powers of ten only.
        assert_eq!(
            labels(&log_ticks(0.001, 50_000.0)),
            [
                "0.001", "0.01", "0.1", "1", "10", "100", "1000", "10000", "100000"
            ]
        );
    }

    #[test]
    fn linear_ticks_step_by_one_two_or_five_and_cover_the_maximum() {
        assert_eq!(
            linear_ticks(1000.0),
            [0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]
        );
        assert_eq!(
            linear_ticks(2750.0),
            [0.0, 500.0, 1000.0, 1500.0, 2000.0, 2500.0, 3000.0]
        );
        assert_eq!(linear_ticks(7.0), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert_eq!(linear_ticks(0.0), [0.0, 1.0]);
        for max in [3.0, 45.0, 999.0, 12_345.0] {
            let t = linear_ticks(max);
            assert!(
                *t.last().expect("ticks") >= max && t.len() <= 9,
                "{max}: {t:?}"
            );
        }
    }

    #[test]
    fn slas_are_written_as_given() {
        assert_eq!(tick_label_exact(5.0), "5");
        assert_eq!(tick_label_exact(0.5), "0.5");
        assert_eq!(tick_label_exact(2.25), "2.25");
        assert_eq!(tick_label_exact(3_600_000.0), "3600000");
    }
}
