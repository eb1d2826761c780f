// SIMT emulator of the CUDA codec driver: runs the kernel bodies of
// codec/cuda_{encode,decode}.cuh and the launch sequences of cuda_launch.cuh on
// the CPU, for tests on machines without a GPU.
//
// Each CTA runs as one fiber per thread (ucontext). The scheduler resumes a
// randomly chosen ready thread until it reaches a barrier, exits, or yields;
// once all threads wait at the barrier, a new barrier interval starts. A thread
// that exits while others wait at a barrier is reported as barrier divergence.
// Shared memory, scratch memory and the CTA order are filled / shuffled from a
// seed, so a missing barrier or a read of uninitialised memory shows up as a
// byte difference against the CPU driver. Vector, word and element accesses
// that a GPU would fault on as misaligned are errors (EmuCheckAligned of
// cuda_common.cuh); the host atomics of cuda_common.cuh are real atomic
// builtins.
//
// Instrumented builds (the sanitized tests: tests/test_ffi_contract.py,
// tests/test_emulator_sanitized.py) compile the kernel-instantiating sources
// with the compiler's ThreadSanitizer instrumentation and link
// simt_race_hooks.cc in place of the TSan runtime: every load, store and
// atomic of the kernel bodies then calls EmuOnAccess, which
//   - detects shared-memory races: per byte of the CTA's Shared struct and per
//     barrier interval it remembers the threads that read, wrote and accessed
//     it atomically; two different threads touching one byte in one interval,
//     at least one writing, not both atomically, is an error naming the
//     kernel, the CTA, the interval, the byte offset and both threads;
//   - yields to another ready thread at random (seeded): at most accesses
//     rarely, at atomics often, so an ordering bug between barriers shows up;
//   - forwards the access to AddressSanitizer's check (__asan_loadN/storeN).
// Without the instrumentation (the Python extension) the emulator runs as
// before: threads switch only at barriers, and there is no race detection.
// What it cannot show: warp-level timing and intrinsics (the device's CTA-wide
// scan, a warp-shuffle scan in codec/kernels.cu, is replaced here by a
// sequential one of the same contract; a warp ballot is a CTA barrier here), memory-model effects between CTAs
// (CTAs run one after the other) and races in global memory. The block-size
// scan is a kernel body of ours (cuda_scan.cuh) and runs here as it is.
//
// Pure host C++ (no CUDA toolkit). Used by cuda_host_bindings.cc (the Python
// submodule zipccl_jax._zipccl.cuda_host) and by emulated_driver.cc (the
// driver's host API on the emulator, linked into the FFI contract test in
// place of the real driver).
#pragma once

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/cuda_launch.cuh"

// The emulator's own machinery is never instrumented: its accesses are not the
// kernels', and the hooks of simt_race_hooks.cc call into it.
#define ZIPCCL_EMU_NOINSTR __attribute__((no_sanitize("thread")))

