//! All-reduce benchmark, nccl-tests style: for each size, out-of-place and in-place time,
//! algorithm and bus bandwidth, and the number of wrong elements.
//!
//! ```text
//! cargo run --release -p oxccl-examples --bin allreduce -- --ranks 2 --max-bytes 16M
//! ```
//!
//! Ranks are threads of one process, each on its own emulated device (CPU backend), or
//! with `--processes` separate processes this program starts itself (with torchrun's
//! variables), mapping each other's device memory. Started by a launcher (torchrun,
//! `mpirun`, `srun`: its variables are found), each process is one rank and rank 0 prints
//! the table. Messages up to `--packet-max-bytes` go through
//! `oxccl_device::kernels::packet_all_reduce::packet_all_reduce_sum_f32` (LL packets, no
//! semaphore round trips), larger ones through
//! `oxccl_device::kernels::all_reduce::ring_all_reduce_sum_f32`; both over memory channels.

use clap::Parser;
use oxccl::in_process::{self, InProcessConfig};
use oxccl::{Communicator, CommunicatorConfig, DeviceBuffer, MemoryChannel, Result, Stream};
use oxccl_device::kernels::all_reduce::{RingAllReduceArgs, ring_all_reduce_sum_f32};
use oxccl_device::kernels::packet_all_reduce::{
    PacketAllReduceArgs, packet_all_reduce_sum_f32, packet_scratch_bytes,
};
use oxccl_device::launch::LaunchConfig;
use oxccl_examples::parse_bytes;
use std::cell::Cell;
use std::time::Instant;

/// Measures all-reduce (sum of f32) across ranks.
#[derive(Parser, Debug)]
struct Args {
    /// Number of ranks.
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// Smallest message, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    min_bytes: u64,
    /// Largest message, in bytes (suffixes K, M, G).
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    max_bytes: u64,
    /// Factor between consecutive sizes.
    #[arg(long, default_value_t = 4)]
    step_factor: u64,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 20)]
    iters: u32,
    /// Untimed iterations per size.
    #[arg(long, default_value_t = 3)]
    warmup: u32,
    /// Kernel threads per rank.
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Largest message sent as LL packets; larger ones take the semaphore ring (0: never
    /// packets). On the CPU emulator the two take the same time up to about 512 B, and
    /// packets are slower above: each carries half its bytes, and the receiver polls
    /// lines the sender is still writing.
    #[arg(long, default_value = "512", value_parser = parse_bytes)]
    packet_max_bytes: u64,
    /// Run each rank as its own process (this program, started `--ranks` times) instead
    /// of as threads of one process.
    #[arg(long)]
    processes: bool,
    /// Also time Open MPI's `MPI_Allreduce` with the same ranks, sizes and iterations in
    /// the same run, and print oxccl's time relative to it (needs mpicc and mpirun).
    #[arg(long)]
    mpi: bool,
}

/// Small integers, so every sum is exact in f32 whatever the order of additions.
fn value(rank: u32, i: usize) -> f32 {
    ((i * 7 + rank as usize * 13) % 101) as f32
}

struct Rank {
    work: DeviceBuffer<f32>,
    input: DeviceBuffer<f32>,
    next: MemoryChannel,
    prev: MemoryChannel,
    /// LL-packet channels over every rank's scratch, if any size takes packets.
    packets: Option<PacketPath>,
    stream: Stream,
}

/// What the LL-packet all-reduce needs: the scratch peers write, channels over it, and the
/// flag of the last call (every rank makes the same calls, so the flags agree).
struct PacketPath {
    _scratch: DeviceBuffer<u64>,
    next: MemoryChannel,
    prev: MemoryChannel,
    max_bytes: u64,
    flag: Cell<u32>,
}

impl PacketPath {
    /// The next call's flag: 1, 2, ... skipping 0 when it wraps.
    fn next_flag(&self) -> u32 {
        let f = self.flag.get().wrapping_add(1).max(1);
        self.flag.set(f);
        f
    }
}

