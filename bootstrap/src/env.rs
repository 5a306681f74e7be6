//! Reading rank, size, local rank, root address and secret from the environment of the
//! launchers users already use.
//!
//! | launcher | rank | size | local rank | local size |
//! |---|---|---|---|---|
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` |
//! | Slurm | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | — |
//! | PMI (MPICH, Intel MPI) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` | `MPI_LOCALNRANKS` |
//!
//! They are tried in that order (torchrun inside a Slurm job sets both, and `RANK` is the
//! one that counts); a launcher counts as found when both its rank and size variables are
//! set. Missing local values are computed from host names at init.
//!
//! The root address comes from `OXCCL_UNIQUE_ID` if set, else `MASTER_ADDR`/`MASTER_PORT`
//! (port default 29500), else, under Slurm, the first host of the step's node list. Rank 0
//! listens on exactly that address (resolved), unless `OXCCL_BOOTSTRAP_BIND` names another
//! IP (`0.0.0.0` for every interface).
//!
//! The secret comes from the first of these that is set:
//! 1. `OXCCL_UNIQUE_ID` (root address and secret);
//! 2. `OXCCL_SECRET` (32 hex digits);
//! 3. `OXCCL_SECRET_FILE`, the path of a file holding the 32 hex digits (`secret_file.rs`);
//! 4. else it is derived from the launcher's variables (root address, size, job id).
//!
//! A derived secret only keeps other jobs' stray connections out: anyone who can reach
//! the root port and guess or read those variables can compute it, so a warning is logged
//! (once per process). Set one of the first three to authenticate for real.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::unique_id::{ParseUniqueIdError, SECRET_BYTES, Secret, UniqueId};

/// Variable holding a full [`UniqueId`] (root address and secret).
pub const ENV_UNIQUE_ID: &str = "OXCCL_UNIQUE_ID";
/// Variable holding the secret alone, as 32 hex digits.
pub const ENV_SECRET: &str = "OXCCL_SECRET";
/// Variable holding the path of a file that holds the secret as 32 hex digits (whitespace
/// around them ignored); used when neither `OXCCL_UNIQUE_ID` nor `OXCCL_SECRET` is set.
pub const ENV_SECRET_FILE: &str = "OXCCL_SECRET_FILE";
/// Variable holding the IP rank 0 listens on instead of the root address's own (e.g.
/// `0.0.0.0` for every interface); see [`Config::with_root_bind_ip`](crate::Config::with_root_bind_ip).
pub const ENV_BOOTSTRAP_BIND: &str = "OXCCL_BOOTSTRAP_BIND";
/// Every environment variable [`LaunchEnv::detect`] reads, and the only ones: detection
/// sees the environment through this list. Whoever starts ranks as child processes (a
/// test harness, a benchmark) removes these from a child's environment, so only the ones
/// it sets count.
pub const LAUNCHER_VARS: &[&str] = &[
    // torchrun
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    // Open MPI
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "OMPI_MCA_orte_ess_jobid",
    // Slurm
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    // PMI (MPICH's Hydra, Intel MPI)
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "PMI_JOBID",
    "PMIX_NAMESPACE",
    // oxccl's own
    ENV_UNIQUE_ID,
    ENV_SECRET,
    ENV_SECRET_FILE,
    ENV_BOOTSTRAP_BIND,
];

