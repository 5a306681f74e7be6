//! The probe table of `build-ptx --check`: what each probe kernel (one device primitive, see
//! `oxccl_kernels::probes`) costs per architecture, beside what nvcc gives the same
//! primitive of MSCCL++.
//!
//! The references are the registers per thread nvcc 12.9 reports for MSCCL++'s primitive in
//! a kernel of its own, at sm_90; the table shows them for every architecture, so ratios at
//! sm_70 and sm_80 compare across architectures and read as a trend only. Spills fail the
//! check elsewhere; registers above the reference are reported, not failed.

use oxccl_build::FunctionStats;
use oxccl_build::report::text_table;
use std::fmt::Write as _;

/// Name prefix of the probe kernels.
pub const PREFIX: &str = "probe_";

/// Architecture the references were measured at.
pub const REFERENCE_ARCH: &str = "sm_90";

/// Per probe: the MSCCL++ primitive it matches and the registers nvcc 12.9 gives that
/// primitive at sm_90. Probes without a measured reference are not listed.
pub const REFERENCES: &[(&str, &str, u32)] = &[
    ("probe_fifo_push", "FifoDeviceHandle::push", 18),
    ("probe_fifo_push_sync", "FifoDeviceHandle::push + sync", 20),
    ("probe_port_put", "PortChannelDeviceHandle::put", 18),
    (
        "probe_port_put_with_signal",
        "PortChannelDeviceHandle::putWithSignal",
        18,
    ),
    (
        "probe_port_put_with_signal_and_flush",
        "PortChannelDeviceHandle::putWithSignalAndFlush",
        18,
    ),
    ("probe_port_flush", "PortChannelDeviceHandle::flush", 18),
    ("probe_port_wait", "PortChannelDeviceHandle::wait", 16),
    (
        "probe_semaphore_wait",
        "MemoryDevice2DeviceSemaphoreDeviceHandle::wait",
        16,
    ),
    ("probe_memory_put", "MemoryChannelDeviceHandle::put", 18),
    (
        "probe_memory_signal",
        "MemoryChannelDeviceHandle::signal",
        8,
    ),
    (
        "probe_memory_relaxed_signal",
        "MemoryChannelDeviceHandle::relaxedSignal",
        8,
    ),
    ("probe_ll16_put_packets", "putPackets<LL16Packet>", 14),
    ("probe_ll16_unpack_packets", "unpackPackets<LL16Packet>", 12),
    ("probe_ll8_put_packets", "putPackets<LL8Packet>", 12),
    ("probe_ll8_unpack_packets", "unpackPackets<LL8Packet>", 10),
    ("probe_ll8_read", "LL8Packet::read", 10),
];

/// The reference registers of probe `name`, if measured.
pub fn reference(name: &str) -> Option<u32> {
    REFERENCES
        .iter()
        .find(|(probe, _, _)| *probe == name)
        .map(|r| r.2)
}

/// One table per architecture, in the order `rows` (architecture, probe statistics) first
/// name them: registers, spills, stack, the reference, the ratio, and the geometric mean of
/// the ratios. Rows of other kernels are left out.
pub fn tables(rows: &[(String, FunctionStats)]) -> String {
    let mut arches: Vec<&str> = Vec::new();
    for (arch, f) in rows {
        if f.name.starts_with(PREFIX) && !arches.contains(&arch.as_str()) {
            arches.push(arch);
        }
    }
    let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    let mut s = String::new();
    for arch in arches {
        let mut probes: Vec<&FunctionStats> = rows
            .iter()
            .filter(|(a, f)| a == arch && f.name.starts_with(PREFIX))
            .map(|(_, f)| f)
            .collect();
        probes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut cells: Vec<[String; 8]> = vec![[
            "arch".into(),
            "probe".into(),
            "registers".into(),
            "spill st".into(),
            "spill ld".into(),
            "stack".into(),
            format!("ref {REFERENCE_ARCH}"),
            "ratio".into(),
        ]];
        let mut ratios = Vec::new();
        for f in probes {
            let refs = reference(&f.name);
            let ratio = match (f.registers, refs) {
                (Some(r), Some(n)) => {
                    let x = f64::from(r) / f64::from(n);
                    ratios.push(x);
                    format!("{x:.2}")
                }
                _ => "-".into(),
            };
            cells.push([
                arch.to_string(),
                f.name.clone(),
                opt(f.registers.map(u64::from)),
                opt(f.spill_stores),
                opt(f.spill_loads),
                opt(f.stack_frame),
                refs.map_or("-".into(), |n| n.to_string()),
                ratio,
            ]);
        }
        s.push_str(&text_table(&cells, 2));
        match geometric_mean(&ratios) {
            Some(g) => {
                let _ = writeln!(
                    s,
                    "{arch}: geometric mean of the register ratios: {g:.2} ({} probes with an \
                     nvcc 12.9 / MSCCL++ reference at {REFERENCE_ARCH})",
                    ratios.len()
                );
            }
            None => {
                let _ = writeln!(s, "{arch}: no probe has a reference");
            }
        }
        s.push('\n');
    }
    s
}

