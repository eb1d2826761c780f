// Minimal test harness for the codec's C++ unit tests (no gtest: the build is offline and dependency-free).
//   TEST(name) { CHECK(cond) << "context"; CHECK_EQ(a, b); }
// main() (from ZIPCCL_TEST_MAIN) runs every TEST, or those named on its command line, and exits non-zero if any
// CHECK failed (or a name matches no TEST).
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

// Runs every TEST, or only those whose names are in argv[1..] (a test of the tests that seeds one bug runs the
// TESTs that must catch it, not the whole file).
inline int RunAll(int argc = 0, char** argv = nullptr) {
  Registry& r = Registry::Get();
  std::vector<std::string> only(argv ? argv + 1 : argv, argv ? argv + argc : argv);
  size_t ran = 0;
  for (auto& [name, fn] : r.tests) {
    bool named = only.empty();
    for (const std::string& o : only) named = named || o == name;
    if (!named) continue;
    int before = r.failures;
    fn();
    ++ran;
    std::printf("[%s] %s\n", r.failures == before ? "PASS" : "FAIL", name);
  }
  if (ran < (only.empty() ? r.tests.size() : only.size())) {
    std::fprintf(stderr, "a name on the command line matches no TEST\n");
    ++r.failures;
  }
  std::printf("%zu tests, %d failed checks\n", ran, r.failures);
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
  int main(int argc, char** argv) { return ::zipccl_test::RunAll(argc, argv); }
