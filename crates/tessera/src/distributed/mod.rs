//! Several GPUs over NCCL: a [`Communicator`] per GPU (cudarc's `nccl` bindings, loaded at run
//! time) and distributed LSMR with `A` partitioned by rows (issue 48).
//!
//! * [`Communicator`]: one rank of an NCCL communicator on one [`Context`](crate::runtime::Context),
//!   built from a [`UniqueId`] ([`unique_id`]) shared by all ranks (one thread or process per
//!   GPU), or [`Communicator::single`] (one rank); in-place sums of f32/f64 device buffers on
//!   the context's stream ([`Communicator::all_reduce_sum`]). Without NCCL or a GPU, an error
//!   that says what is missing and where it was looked for (`runtime::probe::nccl`), never a
//!   panic.
//! * [`Collective`]: the sums the distributed solver is written against, implemented by
//!   [`Communicator`] and by [`LocalGroup`] (ranks = threads of one process sharing a buffer
//!   and a barrier, summing in rank order: deterministic), which the CPU tests use.
//! * [`RowPartition`]: contiguous row blocks balanced by nonzeros (its docs state the rule;
//!   empty blocks allowed), [`row_block`] cuts a rank's block out of a CSR matrix.
//! * [`DistributedOperator`] (device) and [`HostDistributedOperator`] (host): a rank's block
//!   `A_i`; `A x` local, `A^T u` = all-reduce of the ranks' `A_i^T u_i`, `||u||^2` = all-reduce
//!   of the `||u_i||^2`.
//! * [`lsmr_distributed`] (GPU) and [`lsmr_distributed_host`] (host, f64): LSMR with the
//!   options, stopping rules and result of the one-GPU solver, each rank holding its rows; the
//!   GPU version is a host-driven loop (`lsmr` module docs say why), its vector kernels in
//!   `lsmr_dist.cu`. [`lsmr_host_in_threads`] runs the host version on `G` threads.
//!
//! Status (NOTES.md beside this file): compile-checked and CPU-tested (the host solver over
//! 1 to 4 in-process ranks against `lsmr_host`, partitioning, validation, the probe without
//! NCCL; with PyTorch's `libnccl.so.2` linked as `libnccl.so`, NCCL's version and unique id on a
//! machine without a GPU). Communicators, all-reduces and the GPU solver have not run on a GPU
//! yet; the kernels compile with NVRTC for sm_80..sm_90a without spills. The CLI's
//! `tessera lsmr --gpus G` and the verify cases `lsmr distributed size-1 ...` use them.

pub mod collective;
pub mod communicator;
pub mod lsmr;
pub mod operator;
pub mod partition;
#[cfg(feature = "harness")]
pub mod verify;

#[cfg(test)]
mod tests;

pub use collective::{Collective, LocalCollective, LocalGroup, LOCAL_TIMEOUT};
pub use communicator::{unique_id, Communicator, UniqueId};
pub use lsmr::{lsmr_distributed, lsmr_distributed_host, lsmr_host_in_threads, DistributedRunOptions};
pub use operator::{DistributedOperator, HostDistributedOperator};
pub use partition::{row_block, RowPartition};
