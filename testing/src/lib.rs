//! Test support for oxccl: run a job of N child processes of the current test binary, the
//! way a launcher starts ranks, and collect what each one did.
//!
//! Not part of the oxccl API and not published; the crates of this workspace use it as a
//! dev-dependency.
//!
//! A process test has two halves in one test binary: an `#[ignore]`d test that is the
//! child's role (it never runs in a normal `cargo test`), and an ordinary test that starts
//! the job with [`Job`] and checks each [`ChildOutcome`]:
//!
//! ```no_run
//! use oxccl_testing::Job;
//!
//! #[test]
//! #[ignore = "the child role of `two_ranks`, started by it"]
//! fn rank_child() {
//!     let rank = oxccl_testing::child_rank().expect("started by a Job");
//!     println!("CHILD-OK rank={rank}");
//! }
//!
//! #[test]
//! fn two_ranks() {
//!     let outcomes = Job::new(2)
//!         .child_test("rank_child")
//!         .env_all("MASTER_ADDR", "127.0.0.1")
//!         .env(1, "RANK", "1")
//!         .run()
//!         .unwrap();
//!     for o in &outcomes {
//!         assert!(o.success(), "{o}");
//!         assert!(o.find_line("CHILD-OK").is_some(), "{o}");
//!     }
//! }
//! ```
//!
//! What a job guarantees:
//! - each child runs exactly the named test (`NAME --exact --ignored --nocapture
//!   --test-threads=1`), and an outcome counts as a success only if that one test ran and
//!   passed, so a misspelt name cannot pass by running nothing;
//! - every variable of [`oxccl_bootstrap::LAUNCHER_VARS`] is removed from a child's
//!   environment before the caller's are set, so a job run inside torchrun, `mpirun` or
//!   Slurm sees only what the test gives it; [`CHILD_RANK_ENV`] holds the child's index;
//! - every stdout and stderr is read by a thread of its own while the children run, so a
//!   chatty child never blocks on a full pipe; the last [`DEFAULT_MAX_OUTPUT_BYTES`] of
//!   each are kept;
//! - one deadline covers the whole job: at the deadline every child still running is
//!   killed and reported as such, and a child is never left running, even when the
//!   calling test panics.
//!
//! | file | concept |
//! |---|---|
//! | `job.rs` | [`Job`]: starting, waiting for and killing the children |
//! | `outcome.rs` | [`ChildOutcome`]: one child's status and output |
//! | `pipe.rs` | reading a child's pipe on a thread, keeping its tail |
//! | `free_port.rs` | [`free_port()`]: a loopback port for rank 0 |
//! | `error.rs` | [`Error`] |

#![warn(missing_docs)]

mod error;
mod free_port;
mod job;
mod outcome;
mod pipe;

pub use error::Error;
pub use free_port::free_port;
pub use job::{CHILD_RANK_ENV, DEFAULT_DEADLINE, DEFAULT_MAX_OUTPUT_BYTES, Job, child_rank};
pub use outcome::ChildOutcome;
