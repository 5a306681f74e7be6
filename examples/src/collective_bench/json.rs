//! `--format json`: one JSON object per size and line, for scripts.
//!
//! Fields: `collective`, `ranks`, `size` (bytes), `count` (elements, as the table's
//! column), `dtype` (`--dtype`'s name), `op` (`none` for collectives that do not reduce),
//! `root` (-1 without one), `algo`, then out of place `time_us`, `algbw`, `busbw` (GB/s),
//! `wrong`, and in place the same with `_ip` (absent where there is no in-place form).
//! With `--mpi`: `mpi_time_us`, `mpi_variant`, `x_mpi` (and the `_ip` ones) for the fastest
//! variant, and `mpi` with every variant's times.

use super::options::dtype_name;
use super::report::Report;
use serde::Serialize;
use std::collections::BTreeMap;

/// One size, as a JSON line holds it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JsonRow {
    /// The collective's `--collective` name.
    pub collective: &'static str,
    /// Ranks.
    pub ranks: u32,
    /// Bytes.
    pub size: u64,
    /// Elements.
    pub count: u64,
    /// Element type.
    pub dtype: &'static str,
    /// Operation.
    pub op: &'static str,
    /// Root, or -1.
    pub root: i64,
    /// Algorithm.
    pub algo: String,
    /// Out of place: µs per call.
    pub time_us: f64,
    /// Out of place: GB/s.
    pub algbw: f64,
    /// Out of place: GB/s.
    pub busbw: f64,
    /// Out of place: wrong elements.
    pub wrong: u64,
    /// In place: µs per call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us_ip: Option<f64>,
    /// In place: GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algbw_ip: Option<f64>,
    /// In place: GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busbw_ip: Option<f64>,
    /// In place: wrong elements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wrong_ip: Option<u64>,
    /// The fastest MPI variant's time out of place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mpi_time_us: Option<f64>,
    /// Its name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mpi_variant: Option<String>,
    /// oxccl's time over it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_mpi: Option<f64>,
    /// The fastest MPI variant's time in place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mpi_time_us_ip: Option<f64>,
    /// Its name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mpi_variant_ip: Option<String>,
    /// oxccl's in-place time over it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_mpi_ip: Option<f64>,
    /// Every MPI variant's times, `[out of place, in place]` µs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub mpi: BTreeMap<String, [Option<f64>; 2]>,
}

