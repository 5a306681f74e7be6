//! `cargo xtask netns-test`: port channels between two nodes, emulated on one machine by
//! two network namespaces joined by a veth pair.
//!
//! Each node is a network namespace with an address on its end of the veth pair, and each
//! rank runs there under a UTS namespace of its own whose host name is the node's
//! (`ip netns exec <ns> unshare --uts`): ranks decide "same node" by host name (the
//! bootstrap's local ranks, host IPC's `node_name`), so ranks of one namespace share memory
//! and ranks of the two namespaces reach each other over TCP only. The runs, each a job of
//! rank processes with torchrun's variables and a deadline ([`JOB_TIME_LIMIT`]):
//!
//! 1. `port_ring` on 2 ranks, one per node: both channels of each rank must be Ethernet;
//! 2. `port_ring` on 4 ranks, 2 per node: host IPC to the neighbour on the same node,
//!    Ethernet to the one on the other (the transport `auto` picks);
//! 3. `put_bw --transport ethernet` on 2 ranks, one per node: its lines are printed;
//! 4. `allreduce` (every call checked) on 2 ranks, one per node, and on 4 ranks, 2 per
//!    node: the communicator's all-reduce over port channels, its table printed;
//! 5. `collectives --collective allgather`, `reducescatter`, then `alltoallv` (every call
//!    checked) on 4 ranks, 2 per node: those collectives over port channels, their tables
//!    printed.
//!
//! Needs root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`), `ip` (iproute2) and `unshare`
//! (util-linux); [`unsupported`] says what is missing. The namespaces are deleted on every
//! way out of the run (a guard's `Drop`, which runs no command, so it also works after
//! Ctrl-C, when no further command may start), and ones left by a run killed outright are
//! deleted before the next creates its own.

use anyhow::{Context, Result, bail};
use oxccl_build::Workspace;
use oxccl_build::bounded::{fmt_duration, output_bounded, run_bounded, show};
use oxccl_build::tool::Tool;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Longest one job of rank processes may run, start to end.
pub const JOB_TIME_LIMIT: Duration = Duration::from_secs(180);

/// Longest one `ip` command of the set-up may take.
const IP_TIME_LIMIT: Duration = Duration::from_secs(20);

/// Longest the build of the programs may take.
const BUILD_TIME_LIMIT: Duration = Duration::from_secs(20 * 60);

/// Where iproute2 keeps the bind mounts that name network namespaces.
const NETNS_RUN_DIR: &str = "/var/run/netns";

/// Longest a rank waits for any single device wait (passed to the programs).
const RANK_WAIT_LIMIT_S: &str = "30";

/// One emulated node.
struct Node {
    /// Its network namespace.
    netns: &'static str,
    /// The host name its ranks see.
    host: &'static str,
    /// Its end of the veth pair.
    veth: &'static str,
    /// Its address on the pair.
    ip: &'static str,
}

/// The two nodes; rank 0 of every job runs on the first, whose address is `MASTER_ADDR`.
const NODES: [Node; 2] = [
    Node {
        netns: "oxccl-netns-a",
        host: "oxccl-node-a",
        veth: "oxccl-veth-a",
        ip: "10.231.7.1",
    },
    Node {
        netns: "oxccl-netns-b",
        host: "oxccl-node-b",
        veth: "oxccl-veth-b",
        ip: "10.231.7.2",
    },
];

/// Prefix length of the nodes' addresses.
const PREFIX_LEN: u8 = 24;

/// Why this machine cannot run the test (`None`: it can): not root, missing capabilities,
/// or a missing program.
pub fn unsupported() -> Option<String> {
    let status = match std::fs::read_to_string("/proc/self/status") {
        Ok(s) => s,
        Err(e) => return Some(format!("cannot read /proc/self/status ({e})")),
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("")
            .to_owned()
    };
    // Uid: real, effective, saved, file system.
    let euid = field("Uid:")
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_owned();
    if euid != "0" {
        return Some(format!(
            "not root (effective uid {euid}): creating network namespaces needs root"
        ));
    }
    let caps = u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(0);
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    for (bit, name) in [
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    ] {
        if caps & (1 << bit) == 0 {
            return Some(format!(
                "root without {name} (a container?): network and UTS namespaces need it"
            ));
        }
    }
    for program in ["ip", "unshare"] {
        if find_program(program).is_none() {
            return Some(format!(
                "`{program}` is not on PATH (iproute2's `ip`, util-linux's `unshare`)"
            ));
        }
    }
    None
}

