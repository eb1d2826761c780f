// Host-side view of the CUDA codec driver, for tests on machines without a GPU:
// the scratch layout, the launch sequence with its geometry, and a SIMT
// emulator that runs the very kernel bodies and launch sequence of
// codec/cuda_{encode,decode,launch}.cuh on the CPU.
//
// The emulator runs each CTA as one fiber per thread (ucontext). A barrier
// switches back to the scheduler, which resumes the threads in a freshly
// shuffled order once all of them have arrived; a thread that exits while
// others wait at a barrier is reported as barrier divergence. Shared memory,
// scratch memory and the CTA order are filled / shuffled from a seed, so a
// missing barrier or a read of uninitialised memory shows up as a byte
// difference against the CPU driver. Atomics are plain read-modify-writes
// (only one fiber runs at a time). What it cannot show: warp-level timing,
// memory-model effects between CTAs, and anything about CUB itself (its
// scans are replaced by sequential ones of the same contract).
//
// Pure host C++ (no CUDA toolkit needed): it can be built with or without
// ZIPCCL_WITH_CUDA. Exposed as the submodule `zipccl_jax._zipccl.cuda_host`
// through ZipcclRegisterCudaHost(), called from module.cc.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "codec/cuda_launch.cuh"
#include "codec/format.h"

namespace nb = nanobind;

namespace zipccl::cuda::emu {
namespace {

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

void FillGarbage(void* p, size_t bytes, std::mt19937_64& rng) {
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
    }
  }

  void ExclusiveSum(const uint64_t* in, uint64_t* out, uint64_t n, void*, uint64_t) {
    records.push_back({"cub_exclusive_sum", n, 0, 0});
    if (!execute) return;
    uint64_t acc = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = in[i];
      out[i] = acc;
      acc += v;
    }
  }
};

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using BytesOut = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64Out = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I32Out = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void CheckDType(int dtype) {
  if (ElemBytes(uint8_t(dtype)) == 0) throw nb::value_error("unsupported dtype code");
}

std::vector<std::tuple<std::string, uint64_t, int, uint64_t>> ToTuples(
    const std::vector<LaunchRecord>& r) {
  std::vector<std::tuple<std::string, uint64_t, int, uint64_t>> out;
  for (const auto& x : r) out.emplace_back(x.name, x.grid, x.threads, x.shared_bytes);
  return out;
}

nb::dict EncodeLayoutDict(const EncodeLayout& L) {
  nb::dict d;
  d["frames"] = L.frames;
  d["n"] = L.n;
  d["blocks_per_frame"] = L.nb;
  d["total_blocks"] = L.total;
  d["stats_off"] = L.stats_off;
  d["plans_off"] = L.plans_off;
  d["sizes_off"] = L.sizes_off;
  d["offsets_off"] = L.offsets_off;
  d["cub_off"] = L.cub_off;
  d["cub_bytes"] = L.cub_bytes;
  d["scratch_bytes"] = L.scratch_bytes;
  return d;
}

nb::dict DecodeLayoutDict(const DecodeLayout& L) {
  nb::dict d;
  d["frames"] = L.frames;
  d["n"] = L.n;
  d["blocks_per_frame"] = L.nb;
  d["total_blocks"] = L.total;
  d["ferr_off"] = L.ferr_off;
  d["berr_off"] = L.berr_off;
  d["sizes_off"] = L.sizes_off;
  d["offsets_off"] = L.offsets_off;
  d["cub_off"] = L.cub_off;
  d["cub_bytes"] = L.cub_bytes;
  d["scratch_bytes"] = L.scratch_bytes;
  return d;
}

// One skip flag per frame, or null.
const uint8_t* SkipFlags(const std::optional<Bytes>& skip, uint64_t frames) {
  if (!skip.has_value()) return nullptr;
  if (skip->size() != frames) throw nb::value_error("skip must hold one uint8 flag per frame");
  return skip->data();
}

