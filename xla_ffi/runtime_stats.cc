// zipccl_count: the CPU FFI handler of the runtime statistics (runtime_stats.h).
#include "runtime_stats.h"

#include <mutex>

#include "handlers.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace zipccl::runtime_stats {
namespace {

std::mutex& Mutex() {
  static std::mutex m;
  return m;
}

std::map<int64_t, Counts>& Table() {
  static auto* t = new std::map<int64_t, Counts>();  // never destroyed: handlers may run at exit
  return *t;
}

}  // namespace

void Add(int64_t site, bool fallback) {
  std::lock_guard<std::mutex> lock(Mutex());
  Counts& c = Table()[site];
  c.calls += 1;
  c.fallbacks += fallback ? 1 : 0;
}

std::map<int64_t, Counts> Snapshot() {
  std::lock_guard<std::mutex> lock(Mutex());
  return Table();
}

void Reset() {
  std::lock_guard<std::mutex> lock(Mutex());
  Table().clear();
}

}  // namespace zipccl::runtime_stats

namespace {

// One execution of call site `site`; `fallback` holds one flag, or one per
// vmapped example (then the execution counts once, as a fallback if any fell back).
ffi::Error CountImpl(ffi::Buffer<ffi::PRED> fallback, int64_t site) {
  const bool* f = fallback.typed_data();
  bool any = false;
  for (size_t i = 0, n = fallback.element_count(); i < n; ++i) any |= f[i];
  zipccl::runtime_stats::Add(site, any);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ZipcclCountCpu, CountImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // fallback
                                  .Attr<int64_t>("site"));
