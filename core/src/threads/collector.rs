//! The Prometheus families of the threads' accounts and the machine's steal, made at scrape time: per thread role
//! and model, CPU time, run-queue wait and time slices; the machine's steal; the CPUs this process may use.
//! Where `/proc` cannot be read (another OS, a locked-down container) the families it feeds are left out and one
//! warning is logged for the process; `/metrics` itself never fails for it.

use std::sync::{Mutex, MutexGuard, Once, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, CounterVec, IntCounterVec, IntGauge, Opts};

use super::procfs::{self, Proc};
use super::{ACCOUNTS, Accounts};

const NS_PER_SECOND: f64 = 1e9;
const LABELS: &[&str] = &["role", "model"];

/// Reads the threads and the machine at each scrape; register one in each [`prometheus::Registry`] that serves
/// `/metrics` (every one reads the same process-wide accounts).
#[derive(Debug)]
pub(crate) struct ThreadCollector {
    proc: Proc,
    accounts: &'static Mutex<Accounts>,
    /// Made once for their descriptions; each scrape fills fresh ones.
    families: Families,
}

/// One set of the five families.
#[derive(Debug)]
struct Families {
    cpu: CounterVec,
    wait: CounterVec,
    slices: IntCounterVec,
    steal: Counter,
    cpus: IntGauge,
}

impl Families {
    fn new() -> Families {
        let valid = "metric definitions are static and valid";
        Families {
            cpu: CounterVec::new(
                Opts::new(
                    "recserve_thread_cpu_seconds_total",
                    "CPU time of the server's threads, by role and model (for role=\"other\", the thread's name).",
                ),
                LABELS,
            )
            .expect(valid),
            wait: CounterVec::new(
                Opts::new(
                    "recserve_thread_run_queue_wait_seconds_total",
                    "Time the server's threads were ready to run but waited on a run queue for a CPU, by role and \
                     model.",
                ),
                LABELS,
            )
            .expect(valid),
            slices: IntCounterVec::new(
                Opts::new(
                    "recserve_thread_time_slices_total",
                    "Time slices the server's threads ran (times they were put on a CPU), by role and model.",
                ),
                LABELS,
            )
            .expect(valid),
            steal: Counter::with_opts(Opts::new(
                "recserve_machine_steal_seconds_total",
                "Time this machine's CPUs were ready to run but the hypervisor ran something else (steal), summed \
                 over all CPUs since boot (/proc/stat).",
            ))
            .expect(valid),
            cpus: IntGauge::with_opts(Opts::new(
                "recserve_machine_cpus",
                "CPUs this process may run on (its affinity mask).",
            ))
            .expect(valid),
        }
    }
}

impl ThreadCollector {
    /// Reads the real `/proc` and this process's registered threads.
    pub(crate) fn new() -> ThreadCollector {
        ThreadCollector::reading(Proc::system(), &ACCOUNTS)
    }

    fn reading(proc: Proc, accounts: &'static Mutex<Accounts>) -> ThreadCollector {
        ThreadCollector {
            proc,
            accounts,
            families: Families::new(),
        }
    }

    fn accounts(&self) -> MutexGuard<'_, Accounts> {
        self.accounts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for ThreadCollector {
    fn default() -> Self {
        ThreadCollector::new()
    }
}

/// Logs once per process that `/proc` could not be read, and why.
fn warn_unavailable(what: &str, error: &std::io::Error) {
    static WARNED: Once = Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            %error,
            "{what} cannot be read: the recserve_thread_* and recserve_machine_steal_seconds_total metrics are left \
             out where /proc is unavailable"
        );
    });
}

