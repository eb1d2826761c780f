"""nvcc compile targets for the CUDA sources (sm_80 and sm_90), tagged "manual" and "cuda".

`bazel test //...` skips them (manual); .ci/bazel_test.sh adds every target tagged "cuda" when nvcc is on PATH.
"""

load("@local_config_zipccl//:defs.bzl", "NVCC")

CUDA_ARCHS = ["80", "90"]

def cuda_objects(name, srcs, hdrs = [], system_includes = [], tags = []):
    """One `nvcc -c` genrule per .cu source, plus a filegroup `name` of the objects.

    Args:
      name: name of the filegroup holding every object file.
      srcs: .cu files; with none, nothing is defined (the CUDA sources may not exist yet).
      hdrs: headers the sources include (files or filegroups).
      system_includes: exec-root-relative directories passed with -isystem.
      tags: extra tags; "manual" and "cuda" are always added.
    """
    if not srcs:
        return
    tags = tags + ["manual", "cuda"]
    gencode = " ".join([
        "-gencode=arch=compute_{a},code=sm_{a}".format(a = a)
        for a in CUDA_ARCHS
    ])
    isystem = " ".join(["-isystem " + d for d in system_includes])
    objects = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".o"
        if NVCC:
            cmd = ("{nvcc} -c -std=c++17 -O2 {gencode} -Xcompiler=-fPIC,-fvisibility=hidden " +
                   "-I. {isystem} $(location {src}) -o $@").format(
                nvcc = NVCC,
                gencode = gencode,
                isystem = isystem,
                src = src,
            )
        else:
            cmd = "echo 'nvcc was not on PATH when @local_config_zipccl was configured' >&2; exit 1"
        native.genrule(
            name = name + "_" + src[:-len(".cu")].replace("/", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = cmd,
            message = "nvcc (sm_%s) %s" % (",".join(CUDA_ARCHS), src),
            tags = tags,
        )
        objects.append(obj)
    native.filegroup(
        name = name,
        srcs = objects,
        tags = tags,
    )
