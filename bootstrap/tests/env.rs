//! Launcher environments: what each launcher's variables mean, which wins, and what is
//! refused.

#![allow(missing_docs)]

mod common;

use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::net::{IpAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;

use oxccl_bootstrap::{Bootstrap, Error, LaunchEnv, Launcher, Secret, SecretSource, UniqueId};

fn env(vars: &[(&str, &str)]) -> oxccl_bootstrap::Result<LaunchEnv> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    LaunchEnv::from_lookup(|k| map.get(k).cloned())
}

fn usage_error(vars: &[(&str, &str)]) -> String {
    match env(vars) {
        Err(e @ (Error::InvalidUsage(_) | Error::ParseUniqueId(_))) => e.to_string(),
        other => panic!("{vars:?}: expected a usage error, got {other:?}"),
    }
}

// Guards against misreading any launcher's variables (rank, size, local rank and size,
// root address), against the wrong launcher winning when several are present, and
// against bad values being accepted or panicking instead of naming the variable.
#[test]
fn bootstrap_reads_launcher_env() {
    // torchrun
    let e = env(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.1.2.3"),
        ("MASTER_PORT", "1234"),
    ])
    .unwrap();
    assert_eq!(
        (e.launcher, e.rank, e.size, e.local_rank, e.local_size),
        (Launcher::Torchrun, 3, 8, Some(1), Some(4))
    );
    assert_eq!(e.root, "10.1.2.3:1234");
    assert_eq!(e.root_addr().unwrap(), "10.1.2.3:1234".parse().unwrap());
    assert_eq!(e.secret_source, SecretSource::Derived);
    assert!(
        e.to_string()
            .starts_with("torchrun environment: rank 3 of 8"),
        "{e}"
    );

    // Open MPI with a unique id: root and secret come from the id.
    let id = UniqueId::new("192.168.0.7:4242".parse().unwrap()).unwrap();
    let e = env(&[
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("MASTER_ADDR", "10.9.9.9"),
        ("OXCCL_UNIQUE_ID", &id.to_string()),
    ])
    .unwrap();
    assert_eq!(
        (e.launcher, e.rank, e.size, e.local_rank, e.local_size),
        (Launcher::OpenMpi, 2, 4, Some(0), Some(2))
    );
    assert_eq!(e.unique_id().unwrap(), id);
    assert_eq!(e.secret_source, SecretSource::UniqueId);
    assert!(e.root_from_unique_id);

    // Slurm: root from the node list, explicit secret.
    let e = env(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "6"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_STEP_NODELIST", "gpu[07-08],cpu1"),
        ("MASTER_PORT", "999"),
        ("OXCCL_SECRET", "00112233445566778899aabbccddeeff"),
    ])
    .unwrap();
    assert_eq!(
        (e.launcher, e.rank, e.size, e.local_rank, e.local_size),
        (Launcher::Slurm, 5, 6, Some(1), None)
    );
    assert_eq!(e.root, "gpu07:999");
    assert_eq!(e.secret_source, SecretSource::Explicit);
    assert_eq!(e.secret().as_bytes()[15], 0xff);

    // PMI with an IPv6 master and the default port.
    let e = env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("MASTER_ADDR", "::1")]).unwrap();
    assert_eq!(
        (e.launcher, e.rank, e.size, e.local_rank),
        (Launcher::Pmi, 0, 2, None)
    );
    assert_eq!(e.root, "[::1]:29500");
    assert_eq!(e.root_addr().unwrap(), "[::1]:29500".parse().unwrap());

    // torchrun inside a Slurm allocation: RANK is the rank that counts.
    let e = env(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
    ])
    .unwrap();
    assert_eq!((e.launcher, e.rank, e.size), (Launcher::Torchrun, 1, 2));
    // Half a launcher's pair is not that launcher.
    let e = env(&[
        ("RANK", "1"),
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "3"),
        ("MASTER_ADDR", "h"),
    ])
    .unwrap();
    assert_eq!(e.launcher, Launcher::Pmi);

    // Derived secrets differ between jobs with the same root.
    let job = |id: &str| {
        env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", id),
            ("MASTER_ADDR", "n1"),
        ])
        .unwrap()
        .secret()
        .clone()
    };
    assert_ne!(job("100"), job("101"));
    assert_eq!(job("100"), job("100"));

    // Refusals, each naming what is wrong.
    assert!(usage_error(&[]).contains("no launcher environment found"));
    assert!(
        usage_error(&[("RANK", "x"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")])
            .contains("RANK=\"x\"")
    );
    assert!(
        usage_error(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")])
            .contains("not below WORLD_SIZE=2")
    );
    assert!(
        usage_error(&[("RANK", "0"), ("WORLD_SIZE", "0"), ("MASTER_ADDR", "h")])
            .contains("WORLD_SIZE=0")
    );
    assert!(
        usage_error(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")])
            .contains("MASTER_ADDR")
    );
    assert!(
        usage_error(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "70000")
        ])
        .contains("MASTER_PORT")
    );
    assert!(
        usage_error(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("OXCCL_UNIQUE_ID", "garbage")
        ])
        .contains("oxccl unique id")
    );
    let bad_secret = usage_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "h"),
        ("OXCCL_SECRET", "abc"),
    ]);
    assert!(bad_secret.contains("OXCCL_SECRET"), "{bad_secret}");
    assert!(
        usage_error(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h")
        ])
        .contains("local rank 2")
    );
}

