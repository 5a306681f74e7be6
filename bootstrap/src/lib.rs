//! Rank discovery and out-of-band exchange for oxccl.
//!
//! Before any GPU connection exists, ranks must find each other and swap handles. A
//! [`Bootstrap`] does that over TCP:
//!
//! - one rank makes a [`UniqueId`] (root address + 128-bit secret) and hands it to the
//!   others, e.g. in `OXCCL_UNIQUE_ID`; or every rank reads its place from the launcher's
//!   environment ([`Bootstrap::from_env`]: torchrun, Open MPI, Slurm, PMI);
//! - every connection proves knowledge of the secret (HMAC-SHA256 challenge-response, both
//!   ways) before any data is read, and every frame carries the protocol version;
//! - messages are postcard-encoded, length-prefixed frames with a size limit;
//! - [`Bootstrap::all_gather`] runs in `O(log N)` rounds (MSCCL++ uses an `N - 1`-step
//!   ring, kept here as [`Bootstrap::all_gather_ring`] for comparison), plus
//!   [`barrier`](Bootstrap::barrier), [`broadcast`](Bootstrap::broadcast) and tagged
//!   [`send`](Bootstrap::send)/[`recv`](Bootstrap::recv);
//! - every blocking call has a deadline ([`Config::with_timeout`], 60 s by default); when
//!   it passes the error names the ranks that did not answer.
//!
//! # Examples
//!
//! ```
//! use oxccl_bootstrap::{Bootstrap, Config, UniqueId};
//!
//! let (id, listener) = UniqueId::listen("127.0.0.1:0".parse().unwrap()).unwrap();
//! // In a real job `id.to_string()` travels to the other processes.
//! let id_str = id.to_string();
//! let other = std::thread::spawn(move || {
//!     let id: UniqueId = id_str.parse().unwrap();
//!     let bs = Bootstrap::init(&id, 1, 2).unwrap();
//!     bs.all_gather(b"handle of rank 1").unwrap()
//! });
//! let bs = Bootstrap::init_root(&id, listener, 2, &Config::default()).unwrap();
//! let all = bs.all_gather(b"handle of rank 0").unwrap();
//! assert_eq!(all[1], b"handle of rank 1");
//! assert_eq!(other.join().unwrap(), all);
//! ```
//!
//! # Features
//!
//! None; the crate depends on no other oxccl crate.
//!
//! | file | concept |
//! |---|---|
//! | `unique_id.rs` | [`UniqueId`], [`Secret`] and their string form |
//! | `env.rs` | launcher detection: [`LaunchEnv`], [`Launcher`] |
//! | `secret_file.rs` | reading the secret from `OXCCL_SECRET_FILE` |
//! | `frame.rs` | the wire format |
//! | `handshake.rs` | mutual authentication of a connection |
//! | `net.rs` | sockets: listeners, connects and reads bounded by a deadline |
//! | `peer.rs` | one peer's connections and unclaimed messages |
//! | `bootstrap.rs` | [`Bootstrap`]: the type, its shared state, accessors |
//! | `init.rs` | joining: the constructors, rank 0's listener, the rank table |
//! | `connect.rs` | which rank dials which, dialling and authenticating |
//! | `messaging.rs` | tagged send/recv and the framing the collectives use |
//! | `acceptor.rs` | accepting and authenticating incoming connections |
//! | `collective.rs` | all-gather, ring all-gather, barrier, broadcast |
//! | `config.rs` | [`Config`] |
//! | `limits.rs` | the open-file limit |
//! | `local_port.rs` | [`free_loopback_port`]: a root port for a job on this host |
//! | `error.rs` | [`Error`] |

#![warn(missing_docs)]

mod acceptor;
mod bootstrap;
mod collective;
mod config;
mod connect;
mod env;
mod error;
mod frame;
mod handshake;
mod init;
mod limits;
mod local_port;
mod messaging;
mod net;
mod peer;
mod secret_file;
mod unique_id;

pub use acceptor::MAX_CONCURRENT_HANDSHAKES;
pub use bootstrap::{Bootstrap, MAX_RANKS};
pub use config::{
    Config, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_MAX_PENDING_MESSAGES, DEFAULT_TIMEOUT, MIN_MAX_FRAME_BYTES,
};
pub use env::{
    DEFAULT_MASTER_PORT, ENV_BOOTSTRAP_BIND, ENV_SECRET, ENV_SECRET_FILE, ENV_UNIQUE_ID,
    LAUNCHER_VARS, LaunchEnv, Launcher, SecretSource,
};
pub use error::{Error, ErrorKind, Peer, RankList, Result};
pub use frame::PROTOCOL_VERSION;
pub use limits::{open_files_for_ranks_in_process, raise_open_file_limit};
pub use local_port::free_loopback_port;
pub use net::RootListener;
pub use unique_id::{ParseUniqueIdError, SECRET_BYTES, Secret, UNIQUE_ID_PREFIX, UniqueId};