/// A line for each probe at [`REFERENCE_ARCH`] that uses more registers than its reference.
pub fn above_reference(rows: &[(String, FunctionStats)]) -> Vec<String> {
    rows.iter()
        .filter(|(arch, _)| arch == REFERENCE_ARCH)
        .filter_map(|(arch, f)| {
            let (r, n) = (f.registers?, reference(&f.name)?);
            let primitive = REFERENCES.iter().find(|p| p.0 == f.name)?.1;
            (r > n).then(|| {
                format!(
                    "{arch} `{}` uses {r} registers, above the {n} nvcc 12.9 gives MSCCL++'s \
                     {primitive}",
                    f.name
                )
            })
        })
        .collect()
}

/// The geometric mean of `xs` (positive), if there are any.
fn geometric_mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| (xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(name: &str, registers: u32) -> FunctionStats {
        FunctionStats {
            name: name.into(),
            is_entry: true,
            registers: Some(registers),
            stack_frame: Some(0),
            spill_stores: Some(0),
            spill_loads: Some(0),
            shared_mem: 0,
        }
    }

    /// Guards against a wrong summary: the geometric mean of the ratios (2 and 0.5 give 1),
    /// probes without a reference left out of it, other kernels left out of the table.
    #[test]
    fn tables_per_arch_with_ratios_and_their_geometric_mean() {
        let rows = vec![
            ("sm_90".to_string(), stats("probe_fifo_push", 36)),
            ("sm_90".to_string(), stats("probe_memory_signal", 4)),
            ("sm_90".to_string(), stats("probe_memory_get", 30)),
            ("sm_90".to_string(), stats("port_pingpong", 50)),
            ("sm_70".to_string(), stats("probe_fifo_push", 18)),
        ];
        let t = tables(&rows);
        assert!(!t.contains("port_pingpong"), "{t}");
        assert!(
            t.contains("sm_90: geometric mean of the register ratios: 1.00 (2 probes"),
            "{t}"
        );
        assert!(
            t.contains("sm_70: geometric mean of the register ratios: 1.00 (1 probes"),
            "{t}"
        );
        let get = t.lines().find(|l| l.contains("probe_memory_get")).unwrap();
        let words: Vec<&str> = get.split_whitespace().collect();
        assert_eq!(words[words.len() - 2..], ["-", "-"], "{get}");
        let push = t
            .lines()
            .find(|l| l.starts_with("sm_90") && l.contains("probe_fifo_push"))
            .unwrap();
        assert!(push.ends_with("18   2.00"), "{push}");
    }

    /// Guards against registers above the reference going unreported (at the reference's
    /// architecture only).
    #[test]
    fn registers_above_the_reference_are_reported() {
        let rows = vec![
            ("sm_90".to_string(), stats("probe_fifo_push", 19)),
            ("sm_90".to_string(), stats("probe_port_wait", 16)),
            ("sm_80".to_string(), stats("probe_port_wait", 40)),
        ];
        let lines = above_reference(&rows);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("`probe_fifo_push` uses 19 registers, above the 18"));
    }

    /// Guards against a reference for a probe that does not exist or is not checked: every
    /// referenced probe has a line in the PTX rules' expectations.
    #[test]
    fn every_reference_names_an_expected_probe() {
        for (probe, _, _) in REFERENCES {
            assert!(
                crate::ptx_rules::EXPECTATIONS
                    .iter()
                    .any(|e| e.kernels == *probe),
                "{probe}"
            );
        }
    }
}