impl Rank {
    fn new(comm: &mut Communicator, max_n: usize, max_packet_bytes: u64) -> Result<Rank> {
        let rank = comm.rank();
        let work = comm.alloc::<f32>(2 * max_n)?;
        let input = comm
            .device()
            .alloc_from(&(0..max_n).map(|i| value(rank, i)).collect::<Vec<_>>())?;
        let all = comm.all_gather_memory(&comm.register(&work))?;
        let mine = all[rank as usize].clone();
        let (next, prev) = comm.ring_memory_channels(&all, &mine, None)?;
        let packet_n = (max_packet_bytes.min(max_n as u64 * 4) / 4) as usize;
        let packets = if packet_n > 0 {
            let bytes = packet_scratch_bytes(packet_n as u64, comm.size()).max(8);
            let scratch = comm.alloc::<u64>(bytes.div_ceil(8) as usize)?;
            let all = comm.all_gather_memory(&comm.register(&scratch))?;
            let mine = all[rank as usize].clone();
            let (next, prev) = comm.ring_memory_channels(&all, &mine, Some(&mine))?;
            Some(PacketPath {
                _scratch: scratch,
                next,
                prev,
                max_bytes: packet_n as u64 * 4,
                flag: Cell::new(0),
            })
        } else {
            None
        };
        Ok(Rank {
            work,
            input,
            next,
            prev,
            packets,
            stream: comm.device().stream()?,
        })
    }

    fn launch(&self, comm: &Communicator, n: usize, in_place: bool, threads: u32) -> Result<()> {
        let config = LaunchConfig::grid(1).block(threads);
        let input = if in_place {
            self.work.addr()
        } else {
            self.input.addr()
        };
        if let Some(p) = self
            .packets
            .as_ref()
            .filter(|p| n as u64 * 4 <= p.max_bytes)
        {
            let args = PacketAllReduceArgs {
                next: p.next.device_handle(),
                prev: p.prev.device_handle(),
                input,
                output: self.work.addr(),
                n: n as u64,
                flag: p.next_flag(),
                rank: comm.rank(),
                n_ranks: comm.size(),
                reserved: 0,
            };
            return packet_all_reduce_sum_f32::launch(&self.stream, config, (args,));
        }
        let args = RingAllReduceArgs {
            next: self.next.device_handle(),
            prev: self.prev.device_handle(),
            input,
            work: self.work.addr(),
            n: n as u64,
            rank: comm.rank(),
            n_ranks: comm.size(),
        };
        ring_all_reduce_sum_f32::launch(&self.stream, config, (args,))
    }

    /// Runs once from fresh inputs and counts wrong elements.
    fn check(
        &mut self,
        comm: &Communicator,
        n: usize,
        in_place: bool,
        threads: u32,
    ) -> Result<u64> {
        let fresh: Vec<f32> = (0..n).map(|i| value(comm.rank(), i)).collect();
        let mut host = self.work.to_vec()?;
        host[..n].copy_from_slice(&fresh);
        self.work.copy_from_host(&host)?;
        comm.barrier()?;
        self.launch(comm, n, in_place, threads)?;
        comm.synchronize(&self.stream)?;
        comm.barrier()?;
        let got = self.work.to_vec()?;
        let ranks = comm.size();
        Ok((0..n)
            .filter(|&i| got[i] != (0..ranks).map(|r| value(r, i)).sum::<f32>())
            .count() as u64)
    }

    /// Mean time of one all-reduce over `iters` back-to-back launches, in microseconds.
    fn time(&self, comm: &Communicator, n: usize, in_place: bool, a: &Args) -> Result<f64> {
        for _ in 0..a.warmup {
            self.launch(comm, n, in_place, a.threads)?;
        }
        self.stream.synchronize()?;
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..a.iters {
            self.launch(comm, n, in_place, a.threads)?;
        }
        self.stream.synchronize()?;
        let us = start.elapsed().as_secs_f64() * 1e6 / a.iters.max(1) as f64;
        comm.check()?;
        comm.barrier()?;
        Ok(us)
    }
}

