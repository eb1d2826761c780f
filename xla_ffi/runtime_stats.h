// Per-call-site execution counters behind zipccl_jax.set_runtime_stats.
//
// The CPU handler `zipccl_count` runs once per device per execution of a
// collective's call site and adds to this process's counters; Python reads them
// with `_zipccl.runtime_counts()`. A jax.debug.callback did the same through
// Python and cost ~1 ms of CPU per call on a loaded 2-core host, which is more
// than coding a 1 MB chunk.
#pragma once

#include <cstdint>
#include <map>

namespace zipccl::runtime_stats {

struct Counts {
  uint64_t calls = 0;      // device executions of the call site
  uint64_t fallbacks = 0;  // of which took the raw-resend path
};

// Thread-safe: devices of one process execute concurrently.
void Add(int64_t site, bool fallback);
std::map<int64_t, Counts> Snapshot();
void Reset();

}  // namespace zipccl::runtime_stats
