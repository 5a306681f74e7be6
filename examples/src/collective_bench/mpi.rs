//! The MPI baseline (`--mpi`): Open MPI's counterpart of the collective with the same
//! ranks, counts, element type, operation, root and iterations, timed in the same run by
//! `examples/mpi/collectives_mpi.c` (built with `mpicc` on first use), under each of a few
//! launch variants; the report compares oxccl with the fastest variant of each size.
//!
//! Variants: `plain` (shared memory through the `vader` BTL, without the cross-process copy
//! mechanism containers often forbid), `hugetlb` (the same, with glibc's malloc asking for
//! transparent huge pages: `-x GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) and `ucx` (`--mca
//! pml ucx`, allowed to use shared-memory transports, when `ompi_info` lists the UCX PML).
//! A variant that fails is left out with a
//! note, as is the whole baseline where MPI has no counterpart: `f16`/`bf16` reductions (MPI
//! has no half types; collectives that only move data move them as `MPI_UINT16_T`) and
//! `avg`.

use super::collective::Collective;
use super::options::CheckMode;
use super::plan::Plan;
use oxccl::{DataType, Error, ReduceOp, Result};
use serde::{Deserialize, Serialize};

/// The baseline's C source.
const MPI_SOURCE: &str = include_str!("../../mpi/collectives_mpi.c");

/// One count of one variant.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MpiRow {
    /// The call's count.
    pub count: u64,
    /// Out of place, µs.
    pub time_us: f64,
    /// In place, µs (`None` where the baseline has none).
    pub time_us_ip: Option<f64>,
    /// Wrong elements of MPI's result, over its checked calls.
    pub wrong: u64,
}

/// One launch variant's rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MpiVariant {
    /// Its name (`plain`, `hugetlb`, `ucx`).
    pub name: String,
    /// The `mpirun` options that make it.
    pub options: String,
    /// One row per count.
    pub rows: Vec<MpiRow>,
}

/// The baseline of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MpiBaseline {
    /// What was timed (`MPI_Allreduce (MPI_FLOAT, MPI_SUM)`), or empty when skipped.
    pub what: String,
    /// The variants that ran.
    pub variants: Vec<MpiVariant>,
    /// Why a variant, or the whole baseline, was skipped.
    pub notes: Vec<String>,
}

/// The fastest variant's time for one count and placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Best {
    /// µs.
    pub time_us: f64,
    /// The variant's name.
    pub variant: String,
}

impl MpiBaseline {
    /// The fastest variant for `count`, out of place (`in_place` false) or in place.
    pub fn best(&self, count: u64, in_place: bool) -> Option<Best> {
        self.variants
            .iter()
            .filter_map(|v| {
                let row = v.rows.iter().find(|r| r.count == count)?;
                let t = if in_place {
                    row.time_us_ip?
                } else {
                    row.time_us
                };
                Some(Best {
                    time_us: t,
                    variant: v.name.clone(),
                })
            })
            .min_by(|a, b| a.time_us.total_cmp(&b.time_us))
    }

    /// Wrong elements of MPI's results for `count`, over every variant.
    pub fn wrong(&self, count: u64) -> u64 {
        self.variants
            .iter()
            .flat_map(|v| v.rows.iter().filter(|r| r.count == count))
            .map(|r| r.wrong)
            .sum()
    }
}

/// MPI's name for an element type in this collective, if it has one.
pub fn mpi_datatype(
    collective: Collective,
    dtype: DataType,
) -> Option<(&'static str, &'static str)> {
    Some(match dtype {
        DataType::F32 => ("f32", "MPI_FLOAT"),
        DataType::F64 => ("f64", "MPI_DOUBLE"),
        DataType::I8 => ("i8", "MPI_INT8_T"),
        DataType::U8 => ("u8", "MPI_UINT8_T"),
        DataType::I32 => ("i32", "MPI_INT32_T"),
        DataType::U32 => ("u32", "MPI_UINT32_T"),
        DataType::I64 => ("i64", "MPI_INT64_T"),
        DataType::U64 => ("u64", "MPI_UINT64_T"),
        // Moving halves is moving 16-bit words; reducing them MPI cannot do.
        DataType::F16 | DataType::Bf16 if !collective.reduces() => ("u16", "MPI_UINT16_T"),
        DataType::F16 | DataType::Bf16 => return None,
    })
}

/// MPI's name for an operation, if it has one (`avg` it has not).
pub fn mpi_op(op: ReduceOp) -> Option<(&'static str, &'static str)> {
    match op {
        ReduceOp::Sum => Some(("sum", "MPI_SUM")),
        ReduceOp::Prod => Some(("prod", "MPI_PROD")),
        ReduceOp::Min => Some(("min", "MPI_MIN")),
        ReduceOp::Max => Some(("max", "MPI_MAX")),
        ReduceOp::Avg => None,
    }
}

/// The launch options that keep Open MPI on TCP (the `tcp` variant, when the ranks reach
/// each other over Ethernet).
const TCP_OPTIONS: &str = "--mca pml ob1 --mca btl tcp,self";

