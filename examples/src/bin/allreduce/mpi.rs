//! Open MPI's `MPI_Allreduce` with the same ranks, sizes and iterations, timed in the same
//! run as the baseline (`--mpi`).

use crate::Args;
use oxccl::Result;

/// One size of the MPI baseline: (bytes, out-of-place µs, in-place µs, wrong elements).
pub(crate) type MpiRow = (u64, f64, f64, u64);

/// The baseline's C source, built with `mpicc` on first use.
const MPI_SOURCE: &str = include_str!("../../../mpi/allreduce_mpi.c");

/// Where a run hands the baseline to the processes it starts (rank 0 prints it).
pub(crate) const MPI_BASELINE_ENV: &str = "OXCCL_ALLREDUCE_MPI_BASELINE";

/// Builds (once, next to this program) and runs the MPI baseline with the same ranks,
/// sizes and iterations.
pub(crate) fn run_mpi_baseline(a: &Args, sizes: &[u64]) -> Result<Vec<MpiRow>> {
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
pub(crate) fn parse_mpi_rows(text: &str) -> Vec<MpiRow> {
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
pub(crate) fn encode_mpi_rows(rows: &[MpiRow]) -> String {
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
