//! Ranks as separate processes, started the way launchers start them: this test binary
//! re-runs itself once per rank (`oxccl_testing::Job`) with launcher variables set, each
//! child running the ignored test `child_process_entry`.

#![allow(missing_docs)]

use oxccl_testing::free_port;
use std::time::Duration;

use oxccl_bootstrap::{Bootstrap, Config, UniqueId};
use oxccl_testing::Job;

const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// The child role: join from the environment, run every operation, report one line.
/// Ignored in normal runs; the job tests run it by name with `--ignored`.
#[test]
#[ignore = "the child role of the process tests, started by them"]
fn child_process_entry() {
    assert!(
        oxccl_testing::child_rank().is_some(),
        "run by the process tests only"
    );
    let bs =
        Bootstrap::from_env_with_config(&Config::default().with_timeout(Duration::from_secs(30)))
            .expect("child init");
    let (me, n) = (bs.rank(), bs.size());
    let mine = format!("pid {} rank {me}", std::process::id()).into_bytes();
    let all = bs.all_gather(&mine).unwrap();
    assert_eq!(all[me], mine);
    for (r, b) in all.iter().enumerate() {
        assert!(String::from_utf8_lossy(b).ends_with(&format!("rank {r}")));
    }
    assert_eq!(bs.all_gather_ring(&mine).unwrap(), all);
    bs.barrier().unwrap();
    assert_eq!(bs.broadcast(n - 1, &all[n - 1]).unwrap(), all[n - 1]);
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    bs.send(right, 9, &mine).unwrap();
    assert_eq!(bs.recv(left, 9).unwrap(), all[left]);
    bs.barrier().unwrap();
    // On its own line: the test harness prints the test's name before it.
    println!(
        "\nCHILD-OK rank={me} size={n} local_rank={} local_size={} launcher={:?}",
        bs.local_rank(),
        bs.local_size(),
        bs.launcher()
    );
}

/// Starts `n` children, rank `r` with `vars(r)`, waits for all (killing them at the
/// deadline), and returns each one's `CHILD-OK` line.
fn run_job(n: usize, vars: impl Fn(usize) -> Vec<(String, String)>) -> Vec<String> {
    let mut job = Job::new(n);
    job.child_test("child_process_entry")
        .deadline(CHILD_TIMEOUT);
    for r in 0..n {
        for (k, v) in vars(r) {
            job.env(r, k, v);
        }
    }
    job.run()
        .unwrap()
        .iter()
        .map(|o| {
            assert!(o.success(), "{o}");
            o.find_line("CHILD-OK")
                .unwrap_or_else(|| panic!("no result line: {o}"))
                .to_owned()
        })
        .collect()
}

fn s(k: &str, v: impl ToString) -> (String, String) {
    (k.to_owned(), v.to_string())
}

// Guards against the bootstrap only working inside one process (shared memory, shared
// statics), and against misreading torchrun's variables in a real child environment.
#[test]
fn processes_torchrun_n3() {
    let port = free_port();
    let lines = run_job(3, |r| {
        vec![
            s("RANK", r),
            s("WORLD_SIZE", 3),
            s("LOCAL_RANK", r),
            s("LOCAL_WORLD_SIZE", 3),
            s("MASTER_ADDR", "127.0.0.1"),
            s("MASTER_PORT", port),
            s("OXCCL_SECRET", "000102030405060708090a0b0c0d0e0f"),
        ]
    });
    for (r, l) in lines.iter().enumerate() {
        assert_eq!(
            l,
            &format!(
                "CHILD-OK rank={r} size=3 local_rank={r} local_size=3 launcher=Some(Torchrun)"
            )
        );
    }
}

// Guards against the unique-id path (rank 0 binding exactly the id's address) failing
// across processes, at the largest process count of the suite, with Open MPI variables
// and no launcher local size (computed from host names instead).
#[test]
fn processes_open_mpi_with_unique_id_n7() {
    let id = UniqueId::new(format!("127.0.0.1:{}", free_port()).parse().unwrap()).unwrap();
    let lines = run_job(7, |r| {
        vec![
            s("OMPI_COMM_WORLD_RANK", r),
            s("OMPI_COMM_WORLD_SIZE", 7),
            s("OXCCL_UNIQUE_ID", &id),
        ]
    });
    for (r, l) in lines.iter().enumerate() {
        assert_eq!(
            l,
            &format!("CHILD-OK rank={r} size=7 local_rank={r} local_size=7 launcher=Some(OpenMpi)")
        );
    }
}

// Guards against the Slurm path (root from the node list) and the smallest job breaking.
#[test]
fn processes_slurm_n2_and_pmi_n1() {
    let port = free_port();
    let lines = run_job(2, |r| {
        vec![
            s("SLURM_PROCID", r),
            s("SLURM_NTASKS", 2),
            s("SLURM_LOCALID", r),
            s("SLURM_STEP_NODELIST", "localhost"),
            s("MASTER_PORT", port),
            s("SLURM_JOB_ID", "4242"),
        ]
    });
    assert_eq!(lines.len(), 2);
    assert!(lines[1].ends_with("launcher=Some(Slurm)"), "{}", lines[1]);

    let port = free_port();
    let lines = run_job(1, |_| {
        vec![
            s("PMI_RANK", 0),
            s("PMI_SIZE", 1),
            s("MASTER_ADDR", "127.0.0.1"),
            s("MASTER_PORT", port),
        ]
    });
    assert_eq!(
        lines,
        vec!["CHILD-OK rank=0 size=1 local_rank=0 local_size=1 launcher=Some(Pmi)".to_owned()]
    );
}

// Guards against a job of many processes (the largest count of the thread tests) losing a
// rank or deadlocking in the log-N all-gather when every rank is its own process.
#[test]
fn processes_pmi_n64() {
    let port = free_port();
    let lines = run_job(64, |r| {
        vec![
            s("PMI_RANK", r),
            s("PMI_SIZE", 64),
            s("MASTER_ADDR", "127.0.0.1"),
            s("MASTER_PORT", port),
            s("OXCCL_SECRET", "f0e1d2c3b4a5968778695a4b3c2d1e0f"),
        ]
    });
    assert_eq!(lines.len(), 64);
    for (r, l) in lines.iter().enumerate() {
        assert!(l.starts_with(&format!("CHILD-OK rank={r} size=64 ")), "{l}");
        assert!(l.ends_with("launcher=Some(Pmi)"), "{l}");
    }
}
