//! Rank discovery and out-of-band exchange for oxccl.
