//! The nccl-tests table: one row per size, out of place and in place.

use crate::Args;
use crate::mpi::MpiRow;

/// One row: (bytes, out-of-place (time, wrong), in-place (time, wrong)).
pub(crate) type Row = (u64, (f64, u64), (f64, u64));

/// Prints the header and one row per size (with the MPI baseline's columns if given);
/// returns whether no element was wrong. The time of a size is the slowest rank's; wrong
/// elements add up over ranks.
pub(crate) fn print_table(
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
