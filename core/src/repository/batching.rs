//! `[batching]` of `model.toml`: the model author's batching defaults, which the server's flags override, and the
//! ranges both are checked against.

use serde::Deserialize;

/// The largest `max_batch_rows`, from the flag or from `model.toml`.
pub const MAX_BATCH_ROWS: usize = 65_536;
/// The largest `max_queue_delay_us` (one second), from the flag or from `model.toml`.
pub const MAX_QUEUE_DELAY_US: u64 = 1_000_000;
/// The largest `default_deadline_ms` (one hour), from the flag or from `model.toml`.
pub const MAX_DEFAULT_DEADLINE_MS: u64 = 3_600_000;

/// `[batching]`: every key optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchingSpec {
    pub(crate) max_batch_rows: Option<usize>,
    pub(crate) max_queue_delay_us: Option<u64>,
    pub(crate) buckets: Option<Vec<usize>>,
    pub(crate) default_deadline_ms: Option<u64>,
}

impl BatchingSpec {
    /// Checks every key that is set against its range.
    pub(super) fn check(&self) -> Result<(), String> {
        if let Some(buckets) = &self.buckets {
            check_buckets(buckets).map_err(|problem| format!("batching.buckets {problem}"))?;
        }
        if let Some(rows) = self.max_batch_rows
            && !(1..=MAX_BATCH_ROWS).contains(&rows)
        {
            return Err(format!(
                "batching.max_batch_rows = {rows} must be between 1 and {MAX_BATCH_ROWS}"
            ));
        }
        if let Some(us) = self.max_queue_delay_us
            && us > MAX_QUEUE_DELAY_US
        {
            return Err(format!(
                "batching.max_queue_delay_us = {us} must be between 0 and {MAX_QUEUE_DELAY_US}"
            ));
        }
        if let Some(ms) = self.default_deadline_ms
            && !(1..=MAX_DEFAULT_DEADLINE_MS).contains(&ms)
        {
            return Err(format!(
                "batching.default_deadline_ms = {ms} must be between 1 and {MAX_DEFAULT_DEADLINE_MS}"
            ));
        }
        Ok(())
    }
}

/// Checks a bucket list: not empty, every size ≥ 1, strictly ascending.
pub fn check_buckets(buckets: &[usize]) -> Result<(), String> {
    if buckets.is_empty() {
        return Err("must list at least one batch size".to_owned());
    }
    if buckets[0] == 0 {
        return Err("sizes must be at least 1".to_owned());
    }
    if let Some(w) = buckets.windows(2).find(|w| w[0] >= w[1]) {
        return Err(format!(
            "must be strictly ascending ({} then {})",
            w[0], w[1]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_bucket_lists() {
        assert!(check_buckets(&[1, 8, 64]).is_ok());
        assert_eq!(
            check_buckets(&[]),
            Err("must list at least one batch size".to_owned())
        );
        assert_eq!(
            check_buckets(&[0, 4]),
            Err("sizes must be at least 1".to_owned())
        );
        assert_eq!(
            check_buckets(&[4, 4]),
            Err("must be strictly ascending (4 then 4)".to_owned())
        );
    }
}
