// Exported XLA FFI handler symbols, one per (operation, platform).
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEncodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeIntoCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclCountCpu);  // runtime_stats.cc

#if defined(ZIPCCL_WITH_CUDA)
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclEncodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ZipcclDecodeIntoCuda);
#endif