// Guards against `from_launch_env` ignoring what it read: the launcher must be reported,
// and the launcher's local rank must win over the computed one.
#[test]
fn bootstrap_from_torchrun_env_in_threads() {
    let port = free_port();
    let n = 3;
    let got: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let port = port.clone();
                s.spawn(move || {
                    let rank = r.to_string();
                    let local = (n - 1 - r).to_string();
                    let e = env(&[
                        ("RANK", &rank),
                        ("WORLD_SIZE", "3"),
                        ("LOCAL_RANK", &local),
                        ("LOCAL_WORLD_SIZE", "3"),
                        ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", &port),
                        ("OXCCL_SECRET", "0123456789abcdef0123456789abcdef"),
                    ])
                    .unwrap();
                    let bs = Bootstrap::from_launch_env(&e, &common::config()).unwrap();
                    let all = bs.all_gather(&[bs.rank() as u8]).unwrap();
                    bs.barrier().unwrap();
                    (bs.launcher(), bs.local_rank(), bs.local_size(), all)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (launcher, local_rank, local_size, all)) in got.into_iter().enumerate() {
        assert_eq!(launcher, Some(Launcher::Torchrun));
        assert_eq!((local_rank, local_size), (n - 1 - r, 3));
        assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
    }
}

fn free_port() -> String {
    oxccl_testing::free_port().to_string()
}

/// Whether something listens on `ip:port`.
fn listening(ip: &str, port: &str) -> bool {
    match TcpStream::connect(format!("{ip}:{port}")) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => false,
        Err(e) => panic!("connecting to {ip}:{port}: {e}"),
    }
}

/// Guards against rank 0 of a launcher's job listening on every interface (`0.0.0.0`)
/// instead of the address the launcher names in `MASTER_ADDR` (resolved), which opened
/// the bootstrap port on networks the job never uses.
#[test]
fn root_binds_the_launcher_address() {
    // 127.0.0.2 is another address of this host: a listener on every interface answers
    // there, one on 127.0.0.1 does not.
    for master in ["127.0.0.1", "localhost"] {
        let port = free_port();
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", master),
            ("MASTER_PORT", &port),
            ("OXCCL_SECRET", "0123456789abcdef0123456789abcdef"),
        ])
        .unwrap();
        let _bs = Bootstrap::from_launch_env(&e, &common::config()).unwrap();
        assert!(listening("127.0.0.1", &port), "MASTER_ADDR={master}");
        assert!(!listening("127.0.0.2", &port), "MASTER_ADDR={master}");
    }
}

