//! Ranks as processes: started by this program (`--processes`), or by a launcher
//! (torchrun, `mpirun`, `srun`), each process one rank; rank 0 prints the table.

use crate::Args;
use crate::bench::bench_rank;
use crate::mpi::{MPI_BASELINE_ENV, MpiRow, encode_mpi_rows, parse_mpi_rows};
use crate::table::{Row, print_table};
use oxccl::{Communicator, CommunicatorConfig, Result};

/// One rank of a job a launcher started: benchmark, gather every rank's rows, rank 0
/// prints.
pub(crate) fn run_launched_rank(a: &Args, sizes: &[u64]) -> Result<bool> {
    let mut comm = Communicator::from_env(CommunicatorConfig::default())?;
    let rows = bench_rank(&mut comm, a, sizes)?;
    let encoded: Vec<u8> = rows
        .iter()
        .flat_map(|&(bytes, (t0, w0), (t1, w1))| {
            [bytes, t0.to_bits(), w0, t1.to_bits(), w1]
                .into_iter()
                .flat_map(u64::to_le_bytes)
        })
        .collect();
    let all: Vec<Vec<Row>> = comm
        .out_of_band()
        .all_gather(encoded)?
        .iter()
        .map(|bytes| {
            let words: Vec<u64> = bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect();
            words
                .chunks_exact(5)
                .map(|w| {
                    (
                        w[0],
                        (f64::from_bits(w[1]), w[2]),
                        (f64::from_bits(w[3]), w[4]),
                    )
                })
                .collect()
        })
        .collect();
    let ok = all.iter().flatten().all(|r| r.1.1 == 0 && r.2.1 == 0);
    if comm.rank() == 0 {
        let mpi = std::env::var(MPI_BASELINE_ENV)
            .ok()
            .filter(|text| !text.is_empty())
            .map(|text| parse_mpi_rows(&text));
        print_table(a, "processes", sizes, &all, mpi.as_deref());
    }
    Ok(ok)
}

/// Longest a job of rank processes may run before the ranks still running are stopped: a
/// last resort, far above a full run's time, for ranks stuck past their own wait limits.
const JOB_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// Starts this program once per rank, as one job with torchrun's variables on this node;
/// rank 0's output is the program's.
pub(crate) fn launch_processes(a: &Args, mpi: Option<&[MpiRow]>) -> Result<bool> {
    let system = |context: &str, source: std::io::Error| oxccl::Error::System {
        context: context.into(),
        source,
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| system("finding a free port for the job", e))?
        .port();
    let secret = oxccl_bootstrap::Secret::random()?.to_hex();
    let exe = std::env::current_exe().map_err(|e| system("finding this program", e))?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|s| s != "--processes" && s != "--mpi")
        .collect();
    let mut children = Vec::new();
    for rank in 0..a.ranks {
        let child = std::process::Command::new(&exe)
            .args(&args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", a.ranks.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", a.ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OXCCL_SECRET", &secret)
            .env(
                MPI_BASELINE_ENV,
                mpi.map(encode_mpi_rows).unwrap_or_default(),
            )
            .stdout(if rank == 0 {
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            })
            .spawn()
            .map_err(|e| system(&format!("starting rank {rank}"), e))?;
        children.push(child);
    }
    let deadline = std::time::Instant::now() + JOB_DEADLINE;
    let mut ok = true;
    for (rank, mut child) in children.into_iter().enumerate() {
        match oxccl_examples::wait_until(&mut child, deadline)
            .map_err(|e| system(&format!("waiting for rank {rank}"), e))?
        {
            Some(status) if status.success() => {}
            Some(status) => {
                eprintln!("allreduce: rank {rank} failed: {status}");
                ok = false;
            }
            None => {
                eprintln!(
                    "allreduce: rank {rank} was still running after {} s and was stopped",
                    JOB_DEADLINE.as_secs()
                );
                ok = false;
            }
        }
    }
    Ok(ok)
}
