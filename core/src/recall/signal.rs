//! Histories that carry no signal. A history item's vector is zero when the item had no training interactions, so
//! a `history` made only of such items embeds to the zero vector and every item of the catalogue scores 0: an
//! answer indistinguishable from a real one, but meaningless. Recall counts the history items that contribute
//! (each answer says how many), and answers a history with none either from the model's popularity order (when
//! its `model.toml` names one, `[recall] popularity`) or with a 400 that says why.

use std::path::Path;

use super::select::Scored;
use crate::embedding::read_i64_tensor;
use crate::error::{LoadError, ServiceError};

/// How an answer was made when the query carried no signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// The model's most popular items (most training interactions first, equal counts by lower id), not excluded.
    Popularity,
}

impl Fallback {
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Popularity => "popularity",
        }
    }
}

/// A recall model's catalogue ids by popularity, most popular first.
#[derive(Debug)]
pub(crate) struct Popularity {
    order: Vec<u32>,
}

impl Popularity {
    /// Reads the I64 `[items]` tensor `tensor` of `path` (training interactions per item, none negative).
    pub(crate) fn open(path: &Path, tensor: &str, items: usize) -> Result<Popularity, LoadError> {
        let what = "recall.popularity";
        let (counts, shape) = read_i64_tensor(path, tensor, what)?;
        if shape != [items] {
            return Err(LoadError::new(
                path,
                format!(
                    "tensor {tensor:?} has shape {shape:?}, but {what} needs I64 [{items}]: one count per item of \
                     the catalogue"
                ),
            ));
        }
        if let Some(item) = counts.iter().position(|&c| c < 0) {
            return Err(LoadError::new(
                path,
                format!(
                    "tensor {tensor:?} counts {} interactions for item {item}: counts are never negative",
                    counts[item]
                ),
            ));
        }
        Ok(Popularity::from_counts(&counts))
    }

    /// The order of `counts` (one per item): more first, equal counts by lower id.
    pub(crate) fn from_counts(counts: &[i64]) -> Popularity {
        let mut order: Vec<u32> = (0..counts.len() as u32).collect();
        order.sort_by(|&a, &b| counts[b as usize].cmp(&counts[a as usize]).then(a.cmp(&b)));
        Popularity { order }
    }

    /// The `k` most popular items not in `exclude` (ascending, distinct), each with the score every item has
    /// against the zero vector: 0.
    pub(crate) fn top(&self, k: usize, exclude: &[u32]) -> Vec<Scored> {
        self.order
            .iter()
            .filter(|id| exclude.binary_search(id).is_err())
            .take(k)
            .map(|&id| Scored { id, score: 0.0 })
            .collect()
    }
}

/// The answer to a history none of whose `items` contributes: the popularity order when the model has one, else
/// a client error that says why.
pub(crate) fn no_signal(
    popularity: Option<&Popularity>,
    items: usize,
    k: usize,
    exclude: &[u32],
) -> Result<(Vec<Scored>, Fallback), ServiceError> {
    match popularity {
        Some(p) => Ok((p.top(k, exclude), Fallback::Popularity)),
        None => Err(ServiceError::invalid(
            "history",
            format!(
                "none of its {items} distinct items has a history vector (they had no training interactions), so \
                 the query carries no signal, and this model has no popularity order to fall back on (recall.popularity \
                 in its model.toml): send user_id, or items the model was trained on"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn popularity_orders_by_count_then_id_and_skips_excluded_items() {
        let popularity = Popularity::from_counts(&[3, 9, 0, 9, 3, 1]);
        let ids = |items: Vec<Scored>| items.iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(popularity.top(6, &[])), [1, 3, 0, 4, 5, 2]);
        assert_eq!(ids(popularity.top(3, &[1, 4])), [3, 0, 5]);
        assert_eq!(
            ids(popularity.top(9, &[0, 1, 2, 3, 4])),
            [5],
            "fewer than k remain"
        );
        assert!(popularity.top(2, &[]).iter().all(|s| s.score == 0.0));
    }

    #[test]
    fn without_a_popularity_order_the_request_is_refused_saying_why() {
        let (items, fallback) = no_signal(Some(&Popularity::from_counts(&[1, 2])), 3, 1, &[])
            .expect("popularity answers");
        assert_eq!((items[0].id, fallback), (1, Fallback::Popularity));
        let err = no_signal(None, 3, 1, &[]).expect_err("no popularity: refused");
        assert_eq!(err.http_status(), 400);
        let message = err.to_string();
        assert!(
            message.starts_with("history: none of its 3 distinct items has a history vector")
                && message.contains("recall.popularity"),
            "{message}"
        );
    }
}
