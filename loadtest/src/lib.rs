//! recload: the load generator and benchmark driver of recserve.
//!
//! Open-loop arrivals ([`arrivals`]) drive one worker loop ([`engine`]) against a [`target::Target`] (HTTP JSON
//! now; KServe v2 and gRPC later implement the same trait), sending requests a [`workload::Workload`] generated
//! (ranking, recall, recommend). Latency is measured from each request's scheduled send time into HdrHistograms
//! ([`stats`]); [`report`] is the JSON a run writes, [`sweep`] searches the highest rate under a p99 bound,
//! [`plot`] draws latency against throughput, [`check`] compares servers' scores, and [`ceiling`] measures
//! recserve's compute path in-process.
//! The command line ([`cli`]) is documented in docs/recload.md.

pub mod arrivals;
pub mod ceiling;
pub mod check;
pub mod cli;
pub mod engine;
pub mod plot;
pub mod report;
pub mod stats;
pub mod sweep;
pub mod target;
pub mod workload;
