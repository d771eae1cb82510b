// async_copy.cuh: asynchronous global -> shared copies (cp.async, sm_80+).
//
// `cp_async_16` starts a 16-byte copy that bypasses registers (LDGSTS); a thread may start many
// before waiting, so one thread keeps far more bytes in flight than with ordinary loads.
// `cp_async_commit` closes the group of copies started so far; `cp_async_wait_all` waits for
// every group of this thread. The copied data is visible to other threads only after a barrier
// that follows the wait.
//
// Both addresses must be 16-byte aligned. `.cg` caches the line in L2 only (streamed data).
#pragma once

#include "tessera/common.cuh"

namespace ts {

/// Starts a 16-byte copy from global `src` to shared `dst` (both 16-byte aligned).
TS_DEVICE void cp_async_16(void* dst, const void* src) {
  uint64_t s;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)s), "l"(src) : "memory");
}

/// Closes the current group of asynchronous copies.
TS_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/// Waits until every asynchronous copy group of this thread has completed.
TS_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

}  // namespace ts
