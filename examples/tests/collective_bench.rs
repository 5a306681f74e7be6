//! The benchmark harness end to end, in process: the `allreduce` program's sweep on 2 ranks
//! with every timed call checked, and one small sweep of every other collective. Times are
//! only printed, never asserted.

use clap::Parser;
use oxccl_examples::collective_bench::collective::Collective;
use oxccl_examples::collective_bench::options::BenchArgs;
use oxccl_examples::collective_bench::plan::Plan;
use oxccl_examples::collective_bench::{Baselines, RankOutcome, report, run_in_process, table};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(extra: &[&str]) -> BenchArgs {
    let base = ["bench", "--ranks", "2", "--iters", "3", "--warmup", "1"];
    Cli::try_parse_from(base.iter().chain(extra)).unwrap().bench
}

/// Runs `collective` as the program would (without baselines) and returns its table and
/// the number of wrong elements.
fn sweep(collective: Collective, a: &BenchArgs) -> (String, u64, usize) {
    let plan = Plan::new(collective, a, a.ranks).unwrap();
    let outcomes = run_in_process(&plan, a).unwrap();
    assert!(outcomes.iter().all(|o| matches!(o, RankOutcome::Sweep(_))));
    let r = report(&plan, a, "threads", &outcomes, Baselines::default()).unwrap();
    (table::table(&r), r.wrong(), r.sizes.len())
}

/// Guards against the all-reduce benchmark reporting wrong elements for a correct
/// collective (a reference out of rank order, a sentinel read back as a result, an in-place
/// buffer not reset between checked calls), or checking fewer sizes than it prints: every
/// timed call of sizes that take packets and direct, several types and operations.
#[test]
fn allreduce_check_every_finds_no_wrong_element() {
    for extra in [
        &["--max-bytes", "64K", "--check", "every"][..],
        &[
            "--max-bytes",
            "8K",
            "--check",
            "every",
            "--dtype",
            "bf16",
            "--op",
            "avg",
        ],
        &[
            "--max-bytes",
            "8K",
            "--check",
            "every",
            "--dtype",
            "i8",
            "--op",
            "prod",
            "--algo",
            "direct",
        ],
    ] {
        let a = args(extra);
        let (table, wrong, sizes) = sweep(Collective::AllReduce, &a);
        println!("{table}");
        assert_eq!(wrong, 0, "{extra:?}:\n{table}");
        assert_eq!(sizes, a.sizes().len());
        assert!(table.contains("# Out of bounds values : 0 OK"), "{table}");
        assert!(
            table.contains("packets") || extra.contains(&"direct"),
            "{table}"
        );
    }
}

/// Guards against a collective of the `collectives` program being checked against the
/// wrong reference (offsets of gathered blocks, a reduce-scatter's slice, the root's
/// output, all-to-all-v's uneven counts), out of place and in place.
#[test]
fn every_collective_checks_clean() {
    for c in Collective::ALL {
        let a = args(&[
            "--max-bytes",
            "4K",
            "--check",
            "every",
            "--root",
            "1",
            "--dtype",
            "u32",
            "--op",
            "max",
        ]);
        let (table, wrong, _) = sweep(c, &a);
        println!("{table}");
        assert_eq!(wrong, 0, "{c:?}:\n{table}");
    }
}

/// Guards against `--soak` making different calls on different ranks (they would wait for
/// each other until a timeout) or skipping the check.
#[test]
fn short_soak_is_clean() {
    let a = args(&["--soak", "0.5", "--max-bytes", "4K", "--seed", "3"]);
    for c in [
        Collective::AllReduce,
        Collective::AllToAllV,
        Collective::Reduce,
    ] {
        let plan = Plan::new(c, &a, 2).unwrap();
        let outcomes = run_in_process(&plan, &a).unwrap();
        for o in &outcomes {
            let RankOutcome::Soak(s) = o else {
                panic!("{o:?}")
            };
            assert!(s.calls > 0, "{s:?}");
            assert_eq!(s.wrong, 0, "{c:?}: {:?}", s.failures);
        }
    }
}

/// Guards against a job of more ranks than one host can hold starting thread after thread
/// (or process after process) until the system refuses one: the process aborted after
/// some 13 000 threads of `--ranks 100000`. Refused before anything starts, with the limit.
#[test]
fn too_many_ranks_are_refused_before_anything_starts() {
    let max = oxccl::in_process::MAX_RANKS;
    for ranks in [0, max + 1, 100_000] {
        let mut a = args(&[]);
        a.ranks = ranks;
        let e = Plan::new(Collective::AllReduce, &a, ranks).unwrap_err();
        assert!(
            e.to_string().contains(&format!("--ranks {ranks}"))
                && e.to_string().contains(&max.to_string()),
            "{e}"
        );
    }
    let started = std::time::Instant::now();
    let config = oxccl::in_process::InProcessConfig::default();
    let e = oxccl::in_process::run(max + 1, config, |_| Ok(())).unwrap_err();
    assert!(
        matches!(&e, oxccl::Error::InvalidUsage(m) if m.contains("at most")),
        "{e}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "it started ranks"
    );
}

/// Guards against a count that means nothing (no timed call, a grid of no block, sizes
/// that never grow) being quietly replaced by another instead of refused.
#[test]
fn meaningless_counts_are_refused() {
    for (flag, value) in [
        ("--iters", "0"),
        ("--blocks", "0"),
        ("--threads", "0"),
        ("--step-factor", "1"),
    ] {
        let parsed = Cli::try_parse_from(["bench", flag, value]);
        let e = parsed
            .err()
            .unwrap_or_else(|| panic!("{flag} {value} was accepted"));
        assert!(e.to_string().contains(flag), "{flag}: {e}");
    }
}
