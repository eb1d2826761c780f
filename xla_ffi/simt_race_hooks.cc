// The runtime of the emulator's instrumented builds, linked in place of
// ThreadSanitizer's: sources compiled with -fsanitize=thread (GCC or Clang)
// call __tsan_read4(p), __tsan_write8(p), __tsan_atomic32_fetch_or(p, v, mo),
// ... before every memory access. Here each of them
//   - reports the access to the SIMT emulator (EmuOnAccess of simt_emulator.h:
//     shared-memory race detection, random seeded yields between fibers),
//   - forwards every access to AddressSanitizer's checks (__asan_load4,
//     __asan_storeN, ...) when the binary is built with ASan, so the instrumented
//     sources, which cannot also carry ASan's own instrumentation, keep their
//     heap and global out-of-bounds checks,
//   - performs the atomics (on the host, one fiber runs at a time).
// Only the sanitized test binaries link this file (tests/test_ffi_contract.py,
// tests/test_emulator_sanitized.py); never the Python extension.
#include <cstddef>
#include <cstdint>

#include "simt_emulator.h"

extern "C" {
// ASan's checks, weak: present only in an ASan build. The sized ones read one shadow entry; the N ones
// scan the region's shadow (__asan_region_is_poisoned), ~a third of a sanitized emulator run when every
// access took them.
void __asan_loadN(uintptr_t addr, size_t size) __attribute__((weak));
void __asan_storeN(uintptr_t addr, size_t size) __attribute__((weak));
#define ZIPCCL_ASAN_SIZED(N)                                 \
  void __asan_load##N(uintptr_t addr) __attribute__((weak)); \
  void __asan_store##N(uintptr_t addr) __attribute__((weak));
ZIPCCL_ASAN_SIZED(1)
ZIPCCL_ASAN_SIZED(2)
ZIPCCL_ASAN_SIZED(4)
ZIPCCL_ASAN_SIZED(8)
ZIPCCL_ASAN_SIZED(16)
#undef ZIPCCL_ASAN_SIZED
}

namespace {

using zipccl::cuda::emu::Access;
using zipccl::cuda::emu::EmuOnAccess;

// ASan's check of an access of n bytes at addr, as ASan's own instrumentation would make it: the sized
// check when n is 1, 2, 4, 8 or 16 and addr a multiple of n (the access lies in one 8-byte shadow granule,
// or in two whole ones for 16), the region check otherwise.
void AsanCheck(uintptr_t addr, size_t n, bool write) {
  if (!__asan_loadN) return;  // not an ASan build
  if (n != 0 && (addr & (n - 1)) == 0) {
    switch (n) {
      case 1: return write ? __asan_store1(addr) : __asan_load1(addr);
      case 2: return write ? __asan_store2(addr) : __asan_load2(addr);
      case 4: return write ? __asan_store4(addr) : __asan_load4(addr);
      case 8: return write ? __asan_store8(addr) : __asan_load8(addr);
      case 16: return write ? __asan_store16(addr) : __asan_load16(addr);
      default: break;
    }
  }
  write ? __asan_storeN(addr, n) : __asan_loadN(addr, n);
}

void Plain(const volatile void* p, size_t n, Access a) {
  const void* q = const_cast<const void*>(p);
  AsanCheck(reinterpret_cast<uintptr_t>(q), n, a != Access::kRead);
  EmuOnAccess(q, n, a);
}

template <typename T>
void Atomic(const volatile T* p) {
  AsanCheck(reinterpret_cast<uintptr_t>(const_cast<const T*>(p)), sizeof(T), true);
  EmuOnAccess(const_cast<const T*>(p), sizeof(T), Access::kAtomic);
}

// memory_order as TSan's interface passes it; the host operation is seq_cst
// (one fiber runs at a time, so the order cannot be observed).
using morder = int;

}  // namespace

extern "C" {

void __tsan_init() { zipccl::cuda::emu::EmuInstrumented() = true; }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read_range(void* p, size_t n) { Plain(p, n, Access::kRead); }
void __tsan_write_range(void* p, size_t n) { Plain(p, n, Access::kWrite); }

#define ZIPCCL_PLAIN(N)                                                          \
  void __tsan_read##N(void* p) { Plain(p, N, Access::kRead); }                   \
  void __tsan_write##N(void* p) { Plain(p, N, Access::kWrite); }                 \
  void __tsan_unaligned_read##N(void* p) { Plain(p, N, Access::kRead); }         \
  void __tsan_unaligned_write##N(void* p) { Plain(p, N, Access::kWrite); }       \
  void __tsan_volatile_read##N(void* p) { Plain(p, N, Access::kRead); }          \
  void __tsan_volatile_write##N(void* p) { Plain(p, N, Access::kWrite); }
ZIPCCL_PLAIN(1)
ZIPCCL_PLAIN(2)
ZIPCCL_PLAIN(4)
ZIPCCL_PLAIN(8)
ZIPCCL_PLAIN(16)
#undef ZIPCCL_PLAIN

#define ZIPCCL_RMW(N, T, OP, BUILTIN)                                                  \
  T __tsan_atomic##N##_##OP(volatile T* p, T v, morder) {                              \
    Atomic(p);                                                                         \
    return BUILTIN(p, v, __ATOMIC_SEQ_CST);                                            \
  }
#define ZIPCCL_ATOMICS(N, T)                                                                     \
  T __tsan_atomic##N##_load(const volatile T* p, morder) {                                       \
    Atomic(p);                                                                                   \
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                 \
  }                                                                                              \
  void __tsan_atomic##N##_store(volatile T* p, T v, morder) {                                    \
    Atomic(p);                                                                                   \
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);                                                    \
  }                                                                                              \
  ZIPCCL_RMW(N, T, exchange, __atomic_exchange_n)                                                \
  ZIPCCL_RMW(N, T, fetch_add, __atomic_fetch_add)                                                \
  ZIPCCL_RMW(N, T, fetch_sub, __atomic_fetch_sub)                                                \
  ZIPCCL_RMW(N, T, fetch_and, __atomic_fetch_and)                                                \
  ZIPCCL_RMW(N, T, fetch_or, __atomic_fetch_or)                                                  \
  ZIPCCL_RMW(N, T, fetch_xor, __atomic_fetch_xor)                                                \
  ZIPCCL_RMW(N, T, fetch_nand, __atomic_fetch_nand)                                              \
  int __tsan_atomic##N##_compare_exchange_strong(volatile T* p, T* expected, T v, morder, morder) { \
    Atomic(p);                                                                                   \
    return __atomic_compare_exchange_n(p, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
  }                                                                                              \
  int __tsan_atomic##N##_compare_exchange_weak(volatile T* p, T* expected, T v, morder, morder) { \
    Atomic(p);                                                                                   \
    return __atomic_compare_exchange_n(p, expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
  }                                                                                              \
  T __tsan_atomic##N##_compare_exchange_val(volatile T* p, T expected, T v, morder, morder) {    \
    Atomic(p);                                                                                   \
    __atomic_compare_exchange_n(p, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);     \
    return expected;                                                                             \
  }
ZIPCCL_ATOMICS(8, uint8_t)
ZIPCCL_ATOMICS(16, uint16_t)
ZIPCCL_ATOMICS(32, uint32_t)
ZIPCCL_ATOMICS(64, uint64_t)
#undef ZIPCCL_ATOMICS
#undef ZIPCCL_RMW

void __tsan_atomic_thread_fence(morder) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(morder) {}

}  // extern "C"