/// Runs the test; see the module docs.
///
/// # Errors
/// The machine cannot run it ([`unsupported`]), the build failed, a namespace could not be
/// set up, or a job failed, ran past its limit, or printed what it should not.
pub fn run_netns_test(ws: &Workspace) -> Result<()> {
    if let Some(why) = unsupported() {
        bail!("netns-test cannot run here: {why}");
    }
    let mut build = Tool::cargo().cmd();
    build.current_dir(&ws.root).args([
        "build",
        "--release",
        "-p",
        "oxccl-examples",
        "--bin",
        "port_ring",
        "--bin",
        "put_bw",
        "--bin",
        "allreduce",
        "--bin",
        "collectives",
    ]);
    run_bounded(&mut build, BUILD_TIME_LIMIT)?;
    let bin = ws.target_dir.join("release");
    let port_ring = bin.join("port_ring");
    let put_bw = bin.join("put_bw");
    let allreduce = bin.join("allreduce");
    let collectives = bin.join("collectives");

    let namespaces = Namespaces::create()?;
    println!(
        "netns-test: nodes {} ({}, {}) and {} ({}, {}), joined by a veth pair",
        NODES[0].netns, NODES[0].host, NODES[0].ip, NODES[1].netns, NODES[1].host, NODES[1].ip
    );

    let job = Job {
        program: &port_ring,
        args: &["--timeout-s", RANK_WAIT_LIMIT_S],
        port: 29_500,
    };
    let outputs = job.run("port_ring, 2 ranks, one per node", &[0, 1])?;
    check_ring(&outputs, &[0, 1])?;

    let job = Job {
        port: 29_501,
        ..job
    };
    let outputs = job.run("port_ring, 4 ranks, 2 per node", &[0, 0, 1, 1])?;
    check_ring(&outputs, &[0, 0, 1, 1])?;

    let job = Job {
        program: &put_bw,
        args: &[
            "--transport",
            "ethernet",
            "--total-bytes",
            "64M",
            "--runs",
            "2",
            "--timeout-s",
            RANK_WAIT_LIMIT_S,
        ],
        port: 29_502,
    };
    let outputs = job.run("put_bw --transport ethernet, one rank per node", &[0, 1])?;
    let lines: Vec<&str> = outputs[0]
        .lines()
        .filter(|l| l.starts_with("put_bw "))
        .collect();
    for line in &lines {
        println!("  {line}");
    }
    if lines.len() != 8 || !lines.iter().all(|l| l.contains(" transport=ethernet ")) {
        bail!(
            "put_bw printed {} Ethernet lines, not one per size from 4 KiB to 64 MiB:\n{}",
            lines.len(),
            outputs[0]
        );
    }
    let job = Job {
        program: &allreduce,
        args: &["--max-bytes", "4M", "--iters", "3", "--check", "every"],
        port: 29_503,
    };
    for (title, placement, port) in [
        ("allreduce, 2 ranks, one per node", &[0, 1][..], 29_503),
        ("allreduce, 4 ranks, 2 per node", &[0, 0, 1, 1][..], 29_504),
    ] {
        let outputs = Job { port, ..job }.run(title, placement)?;
        check_through_proxy("allreduce", &outputs[0])?;
    }
    for (collective, port) in [
        ("allgather", 29_505),
        ("reducescatter", 29_506),
        ("alltoallv", 29_507),
    ] {
        let args = [
            "--collective",
            collective,
            "--max-bytes",
            "1M",
            "--iters",
            "3",
            "--check",
            "every",
        ];
        let job = Job {
            program: &collectives,
            args: &args,
            port,
        };
        let title = format!("collectives --collective {collective}, 4 ranks, 2 per node");
        let outputs = job.run(&title, &[0, 0, 1, 1])?;
        check_through_proxy(collective, &outputs[0])?;
    }
    drop(namespaces);
    println!("netns-test: ok (namespaces deleted)");
    Ok(())
}

/// A job of rank processes placed on the nodes.
#[derive(Clone, Copy)]
struct Job<'a> {
    program: &'a Path,
    args: &'a [&'a str],
    /// `MASTER_PORT` (rank 0 listens there, on the first node's address).
    port: u16,
}