impl Collector for ThreadCollector {
    fn desc(&self) -> Vec<&Desc> {
        let f = &self.families;
        [
            f.cpu.desc(),
            f.wait.desc(),
            f.slices.desc(),
            f.steal.desc(),
            f.cpus.desc(),
        ]
        .concat()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let f = Families::new();
        let mut out = Vec::new();
        // Read under the accounts' lock (see `ACCOUNTS`).
        let scraped = {
            let mut accounts = self.accounts();
            self.proc.threads().map(|threads| accounts.scrape(&threads))
        };
        match scraped {
            Ok(sums) => {
                for ((role, model), used) in &sums {
                    let labels = [*role, &**model];
                    f.cpu
                        .with_label_values(&labels)
                        .inc_by(used.cpu_ns as f64 / NS_PER_SECOND);
                    f.wait
                        .with_label_values(&labels)
                        .inc_by(used.wait_ns as f64 / NS_PER_SECOND);
                    f.slices.with_label_values(&labels).inc_by(used.slices);
                }
                out.extend(f.cpu.collect());
                out.extend(f.wait.collect());
                out.extend(f.slices.collect());
            }
            Err(e) => warn_unavailable("per-thread scheduler statistics", &e),
        }
        match self.proc.steal_ticks() {
            Ok(ticks) => {
                f.steal
                    .inc_by(ticks as f64 / procfs::ticks_per_second() as f64);
                out.extend(f.steal.collect());
            }
            Err(e) => warn_unavailable("the machine's steal time", &e),
        }
        if let Some(cpus) = procfs::allowed_cpus() {
            f.cpus.set(i64::try_from(cpus).unwrap_or(i64::MAX));
            out.extend(f.cpus.collect());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::threads::procfs::SchedStat;

    fn sample(families: &[MetricFamily], name: &str, role: &str, model: &str) -> Option<f64> {
        let family = families.iter().find(|f| f.name() == name)?;
        family
            .get_metric()
            .iter()
            .find(|m| {
                let labels: Vec<(&str, &str)> = m
                    .get_label()
                    .iter()
                    .map(|l| (l.name(), l.value()))
                    .collect();
                labels == [("model", model), ("role", role)]
            })
            .map(|m| m.get_counter().get_value())
    }

    /// A fake `/proc` with the given threads and a steal of 250 ticks.
    fn fake_proc(threads: &[(i32, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        for (tid, text) in threads {
            let dir = root.path().join(format!("self/task/{tid}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("schedstat"), text).expect("write");
        }
        std::fs::write(
            root.path().join("stat"),
            "cpu  1 2 3 4 5 6 7 250 0 0\ncpu0 1 2 3 4 5 6 7 250 0 0\n",
        )
        .expect("write");
        root
    }

    fn leaked() -> &'static Mutex<Accounts> {
        Box::leak(Box::new(Mutex::new(Accounts::new())))
    }

    #[test]
    fn families_sum_by_role_and_model_in_seconds() {
        let root = fake_proc(&[
            (7, "2000000000 500000000 40\n"),
            (8, "1000000000 250000000 10\n"),
            (9, "3000000 1000000 3\n"),
        ]);
        let accounts = leaked();
        {
            let mut a = accounts.lock().expect("lock");
            a.register(
                7,
                super::super::ThreadRole::Executor,
                "deepfm",
                SchedStat::default(),
            );
            a.register(
                8,
                super::super::ThreadRole::Executor,
                "deepfm",
                SchedStat::default(),
            );
        }
        let collector = ThreadCollector::reading(Proc::at(root.path()), accounts);
        let families = collector.collect();
        let cpu = "recserve_thread_cpu_seconds_total";
        assert_eq!(sample(&families, cpu, "executor", "deepfm"), Some(3.0));
        assert_eq!(
            sample(
                &families,
                "recserve_thread_run_queue_wait_seconds_total",
                "executor",
                "deepfm"
            ),
            Some(0.75)
        );
        assert_eq!(sample(&families, cpu, "unregistered", ""), Some(0.003));
        let slices = families
            .iter()
            .find(|f| f.name() == "recserve_thread_time_slices_total")
            .expect("slices");
        assert!(
            slices
                .get_metric()
                .iter()
                .any(|m| m.get_counter().get_value() == 50.0)
        );
        let steal = families
            .iter()
            .find(|f| f.name() == "recserve_machine_steal_seconds_total")
            .expect("steal");
        let hz = procfs::ticks_per_second() as f64;
        assert_eq!(steal.get_metric()[0].get_counter().get_value(), 250.0 / hz);
        assert!(families.iter().any(|f| f.name() == "recserve_machine_cpus"));
        // Every family it makes is one it described (the registry refuses a collector otherwise).
        let described: Vec<&str> = collector
            .desc()
            .iter()
            .map(|d| d.fq_name.as_str())
            .collect();
        assert!(families.iter().all(|f| described.contains(&f.name())));
    }

    #[test]
    fn without_proc_the_families_are_left_out_and_nothing_fails() {
        let nowhere = tempfile::tempdir().expect("tempdir");
        let collector = ThreadCollector::reading(Proc::at(nowhere.path().join("proc")), leaked());
        let families = collector.collect();
        let names: Vec<&str> = families.iter().map(MetricFamily::name).collect();
        // Only the affinity mask, which is a system call and not a file, is left.
        assert_eq!(names, ["recserve_machine_cpus"]);
        // It stays quiet and correct on every later scrape too.
        assert_eq!(collector.collect().len(), 1);
        // And the registry serving /metrics takes it and renders.
        let registry = prometheus::Registry::new();
        registry.register(Box::new(collector)).expect("register");
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut text,
        )
        .expect("encode");
        assert!(
            String::from_utf8(text)
                .expect("utf8")
                .contains("recserve_machine_cpus ")
        );
    }
}
