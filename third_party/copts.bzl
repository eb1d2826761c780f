"""Compiler flags shared by the project's C++ targets (nanobind needs C++17)."""

ZIPCCL_COPTS = [
    "-std=c++17",
    "-O2",
    "-fvisibility=hidden",
    "-Wall",
]

# AddressSanitizer + UndefinedBehaviorSanitizer, any finding fatal: for the *_sanitized C++ tests, which check
# that the decoder never reads or writes outside its buffers on malformed input.
SANITIZE_FLAGS = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]
