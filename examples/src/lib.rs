//! Shared helpers of the oxccl example programs.