/// Builds (once, next to this program) and runs the baseline under every variant; only
/// `tcp` when `OXCCL_TRANSPORT=ethernet`.
///
/// # Errors
/// mpicc or mpirun missing or failing for every variant, or a variant reporting other
/// counts than asked.
pub fn run_mpi_baseline(plan: &Plan) -> Result<MpiBaseline> {
    let c = plan.collective;
    let Some((type_arg, type_name)) = mpi_datatype(c, plan.dtype) else {
        return Ok(skipped(format!(
            "no MPI counterpart: MPI cannot reduce {} (no half-precision types)",
            plan.dtype.name()
        )));
    };
    let op = if c.reduces() {
        match mpi_op(plan.op) {
            Some(op) => Some(op),
            None => {
                return Ok(skipped(format!(
                    "no MPI counterpart: MPI has no {} operation",
                    plan.op.name()
                )));
            }
        }
    } else {
        None
    };
    let bin = build()?;
    let mut args: Vec<String> = vec![
        c.name().into(),
        type_arg.into(),
        op.map_or("sum", |o| o.0).into(),
        plan.root.to_string(),
        plan.iters.max(1).to_string(),
        plan.warmup.to_string(),
        super::measure::SETTLE.as_millis().to_string(),
        if plan.check == CheckMode::Every {
            "alone"
        } else {
            "b2b"
        }
        .into(),
    ];
    args.extend(plan.counts.iter().map(u64::to_string));
    let mut baseline = MpiBaseline {
        what: match op {
            Some((_, op)) => format!("{} ({type_name}, {op})", c.mpi_function()),
            None => format!("{} ({type_name})", c.mpi_function()),
        },
        ..MpiBaseline::default()
    };
    // Ranks that reach each other over Ethernet are measured against MPI over TCP alone:
    // its shared-memory transports would be another race.
    if matches!(
        oxccl::TransportChoice::from_env(),
        Ok(Some(oxccl::TransportChoice::Ethernet))
    ) {
        baseline.notes.push(format!(
            "{}=ethernet: MPI forced onto TCP too (tcp: {TCP_OPTIONS})",
            oxccl::transport::TRANSPORT_ENV
        ));
        let tcp = TCP_OPTIONS.split(' ').map(String::from).collect();
        collect_variants(&bin, plan, &args, vec![("tcp", tcp)], &mut baseline);
    } else {
        let mut variants = vec![
            ("plain", vec![]),
            (
                "hugetlb",
                vec![
                    "-x".to_string(),
                    "GLIBC_TUNABLES=glibc.malloc.hugetlb=1".into(),
                ],
            ),
        ];
        if has_ucx() {
            // Open MPI 4.1 declines the UCX PML where UCX finds only shared-memory transports
            // (its list of supported ones names network devices) unless told to take any.
            let ucx =
                "--mca pml ucx --mca opal_common_ucx_tls any --mca opal_common_ucx_devices any";
            variants.push(("ucx", ucx.split(' ').map(String::from).collect()));
        } else {
            baseline
                .notes
                .push("ucx skipped: `ompi_info` lists no UCX PML".into());
        }
        collect_variants(&bin, plan, &args, variants, &mut baseline);
    }
    if baseline.variants.is_empty() {
        return Err(fail(format!(
            "no variant of the baseline ran: {}",
            baseline.notes.join("; ")
        )));
    }
    Ok(baseline)
}

/// Reads the baseline's `<count> <out-of-place us> <in-place us or -> <wrong>` lines;
/// anything else (mpirun's chatter) is skipped.
pub fn parse_mpi_rows(text: &str) -> Vec<MpiRow> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let count = f.next()?.parse().ok()?;
            let time_us = f.next()?.parse().ok()?;
            let time_us_ip = match f.next()? {
                "-" => None,
                t => Some(t.parse().ok()?),
            };
            let wrong = f.next()?.parse().ok()?;
            f.next().is_none().then_some(MpiRow {
                count,
                time_us,
                time_us_ip,
                wrong,
            })
        })
        .collect()
}

fn skipped(why: String) -> MpiBaseline {
    MpiBaseline {
        notes: vec![why],
        ..MpiBaseline::default()
    }
}

fn fail(what: String) -> Error {
    Error::InvalidUsage(format!(
        "--mpi: {what} (it needs Open MPI's mpicc and mpirun; on Debian: apt-get install \
         openmpi-bin libopenmpi-dev)"
    ))
}

/// Whether this Open MPI has the UCX PML (`ompi_info` lists `MCA pml: ucx`; its configure
/// line alone, `--with-ucx`, does not make one).
fn has_ucx() -> bool {
    std::process::Command::new("ompi_info")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.to_ascii_lowercase().contains("pml: ucx"))
        })
        .unwrap_or(false)
}

