"""CUDA sources compiled by nvcc for sm_80 and sm_90, as in CMakeLists.txt.

CUDA is on when @local_config_zipccl found nvcc (and ZIPCCL_DISABLE_CUDA is unset or "0"); otherwise
cuda_library() is an empty library and CUDA_DEFINES is empty, so the extension is CPU-only.
"""

load("@local_config_zipccl//:defs.bzl", "CUDA_ENABLED", "CUDA_MIN_DRIVER", "CUDA_VERSION", "NVCC")

CUDA_ARCHS = ["80", "90"]

# For the host C++ that registers the CUDA handlers (module.cc, handlers.h, cuda_host_bindings.cc).
# They also record the build for zipccl_jax.info() (module.cc's build_info()).
CUDA_DEFINES = [
    "-DZIPCCL_WITH_CUDA",
    '-DZIPCCL_CUDA_TOOLKIT=\\"%s\\"' % CUDA_VERSION,
    '-DZIPCCL_CUDA_ARCHS=\\"%s\\"' % ",".join(CUDA_ARCHS),
    '-DZIPCCL_CUDA_MIN_DRIVER=\\"%s\\"' % CUDA_MIN_DRIVER,
    '-DZIPCCL_CUDA_NOTE=\\"bazel\\"',
] if CUDA_ENABLED else []

_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "-Xptxas=-warn-spills,-Werror",  # a register spill fails the build
    "-Xcompiler=-fPIC,-fvisibility=hidden",
    "-DZIPCCL_CUDA_MIN_DRIVER='\"%s\"'" % CUDA_MIN_DRIVER,
] + [
    # cubin and PTX per architecture, like CMAKE_CUDA_ARCHITECTURES "80;90"
    "--generate-code=arch=compute_{a},code=[compute_{a},sm_{a}]".format(a = a)
    for a in CUDA_ARCHS
]

def cuda_library(name, srcs, hdrs = [], includes = [], system_includes = [], deps = []):
    """A static cc_library of nvcc-compiled objects (one genrule per .cu, tagged "cuda"), plus cudart_static.

    Args:
      name: the cc_library; empty when CUDA is off.
      srcs: .cu files of this package.
      hdrs: headers the sources include (files or filegroups).
      includes: package-relative include directories ("." for the package itself).
      system_includes: exec-root-relative directories passed with -isystem.
      deps: cc deps of the library.
    """
    if not CUDA_ENABLED:
        native.cc_library(name = name)
        return
    pkg = native.package_name()
    flags = " ".join(
        _NVCC_FLAGS +
        ["-I" + (pkg + "/" + d if d != "." else pkg) for d in includes] +
        ["-isystem " + d for d in system_includes],
    )
    objects = []
    for src in srcs:
        stem = src[:-len(".cu")]
        obj = "_cuda_objs/%s/%s.pic.o" % (name, stem)
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem.replace("/", "_")),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = "%s %s -c $(location %s) -o $@" % (NVCC, flags, src),
            message = "nvcc sm_%s %s" % (",sm_".join(CUDA_ARCHS), src),
            tags = ["cuda"],
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        linkstatic = True,
        tags = ["cuda"],
        deps = deps + ["@local_config_zipccl//:cudart_static"],
    )
