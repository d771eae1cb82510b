//! GEMM (issue 47). PLACEHOLDER of the Hopper worktree: only the Hopper path's modules; the
//! lead replaces this file with the GEMM core's mod.rs and adds them there.

// Not yet called from the crate: the core's dispatch and the CLI will (the lead wires them).
#[allow(dead_code)]
pub(crate) mod hopper;
#[cfg(test)]
mod hopper_tests;
