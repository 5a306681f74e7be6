//! `--plot FILE.svg`: bus bandwidth against size, one line per algorithm and placement of
//! oxccl (an all-reduce whose sizes take packets and then direct has two lines per
//! placement, each over its own sizes) and, with `--mpi`, one per MPI variant (out of
//! place); the memory baseline as a flat line. Both axes are logarithmic.

use super::report::Report;
use oxccl::{Error, Result};
use plotters::prelude::*;
use std::path::Path;

/// One line of the plot: its label and its (size, busbw) points.
pub type Series = (String, Vec<(f64, f64)>);

/// The plot's lines, in drawing order.
pub fn series(r: &Report) -> Vec<Series> {
    let mut lines: Vec<Series> = Vec::new();
    for in_place in [false, true] {
        let placement = if in_place { "in-place" } else { "out-of-place" };
        for s in &r.sizes {
            let Some(t) = (if in_place {
                s.in_place
            } else {
                Some(s.out_of_place)
            }) else {
                continue;
            };
            let label = format!("oxccl {} {placement}", s.algo);
            let point = (s.bytes as f64, r.bandwidth(s.bytes, t.time_us).busbw);
            match lines.iter_mut().find(|l| l.0 == label) {
                Some(line) => line.1.push(point),
                None => lines.push((label, vec![point])),
            }
        }
    }
    for v in r.mpi.iter().flat_map(|m| &m.variants) {
        let points = r
            .sizes
            .iter()
            .filter_map(|s| {
                let row = v.rows.iter().find(|row| row.count == s.count)?;
                Some((s.bytes as f64, r.bandwidth(s.bytes, row.time_us).busbw))
            })
            .collect();
        lines.push((format!("MPI {} out-of-place", v.name), points));
    }
    lines
}

/// Draws the report into `path` (SVG).
///
/// # Errors
/// The file cannot be written, or the report has no size.
pub fn plot(r: &Report, path: &Path) -> Result<()> {
    let lines = series(r);
    let points = || lines.iter().flat_map(|l| &l.1);
    let (Some(min_x), Some(max_x)) = (
        points().map(|p| p.0).min_by(f64::total_cmp),
        points().map(|p| p.0).max_by(f64::total_cmp),
    ) else {
        return Err(Error::InvalidUsage(
            "--plot: the run has no size to plot".into(),
        ));
    };
    let memory = r.memory.map(|m| m.gbps);
    // Log-log: small sizes sit orders of magnitude below large ones.
    let ys = || {
        points()
            .map(|p| p.1)
            .chain(memory)
            .filter(|y| y.is_finite() && *y > 0.0)
    };
    let max_y = ys().fold(1e-6f64, f64::max) * 2.0;
    let min_y = ys().fold(max_y, f64::min) / 2.0;
    let failed = |e: &dyn std::fmt::Display| {
        Error::InvalidUsage(format!("--plot: cannot draw {}: {e}", path.display()))
    };
    let root = SVGBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    let plan = &r.setup.plan;
    let what = if plan.collective.reduces() {
        format!("{}, {}", plan.op.name(), plan.dtype.name())
    } else {
        plan.dtype.name().to_string()
    };
    let caption = format!(
        "oxccl {} ({what}), {} ranks: bus bandwidth",
        plan.collective.title(),
        plan.ranks
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (min_x.max(1.0)..max_x.max(2.0)).log_scale(),
            (min_y..max_y).log_scale(),
        )
        .map_err(|e| failed(&e))?;
    chart
        .configure_mesh()
        .x_desc("size (bytes)")
        .y_desc("busbw (GB/s)")
        .x_label_formatter(&|x| human_bytes(*x))
        .draw()
        .map_err(|e| failed(&e))?;
    for (i, (label, points)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| failed(&e))?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| failed(&e))?;
    }
    if let Some(gbps) = memory {
        let grey = RGBColor(80, 80, 80);
        chart
            .draw_series(LineSeries::new(
                [(min_x.max(1.0), gbps), (max_x.max(2.0), gbps)],
                grey.stroke_width(2),
            ))
            .map_err(|e| failed(&e))?
            .label("memory: 2 threads c = a + b (3 arrays counted)")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| failed(&e))?;
    root.present().map_err(|e| failed(&e))?;
    Ok(())
}

/// Line colours, distinct on white.
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// `1024` as `1K`, `3145728` as `3M`.
fn human_bytes(b: f64) -> String {
    let b = b.round() as u64;
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}
