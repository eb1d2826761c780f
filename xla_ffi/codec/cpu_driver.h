// CPU driver for the zipccl codec (format version 2): whole frames in host
// memory, one thread.
// Pure C++17; no XLA includes. The per-block rules come from block.h and
// huffman.h, shared with the CUDA kernels, so both paths emit the same bytes.
#pragma once

#include <cstdint>

#include "format.h"

namespace zipccl::cpu {

// Encodes n_elems elements of `dtype` read from x_host into out_host, which
// holds capacity_bytes bytes. Returns the exact frame size in bytes. When that
// exceeds capacity_bytes the frame is not written; only its 32-byte header is,
// if it fits, with frame_bytes set to the size that was needed, so that a
// receiver of the truncated payload sees the overflow.
uint64_t EncodeFrame(const void* x_host, uint64_t n_elems, uint8_t dtype,
                     bool checksum, uint8_t* out_host, uint64_t capacity_bytes);

struct DecodeResult {
  Status status;
  int64_t block;  // index of the offending block, or -1
};

// Decodes the frame at the start of in_host (in_bytes readable bytes) into
// n_elems elements of `dtype` at out_host. Verifies every header field, every
// size, the bitstream and, if present, the checksum; never reads outside
// [in_host, in_host + in_bytes) or writes outside the output.
DecodeResult DecodeFrame(const uint8_t* in_host, uint64_t in_bytes,
                         uint8_t dtype, uint64_t n_elems, void* out_host);

// The instruction-set specific code paths compiled into this driver,
// comma-separated ("avx512_vbmi2", "avx512bw" or "avx2"); "" when only the portable
// loops are.
const char* CompiledCodePaths();
// The instruction-set specific paths run where they are compiled in, unless
// the environment sets ZIPCCL_CPU_PORTABLE (to anything but "" or "0"): then
// the portable loops run, which give the same frames and the same verdicts
// (a test switch, read once per frame).

}  // namespace zipccl::cpu