impl Job<'_> {
    /// Runs rank `r` on node `placement[r]`, all at once; returns each rank's stdout.
    fn run(&self, title: &str, placement: &[usize]) -> Result<Vec<String>> {
        println!(
            "\nnetns-test: {title} (limit {})",
            fmt_duration(JOB_TIME_LIMIT)
        );
        let secret = random_hex(16)?;
        let ranks = placement.len();
        let commands: Vec<Command> = placement
            .iter()
            .enumerate()
            .map(|(rank, &node)| {
                let local_rank = placement[..rank].iter().filter(|&&n| n == node).count();
                let local_size = placement.iter().filter(|&&n| n == node).count();
                let node = &NODES[node];
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", node.netns, "unshare", "--uts", "--"])
                    .args(["sh", "-c", r#"hostname "$1" && shift && exec "$@""#, "sh"])
                    .arg(node.host)
                    .arg(self.program)
                    .args(self.args)
                    .env_remove("OXCCL_TRANSPORT")
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", ranks.to_string())
                    .env("LOCAL_RANK", local_rank.to_string())
                    .env("LOCAL_WORLD_SIZE", local_size.to_string())
                    .env("MASTER_ADDR", NODES[0].ip)
                    .env("MASTER_PORT", self.port.to_string())
                    .env("OXCCL_SECRET", &secret);
                cmd
            })
            .collect();
        if let Some(first) = commands.first() {
            println!("  rank 0: {}", show(first));
        }
        let outcomes: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = commands
                .into_iter()
                .map(|mut cmd| s.spawn(move || output_bounded(&mut cmd, JOB_TIME_LIMIT)))
                .collect();
            handles.into_iter().map(|h| h.join()).collect()
        });
        let mut stdouts = Vec::new();
        let mut failures = Vec::new();
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Ok(Ok(out)) if out.status.success() => {
                    stdouts.push(String::from_utf8_lossy(&out.stdout).into_owned());
                }
                Ok(Ok(out)) => failures.push(format!(
                    "rank {rank} failed ({}):\n{}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                )),
                Ok(Err(e)) => failures.push(format!("rank {rank}: {e:#}")),
                Err(_) => failures.push(format!("rank {rank}: its supervising thread panicked")),
            }
        }
        if !failures.is_empty() {
            bail!("{title}:\n{}", failures.join("\n"));
        }
        Ok(stdouts)
    }
}

/// The algorithms that run through the proxy over port channels, as the tables name them.
const THROUGH_PROXY: [&str; 3] = ["ports", "ring", "doubling"];

/// Checks rank 0's table of `program` (`allreduce`, or the collective `collectives` ran):
/// every size ran an algorithm through the proxy ([`THROUGH_PROXY`]: the ranks share no
/// node), and no element was wrong; prints its rows.
fn check_through_proxy(program: &str, out: &str) -> Result<()> {
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    for row in &rows {
        println!("  {row}");
    }
    let through_proxy = rows.iter().all(|r| {
        r.split_whitespace()
            .nth(5)
            .is_some_and(|algo| THROUGH_PROXY.contains(&algo))
    });
    if rows.is_empty() || !through_proxy || !out.contains("# Out of bounds values : 0 OK") {
        bail!(
            "{program}: expected every size through the proxy ({}) and no wrong element:\n{out}",
            THROUGH_PROXY.join(", ")
        );
    }
    Ok(())
}

/// Checks each rank's `port_ring` line: host IPC to a neighbour on the same node, Ethernet
/// to one on the other.
fn check_ring(outputs: &[String], placement: &[usize]) -> Result<()> {
    let n = placement.len();
    for (rank, out) in outputs.iter().enumerate() {
        let line = out
            .lines()
            .find(|l| l.starts_with("port_ring "))
            .with_context(|| format!("rank {rank} printed no port_ring line:\n{out}"))?;
        println!("  {line}");
        let transport = |peer: usize| {
            if placement[peer] == placement[rank] {
                "host-ipc"
            } else {
                "ethernet"
            }
        };
        let want = format!(
            "port_ring rank={rank} ranks={n} node={} to_next={} to_prev={} ok",
            NODES[placement[rank]].host,
            transport((rank + 1) % n),
            transport((rank + n - 1) % n)
        );
        if line != want {
            bail!("rank {rank} printed\n  {line}\nnot\n  {want}");
        }
    }
    Ok(())
}

/// The two namespaces and the veth pair between them, deleted when dropped.
struct Namespaces {
    /// The namespaces created so far.
    created: Vec<&'static str>,
}

