// Minimal test harness for the codec's C++ unit tests (no gtest: the build is offline and dependency-free).
//   TEST(name) { CHECK(cond) << "context"; CHECK_EQ(a, b); }
// main() (from ZIPCCL_TEST_MAIN) runs every TEST and exits non-zero if any CHECK failed.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
// LeakSanitizer needs ptrace, which containers often forbid; the tests only look for bad memory accesses.
extern "C" const char* __asan_default_options() { return "detect_leaks=0:abort_on_error=0"; }
#endif

namespace zipccl_test {

struct Registry {
  std::vector<std::pair<const char*, void (*)()>> tests;
  int failures = 0;
  static Registry& Get() {
    static Registry r;
    return r;
  }
};

struct Register {
  Register(const char* name, void (*fn)()) { Registry::Get().tests.emplace_back(name, fn); }
};

// Collects the streamed context of a failed CHECK and reports it when destroyed.
class Failure {
 public:
  Failure(const char* file, int line, const std::string& what) {
    os_ << file << ":" << line << ": CHECK failed: " << what;
  }
  ~Failure() {
    std::fprintf(stderr, "%s\n", os_.str().c_str());
    ++Registry::Get().failures;
  }
  template <typename T>
  Failure& operator<<(const T& v) {
    os_ << (first_ ? " -- " : "") << v;
    first_ = false;
    return *this;
  }

 private:
  std::ostringstream os_;
  bool first_ = true;
};

template <typename A, typename B>
std::string Describe(const char* a_expr, const char* b_expr, const A& a, const B& b) {
  std::ostringstream os;
  os << a_expr << " == " << b_expr << " (" << +a << " vs " << +b << ")";
  return os.str();
}

inline int RunAll() {
  Registry& r = Registry::Get();
  for (auto& [name, fn] : r.tests) {
    int before = r.failures;
    fn();
    std::printf("[%s] %s\n", r.failures == before ? "PASS" : "FAIL", name);
  }
  std::printf("%zu tests, %d failed checks\n", r.tests.size(), r.failures);
  return r.failures == 0 ? 0 : 1;
}

}  // namespace zipccl_test

#define TEST(name)                                                          \
  static void name();                                                       \
  static ::zipccl_test::Register name##_registration(#name, &name);         \
  static void name()

// `if (ok) {} else Failure(...) << ...` lets callers stream context after the macro. Put braces around a
// CHECK that is the body of an if (-Wdangling-else).
#define CHECK(cond) \
  if (cond) {       \
  } else            \
    ::zipccl_test::Failure(__FILE__, __LINE__, #cond)

#define CHECK_EQ(a, b) \
  if ((a) == (b)) {    \
  } else               \
    ::zipccl_test::Failure(__FILE__, __LINE__, ::zipccl_test::Describe(#a, #b, (a), (b)))

#define ZIPCCL_TEST_MAIN \
  int main() { return ::zipccl_test::RunAll(); }
