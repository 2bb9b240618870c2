//! Recall: exact top-K by inner product over an item catalogue ([`Catalogue`]): a batch of queries is scored
//! together as a matrix product over cache-sized blocks of the catalogue, each query keeps its own top K
//! ([`TopK`]) per shard, and the shards' lists are merged. Scores are exact (no approximate index) and
//! reproducible bit for bit whatever the batch, shard layout or CPU.

mod catalogue;
mod kernel;
pub mod reference;
mod select;

pub use catalogue::{
    Catalogue, CodeRow, F32Row, LANES, Panels, SearchQuery, SearchScratch, SearchStats, Shard,
};
pub use kernel::{BLOCK_BYTES, Isa};
pub use select::{Scored, TopK, answer_order, merge};

#[cfg(test)]
mod tests;