/// Builds the baseline next to this program, unless the same source was built there before.
fn build() -> Result<std::path::PathBuf> {
    let exe =
        std::env::current_exe().map_err(|e| fail(format!("cannot find this program: {e}")))?;
    let dir = exe
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("oxccl-mpi");
    std::fs::create_dir_all(&dir)
        .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    let (src, bin) = (dir.join("collectives_mpi.c"), dir.join("collectives_mpi"));
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
    Ok(bin)
}

/// Runs each launch variant of the baseline program and keeps the ones that reported
/// every count (the others are noted with the reason).
fn collect_variants(
    bin: &std::path::Path,
    plan: &Plan,
    args: &[String],
    variants: Vec<(&str, Vec<String>)>,
    baseline: &mut MpiBaseline,
) {
    for (name, extra) in variants {
        match run_variant(bin, plan.ranks, &extra, args) {
            Ok(rows) if rows.iter().map(|r| r.count).eq(plan.counts.iter().copied()) => {
                baseline.variants.push(MpiVariant {
                    name: name.into(),
                    options: extra.join(" "),
                    rows,
                });
            }
            Ok(rows) => baseline.notes.push(format!(
                "{name} left out: it reported counts {:?}, expected {:?}",
                rows.iter().map(|r| r.count).collect::<Vec<_>>(),
                plan.counts
            )),
            Err(e) => baseline.notes.push(format!("{name} left out: {e}")),
        }
    }
}

fn run_variant(
    bin: &std::path::Path,
    ranks: u32,
    extra: &[String],
    args: &[String],
) -> std::result::Result<Vec<MpiRow>, String> {
    let mut mpirun = std::process::Command::new("mpirun");
    mpirun.args([
        "-np",
        &ranks.to_string(),
        "--oversubscribe",
        "--bind-to",
        "none",
    ]);
    if !extra.iter().any(|a| a == "btl") {
        // Shared memory between the ranks, without the cross-process copy mechanism that
        // containers often forbid (unless the variant names its own transports).
        mpirun.args(["--mca", "btl", "self,vader"]).args([
            "--mca",
            "btl_vader_single_copy_mechanism",
            "none",
        ]);
    }
    let output = mpirun
        .args(extra)
        .arg(bin)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .map_err(|e| format!("cannot run mpirun: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        return Err(format!(
            "mpirun failed: {}{}",
            output.status,
            last.map(|l| format!(" ({})", l.trim())).unwrap_or_default()
        ));
    }
    Ok(parse_mpi_rows(&String::from_utf8_lossy(&output.stdout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the baseline's figures being misread (a wrong column would put MPI's
    /// in-place time under out-of-place), an in-place time of `-` being lost, or mpirun's
    /// chatter being taken for a row.
    #[test]
    fn mpi_rows_parse() {
        let text = "warning: something\n8 1.240 0.445 0\n32 0.5 - 2\nnot a row\n9 1 2 3 4\n";
        let rows = parse_mpi_rows(text);
        assert_eq!(
            rows,
            [
                MpiRow {
                    count: 8,
                    time_us: 1.24,
                    time_us_ip: Some(0.445),
                    wrong: 0
                },
                MpiRow {
                    count: 32,
                    time_us: 0.5,
                    time_us_ip: None,
                    wrong: 2
                }
            ]
        );
    }

    /// Guards against the best variant being picked per run instead of per size and
    /// placement, or a variant missing a size being taken for the fastest.
    #[test]
    fn best_variant_per_size_and_placement() {
        let row = |count, t, ip| MpiRow {
            count,
            time_us: t,
            time_us_ip: ip,
            wrong: 0,
        };
        let variant = |name: &str, rows| MpiVariant {
            name: name.into(),
            options: String::new(),
            rows,
        };
        let b = MpiBaseline {
            what: String::new(),
            variants: vec![
                variant(
                    "plain",
                    vec![row(1, 2.0, Some(1.0)), row(2, 5.0, Some(5.0))],
                ),
                variant("ucx", vec![row(1, 1.0, Some(3.0))]),
            ],
            notes: vec![],
        };
        assert_eq!(b.best(1, false).unwrap().variant, "ucx");
        assert_eq!(b.best(1, true).unwrap().variant, "plain");
        assert_eq!(b.best(2, false).unwrap().time_us, 5.0);
        assert_eq!(b.best(3, false), None);
    }

    /// Guards against a baseline being run where MPI has no counterpart (its figures would
    /// be of another computation).
    #[test]
    fn counterparts() {
        assert_eq!(mpi_datatype(Collective::AllReduce, DataType::F16), None);
        assert_eq!(
            mpi_datatype(Collective::AllGather, DataType::Bf16)
                .unwrap()
                .1,
            "MPI_UINT16_T"
        );
        assert_eq!(
            mpi_datatype(Collective::Reduce, DataType::I8).unwrap().1,
            "MPI_INT8_T"
        );
        assert_eq!(mpi_op(ReduceOp::Avg), None);
        assert_eq!(mpi_op(ReduceOp::Prod).unwrap().1, "MPI_PROD");
    }
}
