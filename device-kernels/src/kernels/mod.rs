//! Kernels shipped with oxccl.
