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