/// Guards against the bind address being impossible to override where the launcher's
/// address is not one the root can listen on (NAT, a host name resolving to loopback), and
/// against a garbage override being ignored instead of named.
#[test]
fn root_bind_is_configurable() {
    let job = |port: &str, bind: Option<&str>| {
        let mut vars = vec![
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", port),
            ("OXCCL_SECRET", "0123456789abcdef0123456789abcdef"),
        ];
        vars.extend(bind.map(|b| ("OXCCL_BOOTSTRAP_BIND", b)));
        env(&vars)
    };

    // The variable: every interface.
    let port = free_port();
    let e = job(&port, Some(" 0.0.0.0\n")).unwrap();
    assert_eq!(e.root_bind, Some(IpAddr::from([0, 0, 0, 0])));
    let _bs = Bootstrap::from_launch_env(&e, &common::config()).unwrap();
    assert!(listening("127.0.0.2", &port));

    // The config wins over the variable.
    let port = free_port();
    let e = job(&port, Some("0.0.0.0")).unwrap();
    let cfg = common::config().with_root_bind_ip(IpAddr::from([127, 0, 0, 1]));
    let _bs = Bootstrap::from_launch_env(&e, &cfg).unwrap();
    assert!(listening("127.0.0.1", &port));
    assert!(!listening("127.0.0.2", &port));

    // The config alone, on the unique-id path.
    let port = free_port();
    let id: UniqueId = format!("oxccl1:0123456789abcdef0123456789abcdef@127.0.0.1:{port}")
        .parse()
        .unwrap();
    let cfg = common::config().with_root_bind_ip(IpAddr::from([0, 0, 0, 0]));
    let _bs = Bootstrap::init_with_config(&id, 0, 1, &cfg).unwrap();
    assert!(listening("127.0.0.2", &port));

    let e = job(&free_port(), Some("every-interface")).unwrap_err();
    assert!(
        e.to_string()
            .contains("OXCCL_BOOTSTRAP_BIND=\"every-interface\" is not an IP address"),
        "{e}"
    );
    // A bind the host cannot do names the address and the way out.
    let e = job(&free_port(), Some("192.0.2.1"))
        .and_then(|e| Bootstrap::from_launch_env(&e, &common::config()))
        .unwrap_err();
    assert!(e.to_string().contains("192.0.2.1"), "{e}");
    assert!(e.to_string().contains("OXCCL_BOOTSTRAP_BIND"), "{e}");
}

const HEX: &str = "00112233445566778899aabbccddeeff";

/// A torchrun job of rank 0 of 2 with `vars` added.
fn torchrun_with(vars: &[(&str, &str)]) -> oxccl_bootstrap::Result<LaunchEnv> {
    let mut all = vec![
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
    ];
    all.extend_from_slice(vars);
    env(&all)
}

/// A file holding `content`, with permission bits `mode`.
fn secret_file(content: &[u8], mode: u32) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(content).unwrap();
    std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    f
}

