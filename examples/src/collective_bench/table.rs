//! The nccl-tests table: `#` header lines (the set-up, the memory and MPI baselines), one
//! row per size (size, count, type, redop, root, algorithm, then time, algbw, busbw and
//! `#wrong` out of place and in place, then MPI's fastest variant), and nccl-tests' footer.

use super::collective::Collective;
use super::options::{CheckMode, algo_name};
use super::report::{Report, Setup};
use oxccl::collectives::AlgorithmChoice;
use std::fmt::Write as _;

/// The whole table as text.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    for line in header(r) {
        let _ = writeln!(out, "{line}");
    }
    let with_mpi = r.mpi.as_ref().is_some_and(|m| !m.variants.is_empty());
    let mpi_cols = |cols: [&str; 5]| {
        if with_mpi {
            format!(
                " {:>9} {:>6} {:>9} {:>6} {:>13}",
                cols[0], cols[1], cols[2], cols[3], cols[4]
            )
        } else {
            String::new()
        }
    };
    let _ = writeln!(out, "#{:>88}{:>33}", "out-of-place", "in-place");
    let names = [
        "size", "count", "type", "redop", "root", "algo", "time", "algbw", "busbw", "#wrong",
        "time", "algbw", "busbw", "#wrong",
    ];
    let units = [
        "(B)",
        "(elements)",
        "",
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
    ];
    for (cols, extra) in [
        (
            names,
            mpi_cols(["mpi", "x_mpi", "mpi_ip", "x_mpi", "mpi_best"]),
        ),
        (units, mpi_cols(["(us)", "", "(us)", "", "(oop/ip)"])),
    ] {
        let _ = writeln!(
            out,
            "#{:>11} {:>12} {:>8} {:>6} {:>5} {:>8} {:>9} {:>7} {:>7} {:>6} {:>9} {:>7} {:>7} {:>6}{extra}",
            cols[0],
            cols[1],
            cols[2],
            cols[3],
            cols[4],
            cols[5],
            cols[6],
            cols[7],
            cols[8],
            cols[9],
            cols[10],
            cols[11],
            cols[12],
            cols[13]
        );
    }
    let plan = &r.setup.plan;
    let elem = plan.dtype.size();
    for s in &r.sizes {
        let o = r.bandwidth(s.bytes, s.out_of_place.time_us);
        let ip = match s.in_place {
            Some(t) => {
                let b = r.bandwidth(s.bytes, t.time_us);
                format!(
                    "{:>9.2} {:>7.2} {:>7.2} {:>6}",
                    b.time_us, b.algbw, b.busbw, t.wrong
                )
            }
            None => format!("{:>9} {:>7} {:>7} {:>6}", "-", "-", "-", "-"),
        };
        let mpi = if with_mpi {
            let (best, best_ip) = (r.mpi_best(s, false), r.mpi_best(s, true));
            let x = |ours: Option<f64>, theirs: Option<f64>| match (ours, theirs) {
                (Some(a), Some(b)) => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            let t = |b: &Option<super::mpi::Best>| {
                b.as_ref()
                    .map_or("-".into(), |b| format!("{:.2}", b.time_us))
            };
            let name = |b: &Option<super::mpi::Best>| {
                b.as_ref().map_or("-".to_string(), |b| b.variant.clone())
            };
            format!(
                " {:>9} {:>6} {:>9} {:>6} {:>13}",
                t(&best),
                x(Some(o.time_us), best.as_ref().map(|b| b.time_us)),
                t(&best_ip),
                x(
                    s.in_place.map(|t| t.time_us),
                    best_ip.as_ref().map(|b| b.time_us)
                ),
                format!("{}/{}", name(&best), name(&best_ip))
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            " {:>11} {:>12} {:>8} {:>6} {:>5} {:>8} {:>9.2} {:>7.2} {:>7.2} {:>6} {ip}{mpi}",
            s.bytes,
            s.bytes / elem,
            plan.dtype.name(),
            if plan.collective.reduces() {
                plan.op.name()
            } else {
                "none"
            },
            if plan.collective.rooted() {
                i64::from(plan.root)
            } else {
                -1
            },
            s.algo,
            o.time_us,
            o.algbw,
            o.busbw,
            s.out_of_place.wrong,
        );
    }
    for line in footer(r) {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// How the packets travel, for the header: from which size they go as data and a signal.
fn packet_form(setup: &Setup) -> String {
    packet_form_of(setup.packet_limit, setup.packet_data_from)
}

/// [`packet_form`] of a packet limit and the smallest packet message sent as data.
fn packet_form_of(packet_limit: u64, data_from: u64) -> String {
    match data_from {
        0 => ", sent as data and a signal".into(),
        from if from <= packet_limit => format!(", sent as data and a signal from {from} B"),
        _ => String::new(),
    }
}

/// The `#` lines above the table.
fn header(r: &Report) -> Vec<String> {
    let (setup, plan) = (&r.setup, &r.setup.plan);
    let what = if plan.collective.reduces() {
        format!("{}, {}", plan.op.name(), plan.dtype.name())
    } else {
        plan.dtype.name().to_string()
    };
    let launch = match setup.launch {
        Some(l) => format!("{} block(s) of {} thread(s)", l.grid.x, l.block.x),
        None => "the library's launch shape".into(),
    };
    let algo = match (plan.collective == Collective::AllReduce, setup.algo) {
        (false, AlgorithmChoice::Auto) => "algorithm auto (direct; through the proxy where \
             ranks cannot load and store each other's memory; the algo column says which; \
             OXCCL_ALGO overrides)"
            .to_string(),
        (false, choice) => format!("algorithm {} (forced)", algo_name(choice)),
        (true, AlgorithmChoice::Auto) => format!(
            "algorithm auto (packets up to {} B{}, then direct; through the proxy where ranks \
             cannot load and store each other's memory: doubling, ports or ring; the algo \
             column says which; OXCCL_ALGO overrides)",
            setup.packet_limit,
            packet_form(setup)
        ),
        (true, choice) => format!("algorithm {} (forced)", algo_name(choice)),
    };
    let algo = if plan.registers() {
        format!(
            "{algo}; buffers registered, so direct reads the peers' buffers in place (zerocopy; --register off stages them)"
        )
    } else {
        algo
    };
    let check = match plan.check {
        CheckMode::First => format!(
            "first call of each size checked, then {} warm-up and {} timed calls {}",
            plan.warmup,
            plan.iters,
            if plan.blocking {
                "each synchronized before the next (blocking)"
            } else {
                "back to back"
            }
        ),
        CheckMode::Every => format!(
            "every timed call checked: {} warm-up calls, then {} calls each from fresh buffers, \
             synchronized alone and timed without the check",
            plan.warmup, plan.iters
        ),
    };
    let check = format!(
        "{check}; the first size is called for {} ms more before, while the new threads \
         spread over the cores",
        super::measure::SETTLE.as_millis()
    );
    let mut lines = vec![
        format!(
            "# oxccl {} ({what}): {} ranks as {}, cpu backend, {launch}, {algo}",
            plan.collective.title(),
            plan.ranks,
            setup.ranks_are
        ),
        format!("# {check}; time = the slowest rank's mean"),
    ];
    if let Some(m) = &r.memory {
        let mut line = format!(
            "# memory: {} threads computing c = a + b over {} MiB f32 arrays reach {:.2} GB/s \
             (reads of a and b and the write of c counted)",
            m.threads,
            m.array_bytes >> 20,
            m.gbps
        );
        match r.at_memory_size() {
            Some(s) => {
                let o = r.bandwidth(s.bytes, s.out_of_place.time_us);
                let _ = write!(
                    line,
                    "; oxccl's busbw at {} MiB: {:.2} GB/s out of place = {:.2}x that",
                    s.bytes >> 20,
                    o.busbw,
                    o.busbw / m.gbps
                );
                if let Some(t) = s.in_place {
                    let p = r.bandwidth(s.bytes, t.time_us);
                    let _ = write!(
                        line,
                        ", {:.2} GB/s in place = {:.2}x",
                        p.busbw,
                        p.busbw / m.gbps
                    );
                }
            }
            None => {
                let _ = write!(
                    line,
                    "; the sweep has no {} MiB size to set beside it",
                    m.array_bytes >> 20
                );
            }
        }
        lines.push(line);
        if let (Some(s), true) = (r.at_memory_size(), plan.collective == Collective::AllReduce) {
            let floor = |in_place| m.all_reduce_floor_us(s.bytes, plan.ranks, in_place);
            // The bus bandwidth of a call that takes its floor, as a share of the baseline.
            let ceiling = |in_place| r.bandwidth(s.bytes, floor(in_place)).busbw / m.gbps;
            let mut line = format!(
                "# memory floor: c = a + b moves {:.2} GB/s (each store reads its line first); \
                 an all-reduce reads every input and writes every output at least once ({} x \
                 {} MiB each), out of place reading each output line first: {:.0} us out of \
                 place, {:.0} us in place at that rate, so busbw reaches at most {:.2}x / \
                 {:.2}x the c = a + b figure; oxccl takes {:.2}x its floor out of place",
                m.moved_gbps(),
                plan.ranks,
                s.bytes >> 20,
                floor(false),
                floor(true),
                ceiling(false),
                ceiling(true),
                s.out_of_place.time_us / floor(false)
            );
            if let Some(t) = s.in_place {
                let _ = write!(line, ", {:.2}x in place", t.time_us / floor(true));
            }
            lines.push(line);
        }
    }
    if let Some(m) = &r.mpi {
        if !m.variants.is_empty() {
            let variants: Vec<String> = m
                .variants
                .iter()
                .map(|v| {
                    if v.options.is_empty() {
                        v.name.clone()
                    } else {
                        format!("{} ({})", v.name, v.options)
                    }
                })
                .collect();
            lines.push(format!(
                "# mpi: {} of Open MPI, same ranks, counts, type and iterations, same machine, \
                 same run, under variants {}; mpi = the fastest variant's time per size (named \
                 in mpi_best), x_mpi = oxccl time / mpi",
                m.what,
                variants.join(", ")
            ));
        }
        for note in &m.notes {
            lines.push(format!("# mpi: {note}"));
        }
    }
    lines.push("#".into());
    lines
}

/// nccl-tests' closing lines, and the comparison with MPI.
fn footer(r: &Report) -> Vec<String> {
    let wrong = r.wrong();
    let mut lines = vec![
        format!(
            "# Out of bounds values : {wrong} {}",
            if wrong == 0 { "OK" } else { "FAILED" }
        ),
        format!("# Avg bus bandwidth    : {:.4}", r.avg_busbw()),
    ];
    if let Some(m) = r.mpi.as_ref().filter(|m| !m.variants.is_empty()) {
        let (oop, ip) = r.x_mpi_means();
        let f = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
        let mut wins: Vec<(String, usize)> =
            m.variants.iter().map(|v| (v.name.clone(), 0)).collect();
        for s in &r.sizes {
            for in_place in [false, true] {
                if let Some(b) = r.mpi_best(s, in_place)
                    && let Some(w) = wins.iter_mut().find(|w| w.0 == b.variant)
                {
                    w.1 += 1;
                }
            }
        }
        let wins: Vec<String> = wins.iter().map(|(n, c)| format!("{n} {c}")).collect();
        lines.push(format!(
            "# vs {:<18}: geometric mean of x_mpi {} out-of-place, {} in-place; fastest variant \
             (sizes x placements): {}",
            r.setup.plan.collective.mpi_function(),
            f(oop),
            f(ip),
            wins.join(", ")
        ));
        let mpi_wrong: u64 = r.sizes.iter().map(|s| m.wrong(s.count)).sum();
        if mpi_wrong > 0 {
            lines.push(format!(
                "# mpi: MPI's own results had {mpi_wrong} wrong elements (its check, not oxccl's)"
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against the header hiding how packets travel, or naming a data form that no
    /// packet call can take.
    #[test]
    fn the_header_says_from_which_size_packets_go_as_data() {
        assert_eq!(
            packet_form_of(1024, 512),
            ", sent as data and a signal from 512 B"
        );
        assert_eq!(packet_form_of(1024, 0), ", sent as data and a signal");
        assert_eq!(packet_form_of(1024, 2048), "");
        assert_eq!(packet_form_of(1024, u64::MAX), "");
    }
}