/// One row: (bytes, out-of-place (time, wrong), in-place (time, wrong)).
type Row = (u64, (f64, u64), (f64, u64));

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("allreduce: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<bool> {
    let sizes: Vec<u64> = std::iter::successors(Some(a.min_bytes.max(4)), |&b| {
        b.checked_mul(a.step_factor.max(2))
    })
    .take_while(|&b| b <= a.max_bytes.max(4))
    .collect();
    if oxccl_bootstrap::LaunchEnv::detect().is_ok() {
        return run_launched_rank(a, &sizes);
    }
    let mpi = if a.mpi {
        Some(run_mpi_baseline(a, &sizes)?)
    } else {
        None
    };
    if a.processes {
        return launch_processes(a, mpi.as_deref());
    }
    let rows = in_process::run(a.ranks, InProcessConfig::default(), |comm| {
        bench_rank(comm, a, &sizes)
    })?;
    Ok(print_table(
        a,
        "threads of one process",
        &sizes,
        &rows,
        mpi.as_deref(),
    ))
}

/// Every size, out of place and in place, on this rank: (bytes, (µs, wrong), (µs, wrong)).
fn bench_rank(comm: &mut Communicator, a: &Args, sizes: &[u64]) -> Result<Vec<Row>> {
    let max_n = (sizes.last().copied().unwrap_or(4) / 4) as usize;
    let mut rank = Rank::new(comm, max_n, a.packet_max_bytes)?;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let n = (bytes / 4) as usize;
        let mut row = (bytes, (0.0, 0), (0.0, 0));
        for in_place in [false, true] {
            let wrong = rank.check(comm, n, in_place, a.threads)?;
            let us = rank.time(comm, n, in_place, a)?;
            *(if in_place { &mut row.2 } else { &mut row.1 }) = (us, wrong);
        }
        rows.push(row);
    }
    Ok(rows)
}

