//! Releases replaced versions once no request holds them any more, on a thread of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Served, lock};
use crate::metrics::Metrics;

/// How often the releaser looks for drained versions.
pub(super) const RELEASE_EVERY: Duration = Duration::from_millis(50);

/// Releases replaced versions once no request holds them any more, on a thread of its own: dropping a version
/// joins its batcher and executor threads and unmaps its tables, which must not happen on a request's thread.
#[derive(Debug)]
pub(super) struct Releaser<M: Send + Sync + 'static> {
    draining: Arc<Mutex<Vec<Arc<Served<M>>>>>,
    metrics: Metrics,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<M: Send + Sync + 'static> Releaser<M> {
    pub(super) fn start(metrics: Metrics) -> Releaser<M> {
        let draining: Arc<Mutex<Vec<Arc<Served<M>>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (draining, stop, metrics) =
                (Arc::clone(&draining), Arc::clone(&stop), metrics.clone());
            std::thread::Builder::new()
                .name("model-releaser".to_owned())
                .spawn(move || {
                    crate::threads::register_current_thread(
                        crate::threads::ThreadRole::Other,
                        "model-releaser",
                    );
                    while !stop.load(Ordering::Acquire) {
                        std::thread::park_timeout(RELEASE_EVERY);
                        release_drained(&draining, &metrics);
                    }
                })
                .map_err(|e| tracing::error!("cannot start the model releaser thread: {e}"))
                .ok()
        };
        Releaser {
            draining,
            metrics,
            stop,
            thread,
        }
    }

    /// Drains `version`: counted in the gauge now, released once no request holds it.
    pub(super) fn push(&self, version: Arc<Served<M>>) {
        {
            let mut held = lock(&self.draining);
            let model = version.name.clone();
            held.push(version);
            let count = held.iter().filter(|v| v.name == model).count();
            self.metrics.set_versions_draining(&model, count);
        }
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.draining).len()
    }
}

/// Drops the versions only `draining` still holds, outside its lock, gives the memory they freed back to the
/// system, then updates the draining gauge (so that a gauge at 0 means released).
fn release_drained<M>(draining: &Mutex<Vec<Arc<Served<M>>>>, metrics: &Metrics) {
    let released: Vec<Arc<Served<M>>> = {
        let mut held = lock(draining);
        let (done, still): (Vec<_>, Vec<_>) =
            held.drain(..).partition(|v| Arc::strong_count(v) == 1);
        *held = still;
        done
    };
    if released.is_empty() {
        return;
    }
    let mut models: Vec<String> = Vec::with_capacity(released.len());
    for version in released {
        let (name, number) = (version.name.clone(), version.version);
        let started = Instant::now();
        drop(version);
        tracing::info!(model = %name, version = number, seconds = started.elapsed().as_secs_f64(), "replaced version released");
        models.push(name);
    }
    return_freed_memory();
    let held = lock(draining);
    for model in models {
        let count = held.iter().filter(|v| v.name == model).count();
        metrics.set_versions_draining(&model, count);
    }
}

/// Asks the allocator to give freed memory back to the system: a released version frees its sessions' and
/// buffers' heap memory, which glibc's malloc would otherwise keep, so that resident memory after many swaps
/// stays that of the versions serving.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a plain integer and only touches the allocator's own state, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl<M: Send + Sync + 'static> Drop for Releaser<M> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            if thread.join().is_err() {
                tracing::error!("the model releaser thread panicked");
            }
        }
    }
}