namespace zipccl::cuda::emu {

class Scheduler;

enum class Access : uint8_t { kRead, kWrite, kAtomic };

constexpr uint16_t kNoThread = 0xFFFF;
// Mean number of instrumented plain accesses between two random yields (a
// yield costs two context switches); an atomic yields with probability 1/2.
constexpr uint32_t kPlainYieldPeriod = 64;

// One byte of the running CTA's shared memory during barrier interval `epoch`:
// up to two distinct threads that loaded it, the thread that stored it, up to
// two distinct threads that accessed it atomically.
struct ShadowByte {
  uint64_t epoch;
  uint16_t reader[2], writer, atomic[2];
};

// Per OS thread: the CTA being emulated and the race detector's state.
struct EmuState {
  Scheduler* sched = nullptr;
  uint16_t tid = kNoThread;  // the fiber running, or kNoThread (the scheduler)
  bool busy = false;         // inside the emulator's own code: accesses are not the kernel's
  uint64_t epoch = 0;        // barrier intervals so far, over all CTAs
  uint64_t interval = 0;     // barrier intervals of the current CTA
  const uint8_t* shared = nullptr;  // the CTA's Shared struct
  size_t shared_bytes = 0;
  const char* kernel = "";
  uint64_t block = 0;
  std::vector<ShadowByte> shadow;
  std::string race;          // the first race of the launch
  uint64_t rng = 1;          // xorshift64 state of the yields
  uint32_t countdown = 1;    // plain accesses until the next yield
  uint64_t yields = 0;       // random yields taken (tests check they happen)
};
inline EmuState& Emu() {
  static thread_local EmuState s;
  return s;
}
// Set by simt_race_hooks.cc when the kernels run under the instrumentation.
inline bool& EmuInstrumented() {
  static bool on = false;
  return on;
}

// AddressSanitizer on (g++ defines __SANITIZE_ADDRESS__, clang has __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define ZIPCCL_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZIPCCL_EMU_ASAN 1
#endif
#endif
#ifndef ZIPCCL_EMU_ASAN
#define ZIPCCL_EMU_ASAN 0
#endif

// One fiber's stack. How much stack a kernel body needs is the compiler's choice, not ours:
// AddressSanitizer puts redzones around every local, and how much that grows each frame changed
// between compilers (256 KiB was enough under g++ 12's ASan and overflowed under g++ 14's). So the
// stacks are sized far above any compiler's need (a native thread's 8 MiB; 64 MiB under ASan) and
// cost only what is touched: an anonymous MAP_NORESERVE mapping whose pages are committed on first
// use, with a PROT_NONE guard page below it so an overflow faults at once instead of writing into
// the neighbouring fiber's stack.
class FiberStack {
 public:
  static constexpr size_t kBytes = size_t(ZIPCCL_EMU_ASAN ? 64 : 8) << 20;

  FiberStack() {
    guard_ = size_t(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, kBytes + guard_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<char*>(p);
    mprotect(base_, guard_, PROT_NONE);  // stacks grow down: the guard is the lowest page
  }
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  ~FiberStack() { munmap(base_, kBytes + guard_); }
  char* bottom() const { return base_ + guard_; }

 private:
  char* base_ = nullptr;
  size_t guard_ = 0;
};

// Cooperative scheduler of the threads of one CTA.
class Scheduler {
 public:
  static constexpr size_t kStackBytes = FiberStack::kBytes;

  explicit Scheduler(uint64_t seed) : rng_(seed) {}

  // Runs body(tid) for tid in [0, n) as fibers until all have returned.
  ZIPCCL_EMU_NOINSTR void Run(uint32_t n, const std::function<void(uint32_t)>& body) {
    if (stacks_.size() < n) {
      stacks_.resize(n);
      for (auto& s : stacks_)
        if (!s) s.reset(new FiberStack());
    }
    ctx_.assign(n, ucontext_t{});
    state_.assign(n, kReady);
    slot.assign(n, 0);
    body_ = &body;
    n_ = n;
    for (uint32_t t = 0; t < n; ++t) {
      getcontext(&ctx_[t]);
      ctx_[t].uc_stack.ss_sp = stacks_[t]->bottom();
      ctx_[t].uc_stack.ss_size = kStackBytes;
      ctx_[t].uc_link = &main_;
      const uintptr_t self = reinterpret_cast<uintptr_t>(this);
      makecontext(&ctx_[t], reinterpret_cast<void (*)()>(&Scheduler::Entry), 3,
                  int(uint32_t(self >> 32)), int(uint32_t(self)), int(t));
    }
    EmuState& emu = Emu();
    emu.sched = this;
    emu.busy = true;
    ++emu.epoch;
    emu.interval = 0;
    std::vector<uint32_t> ready(n);
    std::iota(ready.begin(), ready.end(), 0u);
    for (;;) {
      while (!ready.empty()) {  // one barrier interval: resume random ready threads
        const size_t i = size_t(rng_() % ready.size());
        const uint32_t t = ready[i];
        state_[t] = kRunning;
        ucontext_t* fiber = &ctx_[t];
        emu.tid = uint16_t(t);
        emu.busy = false;
        swapcontext(&main_, fiber);
        emu.busy = true;
        emu.tid = kNoThread;
        if (state_[t] != kReady) {  // at a barrier or done, not yielded
          ready[i] = ready.back();
          ready.pop_back();
        }
      }
      uint32_t waiting = 0, done = 0;
      for (uint32_t t = 0; t < n; ++t) {
        waiting += state_[t] == kWaiting;
        done += state_[t] == kDone;
      }
      if (waiting == 0) break;
      if (done) {
        emu.sched = nullptr;
        emu.busy = false;
        throw std::runtime_error("emulator: barrier divergence (a thread exited while others wait)");
      }
      for (uint32_t t = 0; t < n; ++t) {
        state_[t] = kReady;
        ready.push_back(t);
      }
      ++emu.epoch;
      ++emu.interval;
    }
    emu.sched = nullptr;
    emu.busy = false;
  }