/// One rank of a job a launcher started: benchmark, gather every rank's rows, rank 0
/// prints.
fn run_launched_rank(a: &Args, sizes: &[u64]) -> Result<bool> {
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

/// Starts this program once per rank, as one job with torchrun's variables on this node;
/// rank 0's output is the program's.
fn launch_processes(a: &Args, mpi: Option<&[MpiRow]>) -> Result<bool> {
    let system = |context: &str, source: std::io::Error| oxccl::Error::System {
        context: context.into(),
        source,
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| system("finding a free port for the job", e))?
        .port();
    let secret: String = oxccl_bootstrap::Secret::random()?
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
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
    let mut ok = true;
    for (rank, mut child) in children.into_iter().enumerate() {
        let status = child
            .wait()
            .map_err(|e| system(&format!("waiting for rank {rank}"), e))?;
        if !status.success() {
            eprintln!("allreduce: rank {rank} failed: {status}");
            ok = false;
        }
    }
    Ok(ok)
}

/// Prints the header and one row per size (with the MPI baseline's columns if given);
/// returns whether no element was wrong. The time of a size is the slowest rank's; wrong
/// elements add up over ranks.
fn print_table(
    a: &Args,
    ranks_are: &str,
    sizes: &[u64],
    rows: &[Vec<Row>],
    mpi: Option<&[MpiRow]>,
) -> bool {
    println!(
        "# oxccl all-reduce (sum, float): {} ranks as {ranks_are}, cpu backend, {} kernel thread(s) per rank, {}",
        a.ranks,
        a.threads,
        if a.packet_max_bytes >= 4 {
            format!(
                "LL-packet ring up to {} B, then semaphore ring, over memory channels",
                a.packet_max_bytes
            )
        } else {
            "semaphore ring over memory channels".into()
        }
    );
    if mpi.is_some() {
        println!(
            "# mpi: MPI_Allreduce of Open MPI, same ranks, sizes and iterations, same machine, same run; x_mpi = oxccl time / MPI time"
        );
    }
    println!("#");
    let extra = |cols: [&str; 4]| match mpi {
        Some(_) => format!(
            " {:>9} {:>6} {:>9} {:>6}",
            cols[0], cols[1], cols[2], cols[3]
        ),
        None => String::new(),
    };
    println!("#{:>77}{:>36}", "out-of-place", "in-place");
    println!(
        "#{:>11} {:>12} {:>7} {:>6} {:>5} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6}{}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        extra(["mpi", "x_mpi", "mpi_ip", "x_mpi"])
    );
    println!(
        "#{:>11} {:>12} {:>7} {:>6} {:>5} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6}{}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        extra(["(us)", "", "(us)", ""])
    );
    let factor = 2.0 * (a.ranks as f64 - 1.0) / a.ranks as f64;
    let (mut busbw_sum, mut total_wrong) = (0.0, 0u64);
    // Sums of ln(x_mpi) out of place and in place, and how many sizes had a baseline.
    let mut log_ratios = (0.0f64, 0.0f64, 0u32);
    for (i, &bytes) in sizes.iter().enumerate() {
        let pick = |f: fn(&Row) -> (f64, u64)| {
            rows.iter().fold((0.0f64, 0u64), |(t, w), r| {
                let (tt, ww) = f(&r[i]);
                (t.max(tt), w + ww)
            })
        };
        let (oop, inp) = (pick(|r| r.1), pick(|r| r.2));
        let cols = |(us, wrong): (f64, u64)| {
            let algbw = bytes as f64 / (us * 1e-6) / 1e9;
            (us, algbw, algbw * factor, wrong)
        };
        let (o, p) = (cols(oop), cols(inp));
        busbw_sum += o.2 + p.2;
        total_wrong += o.3 + p.3;
        let baseline = match mpi.and_then(|m| m.iter().find(|r| r.0 == bytes)) {
            Some(&(_, mpi_oop, mpi_ip, mpi_wrong)) => {
                total_wrong += mpi_wrong;
                let (x_oop, x_ip) = (o.0 / mpi_oop, p.0 / mpi_ip);
                log_ratios.0 += x_oop.ln();
                log_ratios.1 += x_ip.ln();
                log_ratios.2 += 1;
                format!(" {mpi_oop:>9.2} {x_oop:>6.2} {mpi_ip:>9.2} {x_ip:>6.2}")
            }
            None => String::new(),
        };
        println!(
            " {:>11} {:>12} {:>7} {:>6} {:>5} {:>9.2} {:>7.2} {:>7.2} {:>6} {:>9.2} {:>7.2} {:>7.2} {:>6}{baseline}",
            bytes,
            bytes / 4,
            "float",
            "sum",
            -1,
            o.0,
            o.1,
            o.2,
            o.3,
            p.0,
            p.1,
            p.2,
            p.3
        );
    }
    println!(
        "# Out of bounds values : {total_wrong} {}",
        if total_wrong == 0 { "OK" } else { "FAILED" }
    );
    println!(
        "# Avg bus bandwidth    : {:.4}",
        busbw_sum / (2 * sizes.len().max(1)) as f64
    );
    if log_ratios.2 > 0 {
        let n = f64::from(log_ratios.2);
        println!(
            "# vs MPI_Allreduce     : geometric mean of x_mpi {:.2} out-of-place, {:.2} in-place",
            (log_ratios.0 / n).exp(),
            (log_ratios.1 / n).exp()
        );
    }
    total_wrong == 0
}

/// One size of the MPI baseline: (bytes, out-of-place µs, in-place µs, wrong elements).
type MpiRow = (u64, f64, f64, u64);

/// The baseline's C source, built with `mpicc` on first use.
const MPI_SOURCE: &str = include_str!("../../mpi/allreduce_mpi.c");

/// Where a run hands the baseline to the processes it starts (rank 0 prints it).
const MPI_BASELINE_ENV: &str = "OXCCL_ALLREDUCE_MPI_BASELINE";

/// Builds (once, next to this program) and runs the MPI baseline with the same ranks,
/// sizes and iterations.
fn run_mpi_baseline(a: &Args, sizes: &[u64]) -> Result<Vec<MpiRow>> {
    let fail = |what: String| {
        oxccl::Error::InvalidUsage(format!(
            "--mpi: {what} (it needs Open MPI's mpicc and mpirun; on Debian: apt-get install openmpi-bin libopenmpi-dev)"
        ))
    };
    let exe =
        std::env::current_exe().map_err(|e| fail(format!("cannot find this program: {e}")))?;
    let dir = exe
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("oxccl-mpi");
    std::fs::create_dir_all(&dir)
        .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    let (src, bin) = (dir.join("allreduce_mpi.c"), dir.join("allreduce_mpi"));
    if std::fs::read_to_string(&src).ok().as_deref() != Some(MPI_SOURCE) || !bin.exists() {
        std::fs::write(&src, MPI_SOURCE)
            .map_err(|e| fail(format!("cannot write {}: {e}", src.display())))?;
        let status = std::process::Command::new("mpicc")
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .map_err(|e| fail(format!("cannot run mpicc: {e}")))?;
        if !status.success() {
            return Err(fail(format!("mpicc failed: {status}")));
        }
    }
    let (min, max) = (
        sizes.first().copied().unwrap_or(4),
        sizes.last().copied().unwrap_or(4),
    );
    let numbers = [
        min,
        max,
        a.step_factor.max(2),
        u64::from(a.iters),
        u64::from(a.warmup),
    ];
    let output = std::process::Command::new("mpirun")
        .args([
            "-np",
            &a.ranks.to_string(),
            "--oversubscribe",
            "--bind-to",
            "none",
        ])
        // Shared memory between the ranks, without the cross-process copy mechanism that
        // containers often forbid.
        .args(["--mca", "btl", "self,vader"])
        .args(["--mca", "btl_vader_single_copy_mechanism", "none"])
        .arg(&bin)
        .args(numbers.map(|v| v.to_string()))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| fail(format!("cannot run mpirun: {e}")))?;
    if !output.status.success() {
        return Err(fail(format!("mpirun failed: {}", output.status)));
    }
    let rows = parse_mpi_rows(&String::from_utf8_lossy(&output.stdout));
    let expected: Vec<u64> = sizes.to_vec();
    if rows.iter().map(|r| r.0).collect::<Vec<_>>() != expected {
        return Err(fail(format!(
            "the baseline reported sizes {:?}, expected {expected:?}",
            rows.iter().map(|r| r.0).collect::<Vec<_>>()
        )));
    }
    Ok(rows)
}

/// Reads `<bytes> <out-of-place us> <in-place us> <wrong>` lines; anything else is skipped.
fn parse_mpi_rows(text: &str) -> Vec<MpiRow> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            Some((
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// The baseline as the processes this program starts receive it (see [`parse_mpi_rows`]).
fn encode_mpi_rows(rows: &[MpiRow]) -> String {
    rows.iter()
        .map(|r| format!("{} {} {} {}", r.0, r.1, r.2, r.3))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::{encode_mpi_rows, parse_mpi_rows};

    /// Guards against the baseline's figures being misread (a wrong column would put MPI's
    /// in-place time under out-of-place) or mpirun's chatter being taken for a row.
    #[test]
    fn mpi_rows_parse_and_round_trip() {
        let text = "warning: something\n8 1.240 0.445 0\n32 0.5 0.6 2\nnot a row\n";
        let rows = parse_mpi_rows(text);
        assert_eq!(rows, [(8, 1.24, 0.445, 0), (32, 0.5, 0.6, 2)]);
        assert_eq!(parse_mpi_rows(&encode_mpi_rows(&rows)), rows);
    }
}
