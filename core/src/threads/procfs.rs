//! What the kernel says about where the CPU time went: each thread's scheduler statistics
//! (`/proc/self/task/<tid>/schedstat`), the machine's steal time (`/proc/stat`), and the CPUs this process may run
//! on (`sched_getaffinity`). Parsers take text and never panic: a file in a shape they do not know reads as
//! nothing.

use std::io;
use std::path::PathBuf;

/// A kernel thread id (`gettid`).
pub(crate) type Tid = libc::pid_t;

/// One thread's scheduler statistics, as `/proc/<pid>/task/<tid>/schedstat` gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SchedStat {
    /// Time on a CPU, in nanoseconds.
    pub(crate) cpu_ns: u64,
    /// Time runnable but waiting on a run queue for a CPU, in nanoseconds.
    pub(crate) wait_ns: u64,
    /// Time slices run (times the thread was put on a CPU).
    pub(crate) slices: u64,
}

impl SchedStat {
    /// What was added since `earlier` (0 where a value went down).
    pub(crate) fn since(self, earlier: SchedStat) -> SchedStat {
        SchedStat {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
            slices: self.slices.saturating_sub(earlier.slices),
        }
    }

    /// The larger of each value: the later of two readings of one thread, whichever arrived first.
    pub(crate) fn latest(self, other: SchedStat) -> SchedStat {
        SchedStat {
            cpu_ns: self.cpu_ns.max(other.cpu_ns),
            wait_ns: self.wait_ns.max(other.wait_ns),
            slices: self.slices.max(other.slices),
        }
    }

    /// Whether every value is at least `earlier`'s: a later reading of the same thread. A thread id that was
    /// reused by a new thread reads lower.
    pub(crate) fn follows(self, earlier: SchedStat) -> bool {
        self.cpu_ns >= earlier.cpu_ns
            && self.wait_ns >= earlier.wait_ns
            && self.slices >= earlier.slices
    }

    pub(crate) fn add(&mut self, other: SchedStat) {
        self.cpu_ns = self.cpu_ns.saturating_add(other.cpu_ns);
        self.wait_ns = self.wait_ns.saturating_add(other.wait_ns);
        self.slices = self.slices.saturating_add(other.slices);
    }
}

/// Parses a `schedstat` file: three numbers (ns on a CPU, ns waiting on a run queue, time slices). `None` when
/// any of the three is missing or not a number; anything after the third is ignored.
pub(crate) fn parse_schedstat(text: &str) -> Option<SchedStat> {
    let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
    let mut next = || fields.next()?.ok();
    Some(SchedStat {
        cpu_ns: next()?,
        wait_ns: next()?,
        slices: next()?,
    })
}

/// Parses `/proc/stat`: the steal column of its `cpu` line (all CPUs), the 8th value after the label (user, nice,
/// system, idle, iowait, irq, softirq, steal), in clock ticks. `None` without a `cpu` line holding a steal column
/// (a kernel before 2.6.11, or not a `/proc/stat`). Per-CPU steal is `scripts/lib/steal.py`'s.
pub(crate) fn parse_steal(stat: &str) -> Option<u64> {
    let values = stat.lines().find_map(|line| line.strip_prefix("cpu "))?;
    values.split_ascii_whitespace().nth(7)?.parse().ok()
}

