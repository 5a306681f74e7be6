//! Jobs of child processes: output that would fill a pipe, children that hang, the
//! environment each child sees, and set-up mistakes.

#![allow(missing_docs)]

use std::io::Write;
use std::time::{Duration, Instant};

use oxccl_testing::{ChildOutcome, Error, Job, child_rank};

/// Bytes the chatty child writes to each of stdout and stderr: far more than a pipe holds
/// (64 KiB on Linux).
const CHATTY_BYTES: usize = 8 << 20;

/// What a child does, by the `ROLE` variable its job gives it.
#[test]
#[ignore = "the child role of the job tests, started by them"]
fn job_child() {
    let rank = child_rank().expect("started by a Job");
    match std::env::var("ROLE").as_deref() {
        Ok("chatty") => {
            let line = format!("{}\n", "x".repeat(1023));
            let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
            for _ in 0..CHATTY_BYTES / line.len() {
                out.write_all(line.as_bytes()).unwrap();
                err.write_all(line.as_bytes()).unwrap();
            }
            out.flush().unwrap();
        }
        Ok("hang") => std::thread::sleep(Duration::from_secs(600)),
        Ok("fail") => panic!("child {rank} fails on purpose"),
        Ok("env") => {
            for key in ["RANK", "WORLD_SIZE", "OXCCL_SECRET", "SHARED", "MINE"] {
                let v = std::env::var(key).unwrap_or_else(|_| "-".into());
                println!("\nENV {key}={v}");
            }
        }
        Ok("nested") => nested(),
        other => panic!("unknown ROLE {other:?}"),
    }
    println!("\nCHILD-DONE rank={rank}");
}

/// A child that runs a job of its own, to check what a job removes from an environment
/// that carries launcher variables (this child's job set them).
fn nested() {
    assert_eq!(std::env::var("RANK").as_deref(), Ok("7"));
    let outcomes = Job::new(2)
        .child_test("job_child")
        .env_all("ROLE", "env")
        .env(1, "RANK", "1")
        .run()
        .unwrap();
    assert_all_ok(&outcomes);
    let rank_of = |o: &ChildOutcome| o.find_line("ENV RANK=").unwrap().to_owned();
    assert_eq!(rank_of(&outcomes[0]), "ENV RANK=-");
    assert_eq!(rank_of(&outcomes[1]), "ENV RANK=1");
    for o in &outcomes {
        assert_eq!(o.find_line("ENV OXCCL_SECRET="), Some("ENV OXCCL_SECRET=-"));
        assert_eq!(o.find_line("ENV WORLD_SIZE="), Some("ENV WORLD_SIZE=-"));
    }
    println!("\nNESTED-OK");
}

fn assert_all_ok(outcomes: &[ChildOutcome]) {
    for o in outcomes {
        assert!(o.success(), "{o}");
        assert!(o.output_complete, "{o}");
        assert_eq!(
            o.find_line("CHILD-DONE"),
            Some(format!("CHILD-DONE rank={}", o.rank).as_str()),
            "{o}"
        );
    }
}

/// Guards against a child blocking forever on a full stdout or stderr pipe because the
/// parent reads the pipes only after the children exit (the job then ends at its deadline
/// with the child killed), and against output being cut.
#[test]
fn chatty_children_complete() {
    let t = Instant::now();
    let outcomes = Job::new(2)
        .child_test("job_child")
        .env_all("ROLE", "chatty")
        .deadline(Duration::from_secs(120))
        .run()
        .unwrap();
    assert_all_ok(&outcomes);
    for o in &outcomes {
        assert!(o.stdout.len() >= CHATTY_BYTES, "{}", o.stdout.len());
        assert!(o.stderr.len() >= CHATTY_BYTES, "{}", o.stderr.len());
        assert_eq!((o.stdout_dropped, o.stderr_dropped), (0, 0));
    }
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
}

