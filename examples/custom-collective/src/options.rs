//! What the example runs, and the job settings every rank shares.

use oxccl::in_process::InProcessConfig;
use oxccl::{CommunicatorConfig, Error, Result};
use std::time::Duration;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Ranks, each a thread with its own emulated device (2 to 256).
    pub ranks: u32,
    /// Elements (`u32`) each rank contributes to the all-gather, and the root broadcasts
    /// (1 to 65536).
    pub count: usize,
    /// Launches of each kernel, back to back with no host barrier (1 to 256), each with
    /// data of its own.
    pub launches: u32,
    /// Threads of the one block each launch runs.
    pub threads: u32,
    /// The rank whose data the broadcast sends.
    pub root: u32,
    /// Let a kernel thread carry out its own port channel requests when the proxy thread is
    /// idle (faster on few cores; off, every copy goes through the proxy thread, as on a GPU).
    pub proxy_assist: bool,
    /// Longest any one device wait may take before the kernel gives up and the host
    /// reports the channel.
    pub wait_timeout: Duration,
    /// Backend of every rank's device.
    pub backend: oxccl::Backend,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ranks: 4,
            count: 1000,
            launches: 5,
            threads: 8,
            root: 1,
            proxy_assist: true,
            wait_timeout: Duration::from_secs(30),
            backend: oxccl::Backend::Cpu,
        }
    }
}

impl Options {
    /// Checks the options fit the example (the values of [`crate::data::value`] keep rank,
    /// launch and index in 8, 8 and 16 bits).
    ///
    /// # Errors
    /// [`Error::InvalidUsage`] naming the option out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidUsage(what));
        if !(2..=256).contains(&self.ranks) {
            return bad(format!("--ranks {}: 2 to 256", self.ranks));
        }
        if !(1..=1 << 16).contains(&self.count) {
            return bad(format!("--count {}: 1 to 65536", self.count));
        }
        if !(1..=256).contains(&self.launches) {
            return bad(format!("--launches {}: 1 to 256", self.launches));
        }
        if self.threads == 0 {
            return bad("--threads 0: a block needs a thread".into());
        }
        if self.root >= self.ranks {
            return bad(format!("--root {}: a rank of 0..{}", self.root, self.ranks));
        }
        Ok(())
    }

    /// The settings of the in-process job.
    pub fn job_config(&self) -> InProcessConfig {
        InProcessConfig {
            communicator: CommunicatorConfig {
                wait_timeout: self.wait_timeout,
                proxy_assist: self.proxy_assist,
                ..Default::default()
            },
            exchange_timeout: self.wait_timeout,
            backend: self.backend,
        }
    }
}
