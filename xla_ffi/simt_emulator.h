// SIMT emulator of the CUDA codec driver: runs the kernel bodies of
// codec/cuda_{encode,decode}.cuh and the launch sequences of cuda_launch.cuh on
// the CPU, for tests on machines without a GPU.
//
// Each CTA runs as one fiber per thread (ucontext). A barrier switches back to
// the scheduler, which resumes the threads in a freshly shuffled order once all
// of them have arrived; a thread that exits while others wait at a barrier is
// reported as barrier divergence. Shared memory, scratch memory and the CTA
// order are filled / shuffled from a seed, so a missing barrier or a read of
// uninitialised memory shows up as a byte difference against the CPU driver.
// Atomics are plain read-modify-writes (only one fiber runs at a time). Vector,
// word and element accesses that a GPU would fault on as misaligned are errors
// (EmuCheckAligned of cuda_common.cuh). What it cannot show: races inside one
// barrier interval (fibers switch only at barriers, so a plain `|=` in place of
// an atomic is never interleaved), warp-level timing, memory-model effects
// between CTAs, and anything about CUB itself (its scans are replaced by
// sequential ones of the same contract).
//
// Pure host C++ (no CUDA toolkit). Used by cuda_host_bindings.cc (the Python
// submodule zipccl_jax._zipccl.cuda_host) and by emulated_kernels.cc (the
// driver's host API on the emulator, linked into the FFI contract test in
// place of codec/kernels.cu).
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/cuda_launch.cuh"

namespace zipccl::cuda::emu {

// Cooperative scheduler of the threads of one CTA.
class Scheduler {
 public:
  static constexpr size_t kStackBytes = 256 * 1024;

  explicit Scheduler(uint64_t seed) : rng_(seed) {}

  // Runs body(tid) for tid in [0, n) as fibers until all have returned.
  void Run(uint32_t n, const std::function<void(uint32_t)>& body) {
    if (stacks_.size() < n) {
      stacks_.resize(n);
      for (auto& s : stacks_)
        if (!s) s.reset(new char[kStackBytes]);
    }
    ctx_.assign(n, ucontext_t{});
    state_.assign(n, kReady);
    slot.assign(n, 0);
    body_ = &body;
    n_ = n;
    for (uint32_t t = 0; t < n; ++t) {
      getcontext(&ctx_[t]);
      ctx_[t].uc_stack.ss_sp = stacks_[t].get();
      ctx_[t].uc_stack.ss_size = kStackBytes;
      ctx_[t].uc_link = &main_;
      const uintptr_t self = reinterpret_cast<uintptr_t>(this);
      makecontext(&ctx_[t], reinterpret_cast<void (*)()>(&Scheduler::Entry), 3,
                  int(uint32_t(self >> 32)), int(uint32_t(self)), int(t));
    }
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    for (;;) {
      std::shuffle(order.begin(), order.end(), rng_);
      for (uint32_t t : order) {
        if (state_[t] != kReady) continue;
        state_[t] = kRunning;
        swapcontext(&main_, &ctx_[t]);
      }
      uint32_t waiting = 0, done = 0;
      for (uint32_t t = 0; t < n; ++t) {
        waiting += state_[t] == kWaiting;
        done += state_[t] == kDone;
      }
      if (waiting == 0) break;
      if (done) throw std::runtime_error("emulator: barrier divergence (a thread exited while others wait)");
      for (uint32_t t = 0; t < n; ++t) state_[t] = kReady;
    }
  }

  void Barrier(uint32_t tid) {
    state_[tid] = kWaiting;
    swapcontext(&ctx_[tid], &main_);
  }

  std::mt19937_64& rng() { return rng_; }
  uint32_t size() const { return n_; }
  std::vector<uint64_t> slot;  // one word per thread for CTA-wide reductions

 private:
  enum State { kReady, kRunning, kWaiting, kDone };

  static void Entry(int hi, int lo, int tid) {
    auto* self = reinterpret_cast<Scheduler*>((uintptr_t(uint32_t(hi)) << 32) | uint32_t(lo));
    (*self->body_)(uint32_t(tid));
    self->state_[tid] = kDone;
  }

  std::mt19937_64 rng_;
  ucontext_t main_{};
  std::vector<ucontext_t> ctx_;
  std::vector<State> state_;
  std::vector<std::unique_ptr<char[]>> stacks_;
  const std::function<void(uint32_t)>* body_ = nullptr;
  uint32_t n_ = 0;
};

// The CTA primitives of the kernel bodies, emulated.
struct FiberCta {
  Scheduler* s;
  uint32_t t;
  uint64_t b;
  uint32_t tid() const { return t; }
  uint64_t block() const { return b; }
  void sync() { s->Barrier(t); }
  int sync_or(int pred) {
    s->slot[t] = pred != 0;
    sync();
    int r = 0;
    for (uint32_t i = 0; i < s->size(); ++i) r |= int(s->slot[i]);
    sync();
    return r;
  }
  uint32_t exclusive_sum(uint32_t v, uint32_t* aggregate) {
    s->slot[t] = v;
    sync();
    uint32_t before = 0, all = 0;
    for (uint32_t i = 0; i < s->size(); ++i) {
      if (i < t) before += uint32_t(s->slot[i]);
      all += uint32_t(s->slot[i]);
    }
    sync();
    *aggregate = all;
    return before;
  }
};

inline void FillGarbage(void* p, size_t bytes, std::mt19937_64& rng) {
  auto* q = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < bytes; ++i) q[i] = uint8_t(rng());
}

struct LaunchRecord {
  std::string name;
  uint64_t grid;
  int threads;
  uint64_t shared_bytes;
};

// Launcher for RunEncode/RunDecode: records every launch and, if `execute`,
// runs it in the emulator.
struct EmuLauncher {
  bool execute;
  Scheduler sched;
  std::vector<LaunchRecord> records;

  EmuLauncher(bool exec, uint64_t seed) : execute(exec), sched(seed) {}

  template <class K>
  void Launch(uint64_t grid, const typename K::Params& p) {
    records.push_back({K::kName, grid, K::kBlockThreads, sizeof(typename K::Shared)});
    if (!execute || grid == 0) return;
    std::vector<uint64_t> order(grid);
    std::iota(order.begin(), order.end(), uint64_t(0));
    std::shuffle(order.begin(), order.end(), sched.rng());
    auto sm = std::make_unique<typename K::Shared>();
    for (uint64_t block : order) {
      FillGarbage(sm.get(), sizeof(typename K::Shared), sched.rng());
      std::function<void(uint32_t)> body = [&](uint32_t tid) {
        FiberCta cta{&sched, tid, block};
        K::Run(cta, *sm, p);
      };
      sched.Run(uint32_t(K::kBlockThreads), body);
      if (const char* fault = EmuFault()) {  // what a GPU would have faulted on
        EmuFault() = nullptr;
        throw std::runtime_error(std::string("emulator: ") + fault + " in " + K::kName);
      }
    }
  }

  // CUB's contract: temp_bytes of temporary storage at temp, which the scan
  // may overwrite (filled with garbage here, so a layout that overlaps it with
  // live data shows up).
  void ExclusiveSum(const uint64_t* in, uint64_t* out, uint64_t n, void* temp,
                    uint64_t temp_bytes) {
    records.push_back({"cub_exclusive_sum", n, 0, 0});
    if (!execute) return;
    if (temp_bytes) FillGarbage(temp, size_t(temp_bytes), sched.rng());
    uint64_t acc = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = in[i];
      out[i] = acc;
      acc += v;
    }
  }
};

}  // namespace zipccl::cuda::emu