/// Guards against a job keeping more output than asked (a child writing without end
/// would exhaust memory), and against keeping the start instead of the end, where a
/// failing child prints why.
#[test]
fn output_is_bounded_to_its_end() {
    let outcomes = Job::new(1)
        .child_test("job_child")
        .env_all("ROLE", "chatty")
        .max_output_bytes(64 << 10)
        .run()
        .unwrap();
    let o = &outcomes[0];
    assert!(o.success(), "{o}");
    assert_eq!(o.stdout.len(), 64 << 10);
    assert_eq!(o.stderr.len(), 64 << 10);
    assert!(o.stdout_dropped >= CHATTY_BYTES as u64 - (64 << 10));
    assert!(o.find_line("CHILD-DONE").is_some(), "{o}");
}

/// Guards against a hanging child hanging the job (or the test suite), against the other
/// children's results being lost with it, and against a killed or failed child being
/// reported as a success.
#[test]
fn hanging_child_is_killed_at_the_deadline() {
    let deadline = Duration::from_secs(3);
    let t = Instant::now();
    let outcomes = Job::new(3)
        .child_test("job_child")
        .env_all("ROLE", "env")
        .env(1, "ROLE", "hang")
        .env(2, "ROLE", "fail")
        .deadline(deadline)
        .run()
        .unwrap();
    let elapsed = t.elapsed();
    assert!(elapsed >= deadline, "{elapsed:?}");
    assert!(elapsed < deadline + Duration::from_secs(10), "{elapsed:?}");

    let [ok, hung, failed] = &outcomes[..] else {
        panic!("{} outcomes", outcomes.len())
    };
    assert!(ok.success() && !ok.killed, "{ok}");
    assert!(hung.killed && !hung.success(), "{hung}");
    assert!(
        hung.to_string().contains("killed at the job's deadline"),
        "{hung}"
    );
    assert!(!failed.killed && !failed.success(), "{failed}");
    assert!(
        failed.stdout_text().contains("child 2 fails on purpose")
            || failed.stderr_text().contains("child 2 fails on purpose"),
        "{failed}"
    );
}

/// Guards against children inheriting the launcher variables of the job that runs the
/// tests (torchrun, mpirun, Slurm), and against per-child variables leaking to the
/// others or losing to the ones set for all.
#[test]
fn children_see_only_their_variables() {
    let outcomes = Job::new(2)
        .child_test("job_child")
        .env_all("ROLE", "env")
        .env_all("SHARED", "s")
        .env_all("MINE", "all")
        .env(1, "MINE", "one")
        .run()
        .unwrap();
    assert_all_ok(&outcomes);
    assert_eq!(outcomes[0].find_line("ENV MINE="), Some("ENV MINE=all"));
    assert_eq!(outcomes[1].find_line("ENV MINE="), Some("ENV MINE=one"));
    for o in &outcomes {
        assert_eq!(o.find_line("ENV SHARED="), Some("ENV SHARED=s"));
    }

    // A child whose own environment carries launcher variables starts a job of its own.
    let outcomes = Job::new(1)
        .child_test("job_child")
        .env_all("ROLE", "nested")
        .env_all("RANK", "7")
        .env_all("WORLD_SIZE", "8")
        .env_all("OXCCL_SECRET", "00112233445566778899aabbccddeeff")
        .run()
        .unwrap();
    assert!(outcomes[0].success(), "{}", outcomes[0]);
    assert!(
        outcomes[0].find_line("NESTED-OK").is_some(),
        "{}",
        outcomes[0]
    );
}

/// Guards against a misspelt child test passing by running no test at all, and against
/// set-up mistakes starting anything.
#[test]
fn mistakes_are_reported() {
    let outcomes = Job::new(1).child_test("no_such_test").run().unwrap();
    let o = &outcomes[0];
    assert!(o.status.success(), "{o}");
    assert!(!o.success(), "{o}");
    assert!(o.to_string().contains("no test ran"), "{o}");

    assert!(matches!(Job::new(1).run(), Err(Error::NoChildTest)));
    let e = Job::new(2)
        .child_test("job_child")
        .env(2, "RANK", "2")
        .run()
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::NoSuchRank {
                rank: 2,
                ranks: 2,
                ..
            }
        ),
        "{e}"
    );
}
