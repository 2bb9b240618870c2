//! The process's families: which build runs, and (read at each scrape, not updated) the server's threads and the
//! machine's steal, collected by [`crate::threads::ThreadCollector`].

use prometheus::{IntGauge, Opts, Registry};

use super::register as register_all;

/// Registers the build's gauge and the thread collector.
pub(super) fn register(registry: &Registry) {
    register_all(
        registry,
        vec![
            Box::new(build_info()),
            Box::new(crate::threads::ThreadCollector::new()),
            // The standard process_* families (CPU seconds, resident and virtual memory, open and maximum file
            // descriptors, threads, start time), as every Prometheus client exports them.
            Box::new(prometheus::process_collector::ProcessCollector::for_self()),
        ],
    );
}

fn build_info() -> IntGauge {
    let gauge = IntGauge::with_opts(
        Opts::new(
            "recserve_build_info",
            "Always 1; the label says which recserve version is running.",
        )
        .const_label("version", env!("CARGO_PKG_VERSION")),
    )
    .expect("metric definitions are static and valid");
    gauge.set(1);
    gauge
}
