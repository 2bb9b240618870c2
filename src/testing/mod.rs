//! Test support, not part of the server: the plain reference decoder of `/v1` rank bodies that the server's own
//! decoder is tested and benchmarked against (the core crate's `testing` has the table fixtures, the small test
//! contract and the fuzz harness). Compiled for this crate's tests and, through the `testing`
//! feature (which the crate's dev-dependency on itself turns on), for its integration tests and benchmarks.

pub mod rank_reference;
