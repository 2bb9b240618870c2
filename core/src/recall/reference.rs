//! The naive recall that the catalogue's search is tested against: every item scored by the documented formula
//! in a scalar loop straight from the table's byte layout, then a full sort. Also the float64 scores of the same
//! items with a rigorous bound on the float32 rounding, so tests state their tolerance instead of guessing one.
//!
//! The documented scores (docs/model-repository.md, `[recall]`), all in f32 without fused multiply-adds:
//! - fp32 and fp16 items: `s = 0; for j in 0..dim { s += q[j] * x[j] }`;
//! - int8 items with codes `c`, `scale`, `bias`: `d = 0; for j { d += q[j] * c[j] }`, `t = 0; for j { t += q[j] }`,
//!   `s = d * scale + bias * t`.

use super::select::{Scored, answer_order};
use crate::repository::{Storage, TableSpec};

/// Unit roundoff of f32.
const U32: f64 = 1.0 / (1u64 << 24) as f64;

/// `γ_n = n·u / (1 − n·u)`: the relative error bound of `n` chained f32 roundings.
fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U32;
    nu / (1.0 - nu)
}

fn f32_at(bytes: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Value `j` of row `row`, or for int8 the code, with the row's scale and bias.
fn value(spec: &TableSpec, bytes: &[u8], row: usize, j: usize) -> f32 {
    let dim = spec.dim;
    match spec.storage {
        Storage::Fp32 => f32_at(bytes, (row * dim + j) * 4),
        Storage::Fp16 => {
            let at = (row * dim + j) * 2;
            half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
        }
        Storage::Int8 => f32::from(bytes[row * (dim + 8) + j]),
    }
}

fn int8_params(spec: &TableSpec, bytes: &[u8], row: usize) -> (f32, f32) {
    let start = row * (spec.dim + 8) + spec.dim;
    (f32_at(bytes, start), f32_at(bytes, start + 4))
}

/// The documented f32 score of every item of the table (`bytes`, whole, documented layout) for `query`.
pub(crate) fn scores(spec: &TableSpec, bytes: &[u8], query: &[f32]) -> Vec<f32> {
    assert_eq!(query.len(), spec.dim, "query has dim values");
    let mut qsum = 0.0f32;
    for &q in query {
        qsum += q;
    }
    (0..spec.rows as usize)
        .map(|row| {
            let mut s = 0.0f32;
            for (j, &q) in query.iter().enumerate() {
                s += q * value(spec, bytes, row, j);
            }
            match spec.storage {
                Storage::Fp32 | Storage::Fp16 => s,
                Storage::Int8 => {
                    let (scale, bias) = int8_params(spec, bytes, row);
                    s * scale + bias * qsum
                }
            }
        })
        .collect()
}

/// The best `k` items by `scores` (answer order: higher score, then lower id), skipping `exclude`, by sorting
/// everything.
pub(crate) fn top_k(scores: &[f32], k: usize, exclude: &[u32]) -> Vec<Scored> {
    let mut all: Vec<Scored> = scores
        .iter()
        .enumerate()
        .map(|(id, &score)| Scored {
            id: id as u32,
            score,
        })
        .filter(|s| !exclude.contains(&s.id))
        .collect();
    all.sort_by(answer_order);
    all.truncate(k);
    all
}

/// Each item's score computed in f64 from the values the table represents (int8: `c·scale + bias` without
/// rounding), with a bound on how far the documented f32 score can be from it:
/// - fp32/fp16: `γ_dim · Σ_j |q_j·x_j|`;
/// - int8: `γ_(dim+2) · (|scale|·Σ_j |q_j|·c_j + |bias|·Σ_j |q_j|)`;
///
/// plus a relative 1e-12 for the f64 sum's own rounding.
pub(crate) fn exact_scores(spec: &TableSpec, bytes: &[u8], query: &[f32]) -> Vec<(f64, f64)> {
    let dim = spec.dim;
    (0..spec.rows as usize)
        .map(|row| match spec.storage {
            Storage::Fp32 | Storage::Fp16 => {
                let (mut s, mut a) = (0.0f64, 0.0f64);
                for (j, &q) in query.iter().enumerate() {
                    let p = f64::from(q) * f64::from(value(spec, bytes, row, j));
                    s += p;
                    a += p.abs();
                }
                (s, gamma(dim) * a + 1e-12 * a)
            }
            Storage::Int8 => {
                let (scale, bias) = int8_params(spec, bytes, row);
                let (scale, bias) = (f64::from(scale), f64::from(bias));
                let (mut s, mut qc, mut qa) = (0.0f64, 0.0f64, 0.0f64);
                for (j, &q) in query.iter().enumerate() {
                    let (q, c) = (f64::from(q), f64::from(value(spec, bytes, row, j)));
                    s += q * (c * scale + bias);
                    qc += q.abs() * c;
                    qa += q.abs();
                }
                let a = scale.abs() * qc + bias.abs() * qa;
                (s, gamma(dim + 2) * a + 1e-12 * a)
            }
        })
        .collect()
}
