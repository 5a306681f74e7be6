//! What ptxas said about kernels, as tables of text in aligned columns (`oxccl-build
//! --check` and `cargo xtask build-ptx --check` print them).

use crate::ptxas::FunctionStats;
use std::fmt::Write;

/// The warning for a function that spills registers, or `None` if it does not:
/// ``WARNING: sm_90 my_kernels: `name` spills registers (8 bytes stored, 8 loaded)``.
pub fn spill_warning(arch: &str, lib: &str, f: &FunctionStats) -> Option<String> {
    f.spills().then(|| {
        format!(
            "WARNING: {arch} {lib}: `{}` spills registers ({} bytes stored, {} loaded)",
            f.name,
            f.spill_stores.unwrap_or(0),
            f.spill_loads.unwrap_or(0)
        )
    })
}

/// The per-kernel table: one row per kernel and architecture of `rows` (`(arch, crate,
/// what ptxas said)`) with registers, stack frame, spill stores and loads and static shared
/// memory, and a `(no kernels)` row for each module of `modules` (`(arch, crate)`) that has
/// no row. Surrounded by blank lines.
pub fn kernel_table(rows: &[(String, String, FunctionStats)], modules: &[(&str, &str)]) -> String {
    let opt = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    let mut cells: Vec<[String; 8]> = vec![[
        "arch".into(),
        "crate".into(),
        "kernel".into(),
        "registers".into(),
        "stack".into(),
        "spill st".into(),
        "spill ld".into(),
        "smem".into(),
    ]];
    for (arch, lib, f) in rows {
        cells.push([
            arch.clone(),
            lib.clone(),
            f.name.clone(),
            opt(f.registers.map(u64::from)),
            opt(f.stack_frame),
            opt(f.spill_stores),
            opt(f.spill_loads),
            f.shared_mem.to_string(),
        ]);
    }
    for &(arch, lib) in modules {
        if !rows.iter().any(|(a, l, _)| a == arch && l == lib) {
            let mut empty: [String; 8] = Default::default();
            empty[0] = arch.to_string();
            empty[1] = lib.to_string();
            empty[2] = "(no kernels)".into();
            cells.push(empty);
        }
    }
    let mut s = String::from("\n");
    s.push_str(&text_table(&cells, 3));
    s.push('\n');
    s
}

/// `cells` as aligned columns, one line a row: the first `left_columns` columns
/// left-aligned, the rest right-aligned, two spaces between columns, and a rule of dashes
/// under the first row (the header).
pub fn text_table<const N: usize>(cells: &[[String; N]], left_columns: usize) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| cells.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut s = String::new();
    for (n, row) in cells.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, &w))| {
                if i < left_columns {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        let _ = writeln!(s, "{}", line.join("  ").trim_end());
        if n == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            let _ = writeln!(s, "{}", rule.join("  "));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spills_are_warned_about() {
        let mut f = FunctionStats {
            name: "ll16_exchange".into(),
            spill_stores: Some(0),
            spill_loads: Some(0),
            ..Default::default()
        };
        assert_eq!(spill_warning("sm_70", "k", &f), None);
        f.spill_stores = Some(36);
        f.spill_loads = Some(28);
        assert_eq!(
            spill_warning("sm_70", "k", &f).unwrap(),
            "WARNING: sm_70 k: `ll16_exchange` spills registers (36 bytes stored, 28 loaded)"
        );
    }

    #[test]
    fn table_lists_kernels_and_empty_modules() {
        let stats = FunctionStats {
            name: "port_pingpong".into(),
            is_entry: true,
            registers: Some(14),
            stack_frame: Some(0),
            spill_stores: Some(0),
            spill_loads: Some(0),
            shared_mem: 0,
        };
        let t = kernel_table(
            &[("sm_70".into(), "oxccl_device".into(), stats)],
            &[("sm_70", "oxccl_device"), ("sm_80", "oxccl_device")],
        );
        let lines: Vec<&str> = t.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("arch   crate"), "{t}");
        assert!(
            lines[2].contains("port_pingpong") && lines[2].contains("14"),
            "{t}"
        );
        assert!(
            lines[3].contains("sm_80") && lines[3].contains("(no kernels)"),
            "{t}"
        );
    }

    #[test]
    fn columns_align_and_a_rule_follows_the_header() {
        let cells = [
            ["arch".to_string(), "registers".to_string()],
            ["sm_90".to_string(), "7".to_string()],
        ];
        assert_eq!(
            text_table(&cells, 1),
            "arch   registers\n-----  ---------\nsm_90          7\n"
        );
    }
}