/// The report's JSON lines, one per size.
pub fn json_lines(r: &Report) -> Vec<String> {
    let plan = &r.setup.plan;
    r.sizes
        .iter()
        .map(|s| {
            let o = r.bandwidth(s.bytes, s.out_of_place.time_us);
            let ip = s
                .in_place
                .map(|t| (r.bandwidth(s.bytes, t.time_us), t.wrong));
            let (best, best_ip) = (r.mpi_best(s, false), r.mpi_best(s, true));
            let mpi = r
                .mpi
                .iter()
                .flat_map(|m| &m.variants)
                .filter_map(|v| {
                    let row = v.rows.iter().find(|row| row.count == s.count)?;
                    Some((v.name.clone(), [Some(row.time_us), row.time_us_ip]))
                })
                .collect();
            let row = JsonRow {
                collective: plan.collective.name(),
                ranks: plan.ranks,
                size: s.bytes,
                count: s.bytes / plan.dtype.size(),
                dtype: dtype_name(plan.dtype),
                op: if plan.collective.reduces() {
                    plan.op.name()
                } else {
                    "none"
                },
                root: if plan.collective.rooted() {
                    i64::from(plan.root)
                } else {
                    -1
                },
                algo: s.algo.clone(),
                time_us: o.time_us,
                algbw: o.algbw,
                busbw: o.busbw,
                wrong: s.out_of_place.wrong,
                time_us_ip: ip.map(|(b, _)| b.time_us),
                algbw_ip: ip.map(|(b, _)| b.algbw),
                busbw_ip: ip.map(|(b, _)| b.busbw),
                wrong_ip: ip.map(|(_, w)| w),
                x_mpi: best.as_ref().map(|b| o.time_us / b.time_us),
                mpi_time_us: best.as_ref().map(|b| b.time_us),
                mpi_variant: best.map(|b| b.variant),
                x_mpi_ip: ip
                    .zip(best_ip.as_ref())
                    .map(|((b, _), m)| b.time_us / m.time_us),
                mpi_time_us_ip: best_ip.as_ref().map(|b| b.time_us),
                mpi_variant_ip: best_ip.map(|b| b.variant),
                mpi,
            };
            // Serializing plain fields and numbers cannot fail; NaN or infinite numbers
            // become `null`.
            serde_json::to_string(&row).unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective_bench::collective::Collective;
    use crate::collective_bench::measure::{SizeResult, Timing};
    use crate::collective_bench::mpi::{MpiBaseline, MpiRow, MpiVariant};
    use crate::collective_bench::options::CheckMode;
    use crate::collective_bench::plan::Plan;
    use crate::collective_bench::report::Setup;
    use oxccl::collectives::AlgorithmChoice;
    use oxccl::{DataType, ReduceOp};

    fn report(collective: Collective, in_place: Option<Timing>) -> Report {
        Report {
            setup: Setup {
                plan: Plan {
                    collective,
                    dtype: DataType::Bf16,
                    op: ReduceOp::Max,
                    root: 1,
                    ranks: 2,
                    counts: vec![512],
                    iters: 1,
                    warmup: 0,
                    check: CheckMode::First,
                    blocking: false,
                    register: true,
                },
                ranks_are: "threads".into(),
                launch: None,
                algo: AlgorithmChoice::Auto,
                packet_limit: 0,
                packet_data_from: u64::MAX,
            },
            sizes: vec![SizeResult {
                bytes: 1024,
                count: 512,
                algo: "packets".into(),
                out_of_place: Timing {
                    time_us: 2.0,
                    wrong: 0,
                },
                in_place,
            }],
            mpi: None,
            memory: None,
        }
    }

    /// Guards against the JSON lines' field names or values drifting from what scripts
    /// read: every field of an all-reduce line with and without MPI, and the in-place
    /// fields left out where a collective has no in-place form.
    #[test]
    fn json_lines_hold_every_field() {
        let mut r = report(
            Collective::AllReduce,
            Some(Timing {
                time_us: 4.0,
                wrong: 3,
            }),
        );
        let line = &json_lines(&r)[0];
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        // Bandwidths: 1024 B in 2 µs and 4 µs; a 2-rank all-reduce's bus factor is 1.
        for (field, want) in [
            ("algbw", 0.512),
            ("busbw", 0.512),
            ("algbw_ip", 0.256),
            ("busbw_ip", 0.256),
        ] {
            let got = v[field].as_f64().unwrap();
            assert!((got - want).abs() < 1e-9, "{field}: {got}");
            v.as_object_mut().unwrap().remove(field);
        }
        let want = serde_json::json!({
            "collective": "allreduce", "ranks": 2, "size": 1024, "count": 512,
            "dtype": "bf16", "op": "max", "root": -1, "algo": "packets",
            "time_us": 2.0, "wrong": 0, "time_us_ip": 4.0, "wrong_ip": 3,
        });
        assert_eq!(v, want, "{line}");
        assert!(!line.contains('\n'));

        r.mpi = Some(MpiBaseline {
            what: String::new(),
            variants: vec![MpiVariant {
                name: "ucx".into(),
                options: String::new(),
                rows: vec![MpiRow {
                    count: 512,
                    time_us: 1.0,
                    time_us_ip: Some(8.0),
                    wrong: 0,
                }],
            }],
            notes: vec![],
        });
        let v: serde_json::Value = serde_json::from_str(&json_lines(&r)[0]).unwrap();
        assert_eq!(v["mpi_variant"], "ucx");
        assert_eq!(v["x_mpi"], 2.0);
        assert_eq!(v["x_mpi_ip"], 0.5);
        assert_eq!(v["mpi"]["ucx"], serde_json::json!([1.0, 8.0]));

        let r = report(Collective::AllToAllV, None);
        let v: serde_json::Value = serde_json::from_str(&json_lines(&r)[0]).unwrap();
        assert_eq!(
            (v["op"].as_str(), v["root"].as_i64()),
            (Some("none"), Some(-1))
        );
        assert!(v.get("time_us_ip").is_none() && v.get("mpi").is_none());
        let r = report(Collective::Reduce, None);
        let v: serde_json::Value = serde_json::from_str(&json_lines(&r)[0]).unwrap();
        assert_eq!(
            (v["op"].as_str(), v["root"].as_i64()),
            (Some("max"), Some(1))
        );
    }
}