/// Port used when `MASTER_PORT` is not set (torchrun's default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The launcher whose variables gave this rank its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun / torch.distributed.elastic (`RANK`, `WORLD_SIZE`, ...).
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`).
    Slurm,
    /// A PMI launcher: MPICH's Hydra, Intel MPI (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Slurm => "Slurm",
            Launcher::Pmi => "PMI",
        })
    }
}

/// Where the secret came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// From `OXCCL_UNIQUE_ID`.
    UniqueId,
    /// From `OXCCL_SECRET`.
    Explicit,
    /// From the file `OXCCL_SECRET_FILE` names.
    File,
    /// Derived from the job's identity (launcher variables and root address): keeps other
    /// jobs out, but is not a secret from anyone who can reach the root port and guess or
    /// read this job's environment.
    Derived,
}

/// What the environment says about this rank.
#[derive(Clone, Debug)]
pub struct LaunchEnv {
    /// The launcher found.
    pub launcher: Launcher,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Rank within the node, if the launcher says.
    pub local_rank: Option<usize>,
    /// Ranks on the node, if the launcher says.
    pub local_size: Option<usize>,
    /// Root `host:port` as found (before name resolution).
    pub root: String,
    /// Where the secret came from.
    pub secret_source: SecretSource,
    /// Whether the root address came from `OXCCL_UNIQUE_ID` (rather than `MASTER_ADDR` /
    /// `MASTER_PORT` or the Slurm node list).
    pub root_from_unique_id: bool,
    /// The IP rank 0 listens on instead of the root address's own, from
    /// `OXCCL_BOOTSTRAP_BIND`; `None` listens on exactly the root address.
    pub root_bind: Option<IpAddr>,
    secret: Secret,
}

struct LauncherVars {
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: Option<&'static str>,
}

const LAUNCHERS: [LauncherVars; 4] = [
    LauncherVars {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    LauncherVars {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    LauncherVars {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: None,
    },
    LauncherVars {
        launcher: Launcher::Pmi,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: Some("MPI_LOCALNRANKS"),
    },
];

/// Variables that identify one job run, mixed into a derived secret so two jobs with the
/// same root address do not share it.
const JOB_ID_VARS: [&str; 7] = [
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "OMPI_MCA_ess_base_jobid",
    "OMPI_MCA_orte_ess_jobid",
    "PMI_JOBID",
    "PMIX_NAMESPACE",
];

impl LaunchEnv {
    /// Reads this process's environment: the variables of [`LAUNCHER_VARS`], and no
    /// others.
    ///
    /// # Errors
    /// As [`LaunchEnv::from_lookup`].
    pub fn detect() -> Result<Self> {
        let vars: Vec<(&str, String)> = LAUNCHER_VARS
            .iter()
            .filter_map(|&name| std::env::var(name).ok().map(|v| (name, v)))
            .collect();
        Self::from_lookup(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        })
    }

    /// Reads the variables through `get` (a map in tests, the process environment in
    /// [`LaunchEnv::detect`]).
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] naming the variable if no launcher is found, a value is not
    /// a number, the rank is not below the size, no root address is given, or the secret
    /// (`OXCCL_SECRET`, or the file `OXCCL_SECRET_FILE` names) is not 32 hex digits;
    /// [`Error::ParseUniqueId`] if `OXCCL_UNIQUE_ID` is garbage; [`Error::System`] if the
    /// secret file cannot be opened or read.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let Some(vars) = LAUNCHERS
            .iter()
            .find(|l| get(l.rank).is_some() && get(l.size).is_some())
        else {
            return Err(Error::InvalidUsage(
                "no launcher environment found: expected RANK and WORLD_SIZE (torchrun), \
                 OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI), SLURM_PROCID and \
                 SLURM_NTASKS (Slurm) or PMI_RANK and PMI_SIZE (PMI)"
                    .into(),
            ));
        };
        let number = |name: &str| -> Result<Option<usize>> {
            get(name)
                .map(|v| {
                    v.parse::<usize>().map_err(|_| {
                        Error::InvalidUsage(format!("{name}={v:?} is not a non-negative integer"))
                    })
                })
                .transpose()
        };
        let rank = number(vars.rank)?.unwrap_or_default();
        let size = number(vars.size)?.unwrap_or_default();
        if size == 0 || rank >= size {
            return Err(Error::InvalidUsage(format!(
                "{}={rank} is not below {}={size}",
                vars.rank, vars.size
            )));
        }
        let local_rank = number(vars.local_rank)?;
        let local_size = match vars.local_size {
            Some(name) => number(name)?,
            None => None,
        };
        if let (Some(lr), Some(ls)) = (local_rank, local_size)
            && lr >= ls
        {
            return Err(Error::InvalidUsage(format!(
                "local rank {lr} is not below local size {ls} ({} / {})",
                vars.local_rank,
                vars.local_size.unwrap_or("")
            )));
        }

        let uid = get(ENV_UNIQUE_ID)
            .map(|s| s.parse::<UniqueId>())
            .transpose()?;
        let (root, root_from_unique_id) = match &uid {
            Some(id) => (id.root().to_string(), true),
            None => (root_from_vars(&get, vars.launcher)?, false),
        };
        let root_bind = get(ENV_BOOTSTRAP_BIND)
            .map(|v| {
                v.parse::<IpAddr>().map_err(|_| {
                    Error::InvalidUsage(format!(
                        "{ENV_BOOTSTRAP_BIND}={v:?} is not an IP address (e.g. 0.0.0.0 or ::)"
                    ))
                })
            })
            .transpose()?;
        let (secret, secret_source) = if let Some(id) = &uid {
            (id.secret().clone(), SecretSource::UniqueId)
        } else if let Some(hex) = get(ENV_SECRET) {
            let secret = Secret::from_hex(&hex)
                .map_err(|e| Error::InvalidUsage(format!("{ENV_SECRET}: {}", secret_problem(e))))?;
            (secret, SecretSource::Explicit)
        } else if let Some(path) = get(ENV_SECRET_FILE) {
            (crate::secret_file::read(&path)?, SecretSource::File)
        } else {
            (
                derive_secret(&get, vars.launcher, &root, size),
                SecretSource::Derived,
            )
        };
        Ok(LaunchEnv {
            launcher: vars.launcher,
            rank,
            size,
            local_rank,
            local_size,
            root,
            secret_source,
            root_from_unique_id,
            root_bind,
            secret,
        })
    }

    /// The secret found or derived.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// The root address, resolved (IPv4 preferred when a name has both).
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] if the name does not resolve.
    pub fn root_addr(&self) -> Result<SocketAddr> {
        resolve(&self.root)
    }

    /// The unique id this environment describes.
    ///
    /// # Errors
    /// As [`LaunchEnv::root_addr`].
    pub fn unique_id(&self) -> Result<UniqueId> {
        Ok(UniqueId::from_parts(self.root_addr()?, self.secret.clone()))
    }
}

impl fmt::Display for LaunchEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} environment: rank {} of {}, root {}",
            self.launcher, self.rank, self.size, self.root
        )?;
        if let Some(lr) = self.local_rank {
            write!(f, ", local rank {lr}")?;
        }
        if let Some(ls) = self.local_size {
            write!(f, " of {ls}")?;
        }
        Ok(())
    }
}

/// What is wrong with a secret's hex digits, without the unique-id framing of
/// [`ParseUniqueIdError`]'s own message. Never repeats the digits.
pub(crate) fn secret_problem(e: ParseUniqueIdError) -> String {
    match e {
        ParseUniqueIdError::BadSecret(why) => format!("not a secret of 32 hex digits: {why}"),
        e => e.to_string(),
    }
}

/// Logs, once per process, that the secret was derived from `launcher`'s variables and
/// how to give a real one.
pub(crate) fn warn_derived_secret_once(launcher: Launcher) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    // Relaxed: the flag only deduplicates a log line; it publishes nothing.
    if WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    tracing::warn!(
        "oxccl bootstrap: the job's secret is derived from {launcher}'s variables (root \
         address, world size, job id): it keeps other jobs' stray connections out, but anyone \
         who can reach the root port and guess or read them can compute it and join. For a \
         real secret give every rank the same 32 random hex digits (`openssl rand -hex 16`) \
         in {ENV_SECRET}, or in a file only the job's user can read, named by \
         {ENV_SECRET_FILE}; or hand out an {ENV_UNIQUE_ID}"
    );
}

/// Resolves `host:port` (or `[v6]:port`), preferring IPv4 so every rank picks the same
/// family for a name that has both.
pub(crate) fn resolve(host_port: &str) -> Result<SocketAddr> {
    if let Ok(a) = host_port.parse::<SocketAddr>() {
        return Ok(a);
    }
    let addrs: Vec<SocketAddr> = host_port
        .to_socket_addrs()
        .map_err(|e| {
            Error::InvalidUsage(format!("cannot resolve root address {host_port:?}: {e}"))
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| {
            Error::InvalidUsage(format!("root address {host_port:?} resolves to nothing"))
        })
}

fn root_from_vars(get: &impl Fn(&str) -> Option<String>, launcher: Launcher) -> Result<String> {
    let port = match get("MASTER_PORT") {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| Error::InvalidUsage(format!("MASTER_PORT={p:?} is not a port number")))?,
        None => DEFAULT_MASTER_PORT,
    };
    let host = match get("MASTER_ADDR") {
        Some(h) => h,
        None if launcher == Launcher::Slurm => [
            "SLURM_STEP_NODELIST",
            "SLURM_JOB_NODELIST",
            "SLURM_NODELIST",
        ]
        .iter()
        .find_map(|v| get(v))
        .and_then(|list| first_host(&list))
        .ok_or_else(|| {
            Error::InvalidUsage(
                "Slurm environment without MASTER_ADDR or a readable SLURM_STEP_NODELIST; \
                     set MASTER_ADDR/MASTER_PORT or OXCCL_UNIQUE_ID"
                    .into(),
            )
        })?,
        None => {
            return Err(Error::InvalidUsage(format!(
                "{launcher} environment found but no root address: set MASTER_ADDR (and \
                 MASTER_PORT, default {DEFAULT_MASTER_PORT}) or {ENV_UNIQUE_ID}"
            )));
        }
    };
    // A bare IPv6 address needs brackets to take a port.
    if host.contains(':') && !host.starts_with('[') {
        Ok(format!("[{host}]:{port}"))
    } else {
        Ok(format!("{host}:{port}"))
    }
}

/// First host of a Slurm host list: `gpu[03-05,9],cpu1` → `gpu03`.
pub(crate) fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut entry = first_entry(list);
    // One bracket group at a time (`rack[1-2]-n[4-5]`: `rack1`, then `-n4`), each read
    // once: a list of many groups must not take a stack frame, a copy of the host, or
    // another scan of the list per group.
    while let Some((prefix, rest)) = entry.split_once('[') {
        let inner = rest.split(']').next().unwrap_or_default();
        let first = inner.split(',').next().unwrap_or_default();
        let lo = first.split('-').next().unwrap_or_default();
        host.push_str(prefix);
        host.push_str(lo);
        entry = rest.split_once(']').map_or("", |(_, suffix)| suffix.trim());
    }
    host.push_str(entry);
    (!host.is_empty()).then_some(host)
}

/// The first entry of a Slurm host list: up to the first comma outside brackets.
fn first_entry(list: &str) -> &str {
    let list = list.trim();
    let mut depth = 0usize;
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => return &list[..i],
            _ => {}
        }
    }
    list
}

fn derive_secret(
    get: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
    root: &str,
    size: usize,
) -> Secret {
    let mut h = Sha256::new();
    h.update(b"oxccl-bootstrap derived secret v1\0");
    h.update(launcher.to_string().as_bytes());
    h.update(b"\0");
    h.update(root.as_bytes());
    h.update(b"\0");
    h.update((size as u64).to_le_bytes());
    for name in JOB_ID_VARS {
        h.update(name.as_bytes());
        h.update(b"=");
        h.update(get(name).unwrap_or_default().as_bytes());
        h.update(b"\0");
    }
    let digest = h.finalize();
    let mut bytes = [0u8; SECRET_BYTES];
    bytes.copy_from_slice(&digest[..SECRET_BYTES]);
    Secret::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against `LAUNCHER_VARS` drifting from what detection reads: a variable read
    /// but not listed is invisible to `detect` and left in test children's environments; a
    /// listed one no longer read is noise.
    #[test]
    fn launcher_vars_are_exactly_the_variables_read() {
        use std::cell::RefCell;
        use std::collections::BTreeSet;

        let read = RefCell::new(BTreeSet::new());
        let lookup = |vars: &[(&str, &str)]| {
            let _ = LaunchEnv::from_lookup(|name| {
                read.borrow_mut().insert(name.to_owned());
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            });
        };
        lookup(&[]);
        for l in &LAUNCHERS {
            let launcher = [(l.rank, "0"), (l.size, "2")];
            // No root address: the fallbacks are read.
            lookup(&launcher);
            // A root, no secret: every secret source, then the derivation's job ids.
            lookup(&[launcher[0], launcher[1], ("MASTER_ADDR", "127.0.0.1")]);
        }
        let read = read.into_inner();
        let listed: BTreeSet<String> = LAUNCHER_VARS.iter().map(|v| (*v).to_owned()).collect();
        assert_eq!(
            listed.len(),
            LAUNCHER_VARS.len(),
            "duplicates in LAUNCHER_VARS"
        );
        assert_eq!(
            read.difference(&listed).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "read but not in LAUNCHER_VARS"
        );
        assert_eq!(
            listed.difference(&read).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "in LAUNCHER_VARS but never read"
        );
    }

    // Guards against a node list of many bracket groups (a launcher's variable may hold
    // 128 KiB) exhausting the stack (a frame per group: the process aborted), or taking time
    // that grows with its square (a copy and a scan of the rest per group: 23 s here).
    #[test]
    fn slurm_first_host_of_many_bracket_groups() {
        let groups = 20_000;
        let list = "n[1-2]".repeat(groups);
        assert_eq!(first_host(&list), Some("n1".repeat(groups)));
    }

    // Guards against misreading Slurm's compressed host lists (the root would be a host
    // that does not exist).
    #[test]
    fn slurm_first_host() {
        assert_eq!(first_host("node1").as_deref(), Some("node1"));
        assert_eq!(first_host("gpu[03-05,9],cpu1").as_deref(), Some("gpu03"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("rack[1-2]-n[4-5]").as_deref(), Some("rack1-n4"));
        assert_eq!(first_host("").as_deref(), None);
        assert_eq!(first_host("[").as_deref(), None);
        assert_eq!(first_host("x[").as_deref(), Some("x"));
    }
}