  ZIPCCL_EMU_NOINSTR void Barrier(uint32_t tid) { Switch(tid, kWaiting); }
  // Lets another ready thread of the same barrier interval run first.
  ZIPCCL_EMU_NOINSTR void Yield(uint32_t tid) { Switch(tid, kReady); }

  std::mt19937_64& rng() { return rng_; }
  uint32_t size() const { return n_; }
  std::vector<uint64_t> slot;  // one word per thread for CTA-wide reductions

 private:
  enum State { kReady, kRunning, kWaiting, kDone };

  // Fiber side; the scheduler clears `busy` when it resumes the fiber.
  ZIPCCL_EMU_NOINSTR void Switch(uint32_t tid, State to) {
    Emu().busy = true;
    state_[tid] = to;
    swapcontext(&ctx_[tid], &main_);
  }

  ZIPCCL_EMU_NOINSTR static void Entry(int hi, int lo, int tid) {
    auto* self = reinterpret_cast<Scheduler*>((uintptr_t(uint32_t(hi)) << 32) | uint32_t(lo));
    (*self->body_)(uint32_t(tid));
    Emu().busy = true;
    self->state_[tid] = kDone;
  }

  std::mt19937_64 rng_;
  ucontext_t main_{};
  std::vector<ucontext_t> ctx_;
  std::vector<State> state_;
  std::vector<std::unique_ptr<FiberStack>> stacks_;
  const std::function<void(uint32_t)>* body_ = nullptr;
  uint32_t n_ = 0;
};

// ---- Race detector and random yields (called by simt_race_hooks.cc) ----------
inline const char* AccessName(Access a) {
  return a == Access::kRead ? "plain load" : a == Access::kWrite ? "plain store" : "atomic";
}
// A thread of `pair` other than t, or kNoThread.
inline uint16_t OtherThan(const uint16_t* pair, uint16_t t) {
  if (pair[0] != kNoThread && pair[0] != t) return pair[0];
  return pair[1] != t ? pair[1] : kNoThread;
}
inline void AddThread(uint16_t* pair, uint16_t t) {
  if (pair[0] == kNoThread) pair[0] = t;
  else if (pair[0] != t && pair[1] == kNoThread) pair[1] = t;
}

ZIPCCL_EMU_NOINSTR inline void CheckSharedByte(EmuState& s, size_t off, Access a) {
  ShadowByte& c = s.shadow[off];
  if (c.epoch != s.epoch) c = ShadowByte{s.epoch, {kNoThread, kNoThread}, kNoThread, {kNoThread, kNoThread}};
  const uint16_t t = s.tid;
  uint16_t other = kNoThread;
  Access theirs = Access::kWrite;
  if (c.writer != kNoThread && c.writer != t) {
    other = c.writer;
  } else if (a != Access::kRead && (other = OtherThan(c.reader, t)) != kNoThread) {
    theirs = Access::kRead;
  } else if (a != Access::kAtomic && (other = OtherThan(c.atomic, t)) != kNoThread) {
    theirs = Access::kAtomic;
  }
  if (other != kNoThread && s.race.empty()) {
    s.race = "shared-memory race in " + std::string(s.kernel) + " (CTA " + std::to_string(s.block) +
             ", barrier interval " + std::to_string(s.interval) + "): byte " + std::to_string(off) +
             " of its Shared struct (" + std::to_string(s.shared_bytes) + " bytes): thread " +
             std::to_string(other) + " " + AccessName(theirs) + ", thread " + std::to_string(t) + " " +
             AccessName(a) + " with no barrier between them";
  }
  if (a == Access::kRead) AddThread(c.reader, t);
  else if (a == Access::kAtomic) AddThread(c.atomic, t);
  else if (c.writer == kNoThread) c.writer = t;
}

// Every instrumented access of a kernel body: race check when it touches the
// CTA's shared memory, then perhaps a yield to another ready thread.
ZIPCCL_EMU_NOINSTR inline void EmuOnAccess(const void* p, size_t bytes, Access a) {
  EmuState& s = Emu();
  if (s.busy || s.tid == kNoThread || s.sched == nullptr) return;  // not a kernel thread's access
  s.busy = true;  // the emulator's own code below may itself be instrumented
  const uintptr_t off = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(s.shared);
  if (s.shared != nullptr && off < s.shared_bytes) {
    const size_t end = std::min(off + bytes, s.shared_bytes);
    for (size_t i = off; i < end; ++i) CheckSharedByte(s, i, a);
  }
  s.rng ^= s.rng << 13, s.rng ^= s.rng >> 7, s.rng ^= s.rng << 17;
  const bool yield = a == Access::kAtomic ? (s.rng >> 63) != 0 : --s.countdown == 0;
  if (!yield) {
    s.busy = false;
    return;
  }
  if (a != Access::kAtomic) s.countdown = 1 + uint32_t(s.rng % (2 * kPlainYieldPeriod));
  ++s.yields;
  s.sched->Yield(s.tid);
}

// The CTA primitives of the kernel bodies, emulated.
struct FiberCta {
  Scheduler* s;
  uint32_t t;
  uint64_t b;
  uint32_t tid() const { return t; }
  uint64_t block() const { return b; }
  ZIPCCL_EMU_NOINSTR void sync() { s->Barrier(t); }
  ZIPCCL_EMU_NOINSTR int sync_or(int pred) {
    s->slot[t] = pred != 0;
    sync();
    int r = 0;
    for (uint32_t i = 0; i < s->size(); ++i) r |= int(s->slot[i]);
    sync();
    return r;
  }
  // __ballot_sync over the caller's warp. A warp's lanes must vote together;
  // here the vote is a CTA barrier, so every thread of the CTA must reach it
  // (the kernels' contract, cuda_common.cuh), which also catches a ballot a
  // warp would reach with missing lanes.
  ZIPCCL_EMU_NOINSTR uint32_t ballot(int pred) {
    s->slot[t] = pred != 0;
    sync();
    const uint32_t w0 = t & ~31u;
    uint32_t r = 0;
    for (uint32_t i = 0; i < 32 && w0 + i < s->size(); ++i) r |= uint32_t(s->slot[w0 + i] != 0) << i;
    sync();
    return r;
  }
  // __shfl_sync: v of lane `src` of the caller's warp; a CTA barrier here, like ballot.
  ZIPCCL_EMU_NOINSTR uint32_t shfl(uint32_t v, uint32_t src) {
    s->slot[t] = v;
    sync();
    const uint32_t r = uint32_t(s->slot[(t & ~31u) + (src & 31u)]);
    sync();
    return r;
  }
  // __syncwarp: a CTA barrier here (a warp's threads are not a unit of the scheduler).
  ZIPCCL_EMU_NOINSTR void warp_sync() { sync(); }
  ZIPCCL_EMU_NOINSTR uint32_t exclusive_sum(uint32_t v, uint32_t* aggregate) {
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

ZIPCCL_EMU_NOINSTR inline void FillGarbage(void* p, size_t bytes, std::mt19937_64& rng) {
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
  ZIPCCL_EMU_NOINSTR void Launch(uint64_t grid, const typename K::Params& p) {
    using Shared = typename K::Shared;
    records.push_back({K::kName, grid, K::kBlockThreads, sizeof(Shared)});
    if (!execute || grid == 0) return;
    std::vector<uint64_t> order(grid);
    std::iota(order.begin(), order.end(), uint64_t(0));
    std::shuffle(order.begin(), order.end(), sched.rng());
    auto sm = std::make_unique<Shared>();
    EmuState& emu = Emu();
    emu.shadow.assign(std::max(emu.shadow.size(), sizeof(Shared)), ShadowByte{0, {}, 0, {}});
    emu.race.clear();
    emu.rng = sched.rng()() | 1;
    struct Unwatch {  // the shared range is only watched while this launch runs
      EmuState& e;
      ~Unwatch() { e.shared = nullptr, e.shared_bytes = 0; }
    } unwatch{emu};
    for (uint64_t block : order) {
      FillGarbage(sm.get(), sizeof(Shared), sched.rng());
      emu.shared = reinterpret_cast<const uint8_t*>(sm.get());
      emu.shared_bytes = sizeof(Shared);
      emu.kernel = K::kName;
      emu.block = block;
      std::function<void(uint32_t)> body = [&](uint32_t tid) {
        FiberCta cta{&sched, tid, block};
        K::Run(cta, *sm, p);
      };
      sched.Run(uint32_t(K::kBlockThreads), body);
      if (const char* fault = EmuFault()) {  // what a GPU would have faulted on
        EmuFault() = nullptr;
        throw std::runtime_error(std::string("emulator: ") + fault + " in " + K::kName);
      }
      if (!emu.race.empty()) throw std::runtime_error("emulator: " + emu.race);
    }
  }
};

// Scratch of `bytes` bytes, kScratchAlign-aligned, in *storage and filled with garbage as device memory
// starts; null when the launcher only records.
inline uint8_t* GarbageScratch(EmuLauncher& l, uint64_t bytes, std::vector<uint8_t>* storage) {
  if (!l.execute) return nullptr;
  storage->resize(bytes + kScratchAlign);
  FillGarbage(storage->data(), storage->size(), l.sched.rng());
  return storage->data() + (kScratchAlign - reinterpret_cast<uintptr_t>(storage->data()) % kScratchAlign);
}

// Runs (or, unless `execute`, only records) the encoder's launch sequence on
// host memory, with scratch of its own: what the Python bindings
// (cuda_host_bindings.cc) and the sanitized driver (tests/cc/emulator_driver.cc) run.
inline std::vector<LaunchRecord> EmulateEncode(const uint8_t* x, uint64_t frames, uint64_t n, int dtype,
                                               bool checksum, uint8_t* out, uint64_t cap,
                                               int64_t* nbytes, const uint8_t* skip, bool execute,
                                               uint64_t seed) {
  const EncodeLayout L = MakeEncodeLayout(frames, n);
  EmuLauncher l(execute, seed);
  std::vector<uint8_t> scratch;
  uint8_t* s = GarbageScratch(l, L.scratch_bytes, &scratch);
  EncodeParams p =
      MakeEncodeParams(L, x, uint8_t(dtype), checksum, out, cap, nbytes, /*nbytes64=*/true, skip, s);
  RunEncode(l, p);
  return l.records;
}

// The decoder's launch sequence, like EmulateEncode; frame f's output starts at element
// f * out_row of out (0: n, contiguous).
inline std::vector<LaunchRecord> EmulateDecode(const uint8_t* payload, uint64_t frames, uint64_t cap,
                                               int dtype, uint64_t n, uint8_t* out, int32_t* status,
                                               const uint8_t* skip, bool execute, uint64_t seed,
                                               uint64_t out_row = 0) {
  const DecodeLayout L = MakeDecodeLayout(frames, n);
  EmuLauncher l(execute, seed);
  std::vector<uint8_t> scratch;
  uint8_t* s = GarbageScratch(l, L.scratch_bytes, &scratch);
  DecodeParams p =
      MakeDecodeParams(L, payload, cap, uint8_t(dtype), out, out_row ? out_row : n, status, skip, s);
  RunDecode(l, p);
  return l.records;
}

}  // namespace zipccl::cuda::emu