// Runs (or only records) the encoder's launch sequence.
std::vector<LaunchRecord> Encode(const uint8_t* x, uint64_t frames, uint64_t n, int dtype,
                                 bool checksum, uint8_t* out, uint64_t cap, int64_t* nbytes,
                                 const uint8_t* skip, bool execute, uint64_t seed) {
  const EncodeLayout L = MakeEncodeLayout(frames, n, /*cub_bytes=*/0);
  EmuLauncher l(execute, seed);
  std::vector<uint8_t> scratch(execute ? L.scratch_bytes + kScratchAlign : 0);
  uint8_t* s = nullptr;
  if (execute) {
    FillGarbage(scratch.data(), scratch.size(), l.sched.rng());
    s = scratch.data() + (kScratchAlign - reinterpret_cast<uintptr_t>(scratch.data()) % kScratchAlign);
  }
  EncodeParams p =
      MakeEncodeParams(L, x, uint8_t(dtype), checksum, out, cap, nbytes, /*nbytes64=*/true, skip, s);
  RunEncode(l, p, L, s);
  return l.records;
}

std::vector<LaunchRecord> Decode(const uint8_t* payload, uint64_t frames, uint64_t cap,
                                 int dtype, uint64_t n, uint8_t* out, int32_t* status,
                                 const uint8_t* skip, bool execute, uint64_t seed) {
  const DecodeLayout L = MakeDecodeLayout(frames, n, /*cub_bytes=*/0);
  EmuLauncher l(execute, seed);
  std::vector<uint8_t> scratch(execute ? L.scratch_bytes + kScratchAlign : 0);
  uint8_t* s = nullptr;
  if (execute) {
    FillGarbage(scratch.data(), scratch.size(), l.sched.rng());
    s = scratch.data() + (kScratchAlign - reinterpret_cast<uintptr_t>(scratch.data()) % kScratchAlign);
  }
  DecodeParams p = MakeDecodeParams(L, payload, cap, uint8_t(dtype), out, status, skip, s);
  RunDecode(l, p, L, s);
  return l.records;
}

}  // namespace
}  // namespace zipccl::cuda::emu