/// The kernel's clock tick (`USER_HZ`), in which `/proc/stat` counts: `sysconf(_SC_CLK_TCK)`, 100 if unknown.
pub(crate) fn ticks_per_second() -> u64 {
    // SAFETY: sysconf takes an integer and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// The CPUs this process may run on (`sched_getaffinity`), `None` if the kernel would not say.
pub(crate) fn allowed_cpus() -> Option<usize> {
    // SAFETY: cpu_set_t is a plain bit array for which all zeroes is a valid (empty) value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most `size_of::<cpu_set_t>()` bytes into `set`, which we own; pid 0 is this
    // thread, whose mask is the process's unless someone pinned the thread alone.
    let result =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if result != 0 {
        return None;
    }
    // SAFETY: `set` was filled in by the kernel above.
    let count = unsafe { libc::CPU_COUNT(&set) };
    usize::try_from(count).ok().filter(|&n| n > 0)
}

/// The calling thread's kernel id.
pub(crate) fn current_tid() -> Tid {
    // SAFETY: gettid takes nothing and cannot fail.
    unsafe { libc::gettid() }
}

/// A `/proc` to read: the real one, or a directory shaped like it (tests).
#[derive(Debug, Clone)]
pub(crate) struct Proc {
    root: PathBuf,
}

impl Proc {
    pub(crate) fn system() -> Proc {
        Proc::at("/proc")
    }

    pub(crate) fn at(root: impl Into<PathBuf>) -> Proc {
        Proc { root: root.into() }
    }

    fn tasks(&self) -> PathBuf {
        self.root.join("self").join("task")
    }

    /// One thread of this process; `None` when it has ended or its statistics cannot be read.
    pub(crate) fn thread(&self, tid: Tid) -> Option<SchedStat> {
        let path = self.tasks().join(tid.to_string()).join("schedstat");
        parse_schedstat(&std::fs::read_to_string(path).ok()?)
    }

    /// Every thread of this process, with its statistics where they could be read (`None`: it was ending as we
    /// read, or its file is not in a shape we know). An error when the task directory cannot be listed, or when no
    /// thread's statistics can be read (a kernel without `CONFIG_SCHED_INFO`): the caller itself is a thread, so
    /// nothing readable means the files are not there.
    pub(crate) fn threads(&self) -> io::Result<Vec<(Tid, Option<SchedStat>)>> {
        let dir = self.tasks();
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let threads: Vec<(Tid, Option<SchedStat>)> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse::<Tid>().ok())
            .map(|tid| (tid, self.thread(tid)))
            .collect();
        if threads.iter().all(|(_, read)| read.is_none()) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no readable schedstat under {}", dir.display()),
            ));
        }
        Ok(threads)
    }

    /// The steal of all CPUs since boot, in clock ticks.
    pub(crate) fn steal_ticks(&self) -> io::Result<u64> {
        let path = self.root.join("stat");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        parse_steal(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no `cpu` line with a steal column", path.display()),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_is_three_numbers() {
        assert_eq!(
            parse_schedstat("3350000000 780000000 11498\n"),
            Some(SchedStat {
                cpu_ns: 3_350_000_000,
                wait_ns: 780_000_000,
                slices: 11_498
            })
        );
        // A later kernel adding a column does not hide the three we know.
        assert_eq!(
            parse_schedstat("1 2 3 4"),
            Some(SchedStat {
                cpu_ns: 1,
                wait_ns: 2,
                slices: 3
            })
        );
        for malformed in [
            "",
            "\n",
            "1 2",
            "1 2 x",
            "-1 2 3",
            "1.5 2 3",
            "18446744073709551616 0 0",
            "a b c",
        ] {
            assert_eq!(parse_schedstat(malformed), None, "{malformed:?}");
        }
    }

    const STAT: &str = "\
cpu  4705 356 584 3699176 23060 0 277 118 0 0
cpu0 1393 280 283 1849434 11447 0 263 60 0 0
cpu1 3312 76 301 1849742 11613 0 14 58 0 0
intr 8688370 575 0 0 0 0 0 0 0 1 0 0 0 0 0 0 0 0 0 0
ctxt 17936009
btime 1733220000
";

    #[test]
    fn steal_is_the_eighth_value_of_the_cpu_line() {
        assert_eq!(parse_steal(STAT), Some(118));
    }

    #[test]
    fn malformed_proc_stat_gives_no_steal() {
        // Before 2.6.11 the cpu line had seven values: no steal column.
        assert_eq!(parse_steal("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(parse_steal(""), None);
        assert_eq!(parse_steal("intr 1 2 3\nctxt 4\n"), None);
        assert_eq!(parse_steal("cpu  1 2 3 4 5 6 7 x\n"), None);
        assert_eq!(parse_steal("cpu  1 2 3 4 5 6 7 -1\n"), None);
        // Only the all-CPU line counts, wherever it is.
        assert_eq!(parse_steal("cpu0 0 0 0 0 0 0 0 4\n"), None);
        assert_eq!(parse_steal("intr 0\ncpu  0 0 0 0 0 0 0 9 0 0\n"), Some(9));
    }

    #[test]
    fn readings_compare_and_accumulate() {
        let a = SchedStat {
            cpu_ns: 10,
            wait_ns: 5,
            slices: 2,
        };
        let b = SchedStat {
            cpu_ns: 15,
            wait_ns: 5,
            slices: 3,
        };
        assert!(b.follows(a) && !a.follows(b));
        assert_eq!(
            b.since(a),
            SchedStat {
                cpu_ns: 5,
                wait_ns: 0,
                slices: 1
            }
        );
        assert_eq!(a.since(b), SchedStat::default());
        assert_eq!(a.latest(b), b);
        let mut sum = a;
        sum.add(b);
        assert_eq!(
            sum,
            SchedStat {
                cpu_ns: 25,
                wait_ns: 10,
                slices: 5
            }
        );
    }

    #[test]
    fn a_missing_proc_is_an_error_not_a_panic() {
        let nowhere = tempfile::tempdir().expect("tempdir");
        let proc = Proc::at(nowhere.path().join("proc"));
        assert!(proc.threads().is_err());
        assert!(proc.steal_ticks().is_err());
        assert_eq!(proc.thread(1), None);
    }

    #[test]
    fn a_proc_tree_reads_its_threads_and_skips_unreadable_ones() {
        let root = tempfile::tempdir().expect("tempdir");
        let task = root.path().join("self/task");
        for (tid, text) in [
            ("100", "5 6 7\n"),
            ("101", "garbage\n"),
            ("not-a-tid", "1 2 3\n"),
        ] {
            std::fs::create_dir_all(task.join(tid)).expect("mkdir");
            std::fs::write(task.join(tid).join("schedstat"), text).expect("write");
        }
        // A thread directory without its schedstat (it was ending as we read).
        std::fs::create_dir_all(task.join("102")).expect("mkdir");
        std::fs::write(root.path().join("stat"), STAT).expect("write");
        let proc = Proc::at(root.path());
        let mut threads = proc.threads().expect("threads");
        threads.sort_by_key(|&(tid, _)| tid);
        let read = SchedStat {
            cpu_ns: 5,
            wait_ns: 6,
            slices: 7,
        };
        assert_eq!(threads, vec![(100, Some(read)), (101, None), (102, None)]);
        assert_eq!(proc.steal_ticks().expect("steal"), 118);
        // Only unreadable threads: as if the kernel had no schedstat at all.
        std::fs::remove_dir_all(task.join("100")).expect("rm");
        assert!(proc.threads().is_err());
    }

    #[test]
    fn the_real_proc_reads_this_thread_and_the_machine() {
        // Linux is the only target; every reading here is a fact of this machine, checked for shape only.
        let proc = Proc::system();
        let me = current_tid();
        assert!(me > 0);
        let mine = proc.thread(me).expect("this thread's schedstat");
        assert!(mine.slices >= 1, "{mine:?}");
        let threads = proc.threads().expect("threads");
        assert!(threads.iter().any(|&(t, read)| t == me && read.is_some()));
        proc.steal_ticks().expect("steal");
        assert!(allowed_cpus().expect("affinity") >= 1);
        assert!(ticks_per_second() >= 1);
    }
}
