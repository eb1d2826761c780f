# Chooses how the CUDA kernels are built so that they match the JAX that runs them (issue 15, defect 2).
#
# The kernels (xla_ffi/codec/kernels.cu) are compiled by NVRTC, NVIDIA's runtime-compilation library, at build
# time (cmake/nvrtc_build.py, ctypes on libnvrtc.so.N): a CUBIN per architecture of ZIPCCL_CUDA_ARCH_LIST and
# PTX of the first, embedded in the extension. The host side launches them through the CUDA driver API
# (libcuda.so.1, dlopen at first use), so no CUDA runtime is linked and no nvcc, CUDA header or toolkit is
# needed: PyPI's nvidia-cuda-nvrtc-cu12 / nvidia-cuda-nvrtc wheels are enough.
#
# With a JAX CUDA plugin installed (jax-cuda12-plugin, jax-cuda13-plugin), NVRTC of the plugin's CUDA major is
# required: the CUBINs of CUDA N need a driver for CUDA N, which the plugin needs anyway; without it the
# extension is built without kernels, with a warning saying why. Without a plugin: the newest NVRTC found.
# cmake/jax_cuda.py makes the choice (and lists where it looked).
#
# Sets ZIPCCL_WITH_CUDA, ZIPCCL_NVRTC (the library), ZIPCCL_CUDA_TOOLKIT ("12.9", NVRTC's CUDA version),
# ZIPCCL_CUDA_VERSION (12090), ZIPCCL_CUDA_ARCH_LIST, ZIPCCL_CUDA_ARCHS ("80,90"), ZIPCCL_CUDA_MIN_DRIVER,
# ZIPCCL_JAX_CUDA_PLUGIN ("name version" or ""), ZIPCCL_CUDA_NOTE (why the kernels are or are not built).
# Needs Python_EXECUTABLE.

set(ZIPCCL_WITH_CUDA OFF)
set(ZIPCCL_JAX_CUDA_PLUGIN "")
set(ZIPCCL_CUDA_NOTE "")
set(ZIPCCL_NVRTC "")
# The architectures shipped as CUBINs; PTX of the first one covers every later GPU (JIT by the driver).
set(ZIPCCL_CUDA_ARCH_LIST 80 90)

if(NOT ("$ENV{ZIPCCL_DISABLE_CUDA}" STREQUAL "" OR "$ENV{ZIPCCL_DISABLE_CUDA}" STREQUAL "0"))
  set(ZIPCCL_CUDA_NOTE "ZIPCCL_DISABLE_CUDA is set")
  message(STATUS "zipccl: CUDA kernels OFF (${ZIPCCL_CUDA_NOTE})")
  return()
endif()

# The build environment's sys.path (pip's build isolation: where the build requirement nvidia-cuda-nvrtc is).
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import os, sys; print(os.pathsep.join(sys.path))"
  OUTPUT_VARIABLE _build_sys_path OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -I "${CMAKE_CURRENT_LIST_DIR}/jax_cuda.py" "${_build_sys_path}"
  OUTPUT_VARIABLE _probe OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "zipccl: cmake/jax_cuda.py failed")
endif()
foreach(_key PLUGIN NVRTC NVRTC_VERSION NOTE)
  set(_probe_${_key} "")
  if(_probe MATCHES "(^|\n)${_key}=([^\n]*)")
    set(_probe_${_key} "${CMAKE_MATCH_2}")
  endif()
endforeach()
if(_probe_PLUGIN)
  string(REPLACE "|" ";" _plugin "${_probe_PLUGIN}")
  list(GET _plugin 1 _plugin_name)
  list(GET _plugin 2 _plugin_version)
  set(ZIPCCL_JAX_CUDA_PLUGIN "${_plugin_name} ${_plugin_version}")
endif()
set(ZIPCCL_CUDA_NOTE "${_probe_NOTE}")

if(ZIPCCL_CUDA_SELECT_ONLY)  # tests: the choice alone
  set(ZIPCCL_NVRTC "${_probe_NVRTC}")
  return()
endif()
if(NOT _probe_NVRTC)
  if(ZIPCCL_JAX_CUDA_PLUGIN)
    message(WARNING "zipccl: CUDA kernels OFF: ${ZIPCCL_CUDA_NOTE}")
  else()
    message(STATUS "zipccl: CUDA kernels OFF (${ZIPCCL_CUDA_NOTE})")
  endif()
  return()
endif()

set(ZIPCCL_NVRTC "${_probe_NVRTC}")
set(ZIPCCL_CUDA_TOOLKIT "${_probe_NVRTC_VERSION}")
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _v "${ZIPCCL_CUDA_TOOLKIT}")
set(_cuda_major "${CMAKE_MATCH_1}")
math(EXPR ZIPCCL_CUDA_VERSION "1000 * ${CMAKE_MATCH_1} + 10 * ${CMAKE_MATCH_2}")
string(REPLACE ";" "," ZIPCCL_CUDA_ARCHS "${ZIPCCL_CUDA_ARCH_LIST}")
# The oldest Linux driver that runs the CUBINs: the first driver of NVRTC's CUDA major (minor-version
# compatibility: CUBINs of any CUDA 12.x run on a CUDA 12.0 driver; the driver API used, cuLibrary*, is CUDA
# 12.0's as well). Archs without a CUBIN JIT the PTX, which needs a driver of NVRTC's own CUDA version.
set(_min_driver_12 "525.60.13")
set(_min_driver_13 "580.65.06")
set(ZIPCCL_CUDA_MIN_DRIVER "${_min_driver_${_cuda_major}}")
if(NOT ZIPCCL_CUDA_MIN_DRIVER)
  message(FATAL_ERROR "zipccl: NVRTC ${ZIPCCL_CUDA_TOOLKIT} at ${ZIPCCL_NVRTC}: CUDA 12 or 13 is needed")
endif()
set(ZIPCCL_WITH_CUDA ON)
message(STATUS "zipccl: CUDA kernels ON (NVRTC ${ZIPCCL_CUDA_TOOLKIT} at ${ZIPCCL_NVRTC}, "
               "sm_${ZIPCCL_CUDA_ARCHS} + PTX; ${ZIPCCL_CUDA_NOTE})")