void ZipcclRegisterCudaHost(nb::module_& parent) {
  using namespace zipccl::cuda;
  using namespace zipccl::cuda::emu;
  nb::module_ m = parent.def_submodule(
      "cuda_host", "Host-side pieces of the CUDA codec driver and its SIMT emulator (tests)");
  m.def("encode_layout",
        [](uint64_t frames, uint64_t n, uint64_t cub_bytes) {
          return EncodeLayoutDict(MakeEncodeLayout(frames, n, cub_bytes));
        },
        nb::arg("frames"), nb::arg("n_elems"), nb::arg("cub_bytes"),
        "Scratch layout of an encode call (byte offsets of each section).");
  m.def("decode_layout",
        [](uint64_t frames, uint64_t n, uint64_t cub_bytes) {
          return DecodeLayoutDict(MakeDecodeLayout(frames, n, cub_bytes));
        },
        nb::arg("frames"), nb::arg("n_elems"), nb::arg("cub_bytes"),
        "Scratch layout of a decode call.");
  m.def("encode_launches",
        [](uint64_t frames, uint64_t n, int dtype) {
          CheckDType(dtype);
          return ToTuples(Encode(nullptr, frames, n, dtype, false, nullptr, 0, nullptr, nullptr,
                                 /*execute=*/false, 0));
        },
        nb::arg("frames"), nb::arg("n_elems"), nb::arg("dtype_code"),
        "The encoder's launch sequence: (kernel, grid, threads per CTA, static shared bytes).");
  m.def("decode_launches",
        [](uint64_t frames, uint64_t n, int dtype, bool status) {
          CheckDType(dtype);
          int32_t dummy = 0;
          return ToTuples(Decode(nullptr, frames, 0, dtype, n, nullptr, status ? &dummy : nullptr,
                                 nullptr, /*execute=*/false, 0));
        },
        nb::arg("frames"), nb::arg("n_elems"), nb::arg("dtype_code"), nb::arg("status"),
        "The decoder's launch sequence: (kernel, grid, threads per CTA, static shared bytes).");
  m.def("emulate_encode",
        [](Bytes x, uint64_t frames, uint64_t n, int dtype, bool checksum, BytesOut out,
           I64Out nbytes, uint64_t seed, std::optional<Bytes> skip) {
          CheckDType(dtype);
          const uint64_t w = uint64_t(zipccl::ElemBytes(uint8_t(dtype)));
          if (x.size() != frames * n * w) throw nb::value_error("x must hold frames * n elements");
          if (nbytes.size() != frames) throw nb::value_error("nbytes must hold one entry per frame");
          if (frames && out.size() % frames) throw nb::value_error("out must hold frames * cap bytes");
          const uint64_t cap = frames ? out.size() / frames : 0;
          const uint8_t* sk = SkipFlags(skip, frames);
          nb::gil_scoped_release release;
          Encode(x.data(), frames, n, dtype, checksum, out.data(), cap, nbytes.data(), sk, true,
                 seed);
        },
        nb::arg("x"), nb::arg("frames"), nb::arg("n_elems"), nb::arg("dtype_code"),
        nb::arg("checksum"), nb::arg("out"), nb::arg("nbytes"), nb::arg("seed") = 0,
        nb::arg("skip").none() = nb::none(),
        "Runs the CUDA encoder's kernels in the emulator: x (frames*n elements, as bytes) "
        "-> out (frames*cap bytes), nbytes (int64 per frame). skip: optional uint8 flag per "
        "frame (non-zero: not coded, zero row, size 0).");
  m.def("emulate_decode",
        [](Bytes payload, uint64_t frames, int dtype, uint64_t n, BytesOut out, I32Out status,
           uint64_t seed, std::optional<Bytes> skip) {
          CheckDType(dtype);
          const uint64_t w = uint64_t(zipccl::ElemBytes(uint8_t(dtype)));
          if (out.size() != frames * n * w) throw nb::value_error("out must hold frames * n elements");
          if (status.size() != frames) throw nb::value_error("status must hold one entry per frame");
          if (frames && payload.size() % frames) throw nb::value_error("payload must hold frames * cap bytes");
          const uint64_t cap = frames ? payload.size() / frames : 0;
          const uint8_t* sk = SkipFlags(skip, frames);
          nb::gil_scoped_release release;
          Decode(payload.data(), frames, cap, dtype, n, out.data(), status.data(), sk, true, seed);
        },
        nb::arg("payload"), nb::arg("frames"), nb::arg("dtype_code"), nb::arg("n_elems"),
        nb::arg("out"), nb::arg("status"), nb::arg("seed") = 0,
        nb::arg("skip").none() = nb::none(),
        "Runs the CUDA decoder's kernels in the emulator; status gets 0 or a Status code per "
        "frame. skip: optional uint8 flag per frame (non-zero: not read, zero output, status 0).");
  m.def("constants", []() {
    nb::dict d;
    d["THREADS"] = kThreads;
    d["ITEM_THREADS"] = kItemThreads;
    d["ELEMS_PER_THREAD"] = kElemsPerThread;
    d["ROUND_SYMS"] = kRoundSyms;
    d["BIT_STAGE_WORDS"] = kBitStageWords;
    d["RAW_STAGE_WORDS"] = kRawStageWords;
    d["SCRATCH_ALIGN"] = kScratchAlign;
    d["BLOCK_STATS_BYTES"] = sizeof(BlockStats);
    d["BLOCK_PLAN_BYTES"] = sizeof(zipccl::BlockPlan);
    return d;
  });
  m.def("error_key",
        [](int64_t block, int status) {
          return block < 0 ? (unsigned long long)status : BlockErrorKey(uint64_t(block), status);
        },
        nb::arg("block"), nb::arg("status"),
        "The error key the decoder minimises: frame errors (block -1) first, then the first block.");
  m.def("status_message", [](int status) { return std::string(zipccl::StatusMessage(status)); },
        nb::arg("status"), "The message of a Status code (as the CPU decoder words it).");
#if defined(ZIPCCL_WITH_CUDA)
  m.def("scan_temp_bytes",
        [](uint64_t n_items) {
          uint64_t bytes = 0;
          int err = ScanTempBytes(n_items, &bytes);
          if (err) throw std::runtime_error(std::string("cub scan size query: ") + ErrorString(err));
          return bytes;
        },
        nb::arg("n_items"), "CUB temporary bytes of the frame-offset scan (needs a CUDA device).");
#endif
}