/// Guards against `OXCCL_SECRET_FILE` being ignored (a job given a real secret in a file
/// silently ran on a derived one), against whitespace around the digits being refused,
/// and against the precedence `OXCCL_UNIQUE_ID` > `OXCCL_SECRET` > `OXCCL_SECRET_FILE` >
/// derived being broken.
#[test]
fn secret_file_is_read() {
    let f = secret_file(b"  00112233445566778899AABBCCDDEEFF \n", 0o600);
    let path = f.path().to_str().unwrap();
    let (e, log) = common::capture_logs(|| torchrun_with(&[("OXCCL_SECRET_FILE", path)]));
    let e = e.unwrap();
    assert_eq!(e.secret_source, SecretSource::File);
    assert_eq!(e.secret().to_hex(), HEX);
    assert!(!log.contains("WARN"), "{log}");

    let other = "ffeeddccbbaa99887766554433221100";
    let e = torchrun_with(&[("OXCCL_SECRET", other), ("OXCCL_SECRET_FILE", path)]).unwrap();
    assert_eq!(e.secret_source, SecretSource::Explicit);
    assert_eq!(e.secret().to_hex(), other);
    // A lower source is not even read: a broken file does not matter then.
    let e = torchrun_with(&[
        ("OXCCL_SECRET", other),
        ("OXCCL_SECRET_FILE", "/nonexistent"),
    ]);
    assert_eq!(e.unwrap().secret_source, SecretSource::Explicit);
    let id = UniqueId::new("127.0.0.1:4242".parse().unwrap()).unwrap();
    let e = torchrun_with(&[
        ("OXCCL_UNIQUE_ID", &id.to_string()),
        ("OXCCL_SECRET", other),
        ("OXCCL_SECRET_FILE", path),
    ])
    .unwrap();
    assert_eq!(e.secret_source, SecretSource::UniqueId);
    assert_eq!(e.secret(), id.secret());
    assert_eq!(
        torchrun_with(&[]).unwrap().secret_source,
        SecretSource::Derived
    );
}

/// Guards against a secret file that cannot be used panicking, blocking (a FIFO), being
/// read without bound, or being reported with its content (which is a secret) instead of
/// its path and what is wrong.
#[test]
fn bad_secret_files_are_clear_errors() {
    let err = |path: &str| torchrun_with(&[("OXCCL_SECRET_FILE", path)]).unwrap_err();

    let e = err("/nonexistent/oxccl-secret");
    assert!(matches!(e, Error::System { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("OXCCL_SECRET_FILE=\"/nonexistent/oxccl-secret\""),
        "{msg}"
    );

    let dir = tempfile::tempdir().unwrap();
    let e = err(dir.path().to_str().unwrap());
    assert!(e.to_string().contains("not a regular file"), "{e}");

    // A FIFO nobody writes: opening it must not wait for a writer.
    let fifo = dir.path().join("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let e = err(fifo.to_str().unwrap());
    assert!(e.to_string().contains("not a regular file"), "{e}");

    let secretish = "zz112233445566778899aabbccddeeff";
    for (content, want) in [
        (
            secretish.as_bytes().to_vec(),
            "non-hex character at position 0",
        ),
        (b"0011".to_vec(), "expected 32 hex digits"),
        (b"".to_vec(), "expected 32 hex digits"),
        (
            format!("{HEX}\n{HEX}\n").into_bytes(),
            "expected 32 hex digits",
        ),
        (vec![0xff; 32], "not text"),
        (vec![b'0'; 1 << 20], "more than 4096 bytes"),
    ] {
        let f = secret_file(&content, 0o600);
        let e = err(f.path().to_str().unwrap());
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e:?}");
        assert!(msg.contains(want), "{msg}");
        assert!(msg.contains("OXCCL_SECRET_FILE="), "{msg}");
        assert!(!msg.contains("zz11"), "content echoed: {msg}");
    }
}

/// Guards against a secret file that group or others may read (so other users of the
/// machine can join the job) being used without a word, and against the warning printing
/// the secret.
#[test]
fn secret_file_readable_by_others_is_warned_about() {
    for mode in [0o640, 0o604, 0o644] {
        let f = secret_file(HEX.as_bytes(), mode);
        let path = f.path().to_str().unwrap();
        let (e, log) = common::capture_logs(|| torchrun_with(&[("OXCCL_SECRET_FILE", path)]));
        assert_eq!(e.unwrap().secret(), &Secret::from_hex(HEX).unwrap());
        let warning = log
            .lines()
            .find(|l| l.contains("WARN"))
            .unwrap_or_else(|| panic!("mode {mode:o}: no warning in {log:?}"));
        assert!(warning.contains(path), "{warning}");
        assert!(warning.contains(&format!("{mode:03o}")), "{warning}");
        assert!(warning.contains("chmod 600"), "{warning}");
        assert!(!log.contains(HEX), "the secret is in the log: {log}");
    }
}
