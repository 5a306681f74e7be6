//! What each thread of this process did between two moments, from Linux's
//! `/proc/self/task/<tid>/{comm,schedstat,status}`: CPU time, time spent runnable but waiting
//! for a core, and voluntary and involuntary context switches. The evidence for which thread
//! ran, and which waited for a core (`pingpong --thread-stats`), and for what an idle proxy
//! thread costs (`fifo_bench --idle`).

use std::collections::BTreeMap;

/// One thread's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// The thread's name.
    pub name: String,
    /// CPU time so far.
    pub cpu_ns: u64,
    /// Time spent runnable, waiting for a core.
    pub runnable_wait_ns: u64,
    /// Times it gave up its core (blocked, slept, parked).
    pub voluntary_switches: u64,
    /// Times its core was taken from it.
    pub involuntary_switches: u64,
}

/// Every thread's counters at one moment, by thread id (empty where `/proc` is missing).
#[derive(Clone, Debug, Default)]
pub struct Snapshot(BTreeMap<u64, Counters>);

impl Snapshot {
    /// The counters of every thread of this process now.
    pub fn take() -> Snapshot {
        let mut threads = BTreeMap::new();
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return Snapshot(threads);
        };
        for entry in dir.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            let path = entry.path();
            let read = |f: &str| std::fs::read_to_string(path.join(f)).unwrap_or_default();
            let mut c = Counters {
                name: read("comm").trim().to_string(),
                ..Counters::default()
            };
            let sched: Vec<u64> = read("schedstat")
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            if let [run, wait, ..] = sched[..] {
                (c.cpu_ns, c.runnable_wait_ns) = (run, wait);
            }
            for line in read("status").lines() {
                let field = |prefix: &str| {
                    line.strip_prefix(prefix)
                        .and_then(|v| v.trim().parse::<u64>().ok())
                };
                if let Some(v) = field("voluntary_ctxt_switches:") {
                    c.voluntary_switches = v;
                } else if let Some(v) = field("nonvoluntary_ctxt_switches:") {
                    c.involuntary_switches = v;
                }
            }
            threads.insert(tid, c);
        }
        Snapshot(threads)
    }

    /// The counters of the first thread named `name`, if it was alive.
    pub fn named(&self, name: &str) -> Option<&Counters> {
        self.0.values().find(|c| c.name == name)
    }

    /// One line per thread alive in both snapshots: what it did between `before` and
    /// `self`, busiest first.
    pub fn lines_since(&self, before: &Snapshot) -> Vec<String> {
        let mut rows: Vec<(u64, String)> = self
            .0
            .iter()
            .filter_map(|(tid, now)| {
                let then = before.0.get(tid)?;
                let cpu = now.cpu_ns.saturating_sub(then.cpu_ns);
                Some((
                    cpu,
                    format!(
                        "thread name={} tid={tid} cpu_ms={:.1} runnable_wait_ms={:.1} voluntary_switches={} involuntary_switches={}",
                        now.name,
                        cpu as f64 / 1e6,
                        now.runnable_wait_ns.saturating_sub(then.runnable_wait_ns) as f64 / 1e6,
                        now.voluntary_switches.saturating_sub(then.voluntary_switches),
                        now.involuntary_switches.saturating_sub(then.involuntary_switches),
                    ),
                ))
            })
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.0));
        rows.into_iter().map(|(_, line)| line).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against counters read from the wrong files or fields: a thread that spins
    /// for a while shows CPU time, and the calling thread is listed by its name.
    #[test]
    fn a_busy_thread_shows_its_cpu_time() {
        let before = Snapshot::take();
        let spinner = std::thread::Builder::new()
            .name("busy-spinner".into())
            .spawn(|| {
                let start = std::time::Instant::now();
                while start.elapsed() < std::time::Duration::from_millis(50) {
                    std::hint::spin_loop();
                }
                Snapshot::take()
            })
            .unwrap();
        let after = spinner.join().unwrap();
        // The spinner is new, so it is not in `before`: compare it against zero counters.
        let spun = after
            .0
            .values()
            .find(|c| c.name == "busy-spinner")
            .expect("the spinner is listed");
        assert!(spun.cpu_ns >= 10_000_000, "{spun:?}");
        assert!(!before.0.is_empty());
        let lines = after.lines_since(&before);
        assert!(lines.iter().all(|l| l.starts_with("thread name=")));
    }
}