impl Namespaces {
    /// Deletes namespaces a previous run left, then creates the nodes.
    fn create() -> Result<Self> {
        for node in &NODES {
            match delete_netns(node.netns) {
                Ok(true) => println!("netns-test: deleted {} left by an earlier run", node.netns),
                Ok(false) => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("deleting {} left by an earlier run", node.netns)
                    });
                }
            }
        }
        let mut made = Namespaces {
            created: Vec::new(),
        };
        for node in &NODES {
            ip(&["netns", "add", node.netns])?;
            made.created.push(node.netns);
        }
        let [a, b] = &NODES;
        ip(&[
            "link", "add", a.veth, "netns", a.netns, "type", "veth", "peer", "name", b.veth,
            "netns", b.netns,
        ])?;
        for node in &NODES {
            let cidr = format!("{}/{PREFIX_LEN}", node.ip);
            ip(&["-n", node.netns, "addr", "add", &cidr, "dev", node.veth])?;
            ip(&["-n", node.netns, "link", "set", "lo", "up"])?;
            ip(&["-n", node.netns, "link", "set", node.veth, "up"])?;
        }
        Ok(made)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in self.created.drain(..).rev() {
            if let Err(e) = delete_netns(name) {
                eprintln!(
                    "netns-test: could not delete network namespace {name} ({e}); \
                     `ip netns del {name}` removes it"
                );
            }
        }
    }
}

/// Deletes the named network namespace as `ip netns del` does, without running a command
/// (none may start once Ctrl-C was received): detaches its bind mount and removes the file
/// that names it; the namespace, with its end of the veth pair, goes once no process is
/// left in it. Returns whether it existed.
fn delete_netns(name: &str) -> std::io::Result<bool> {
    let path = PathBuf::from(NETNS_RUN_DIR).join(name);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(false);
    }
    match rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH) {
        // EINVAL: not a mount point any more (a half-finished `ip netns add` or delete).
        Ok(()) | Err(rustix::io::Errno::INVAL) => {}
        Err(e) => return Err(e.into()),
    }
    std::fs::remove_file(&path)?;
    Ok(true)
}

/// Runs `ip` with `args` under [`IP_TIME_LIMIT`], quietly unless it fails.
fn ip(args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    let out = output_bounded(&mut cmd, IP_TIME_LIMIT)?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            show(&cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `bytes` random bytes from the system, in hex.
fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading /dev/urandom for the job's secret")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The path of `program` on `PATH`, if it is there.
fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against an all-reduce check that accepts a size that did not run over port
    /// channels (through the proxy: ports, ring or recursive doubling), a wrong element, or
    /// no table at all.
    #[test]
    fn all_reduce_check_wants_the_proxy_everywhere_and_no_wrong_element() {
        let good = "# oxccl all-reduce\n        1024          256    float    sum    -1    ports     \
                    44.80    0.00    0.00      0     43.44    0.00    0.00      0\n\
                    # Out of bounds values : 0 OK\n";
        assert!(super::check_through_proxy("allreduce", good).is_ok());
        for algo in ["ring", "doubling"] {
            let other = good.replace("ports", algo);
            assert!(
                super::check_through_proxy("allreduce", &other).is_ok(),
                "{algo}"
            );
        }
        let packets = good.replace("ports", "packets");
        assert!(super::check_through_proxy("allreduce", &packets).is_err());
        assert!(super::check_through_proxy("allreduce", &good.replace("ports", "direct")).is_err());
        assert!(
            super::check_through_proxy("allreduce", &good.replace("0 OK", "3 FAILED")).is_err()
        );
        assert!(super::check_through_proxy("allreduce", "# nothing\n").is_err());
    }

    /// Guards against a 4-rank check that accepts a transport the placement does not call
    /// for (host IPC between nodes, Ethernet within one).
    #[test]
    fn ring_check_follows_the_placement() {
        let lines = [
            "port_ring rank=0 ranks=4 node=oxccl-node-a to_next=host-ipc to_prev=ethernet ok",
            "port_ring rank=1 ranks=4 node=oxccl-node-a to_next=ethernet to_prev=host-ipc ok",
            "port_ring rank=2 ranks=4 node=oxccl-node-b to_next=host-ipc to_prev=ethernet ok",
            "port_ring rank=3 ranks=4 node=oxccl-node-b to_next=ethernet to_prev=host-ipc ok",
        ];
        let outputs: Vec<String> = lines.iter().map(|l| format!("{l}\n")).collect();
        check_ring(&outputs, &[0, 0, 1, 1]).unwrap();
        let mut wrong = outputs.clone();
        wrong[1] = lines[1].replace("to_next=ethernet", "to_next=host-ipc");
        assert!(check_ring(&wrong, &[0, 0, 1, 1]).is_err());
        assert!(check_ring(&outputs[..2], &[0, 1]).is_err());
    }

    /// Guards against a guard that fails on a namespace that is not there (a run that never
    /// created it, or one already deleted).
    #[test]
    fn deleting_a_missing_namespace_is_no_error() {
        assert!(!delete_netns("oxccl-netns-never-created").unwrap());
    }
}
