//! The one error type of the crate.

/// Why a job could not be run. A child that fails or hangs is not an error of the job: it
/// is reported in its [`ChildOutcome`](crate::ChildOutcome).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`Job::child_test`](crate::Job::child_test) was not called.
    #[error("no child test named: call Job::child_test")]
    NoChildTest,
    /// [`Job::env`](crate::Job::env) named a rank the job does not have.
    #[error("environment variable {key:?} set for rank {rank} of a job of {ranks}")]
    NoSuchRank {
        /// The rank given.
        rank: usize,
        /// The job's number of children.
        ranks: usize,
        /// The variable.
        key: String,
    },
    /// The operating system refused a call.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
