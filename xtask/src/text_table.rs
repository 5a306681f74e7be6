//! Tables of text in aligned columns, as `build-ptx --check` prints them.

use std::fmt::Write;

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
    use super::text_table;

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
