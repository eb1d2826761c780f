"""Repository rule that discovers the local toolchain pieces the build needs.

It finds, on this machine and without any download:
  * the Python interpreter: $PYTHON_BIN_PATH, else the active venv ($VIRTUAL_ENV), else <workspace>/.venv, else
    `python3` on PATH;
  * that interpreter's C headers (sysconfig "include");
  * jaxlib's XLA FFI headers (jax.ffi.include_dir());
  * nanobind's pip-shipped sources, headers and robin_map (nanobind.source_dir(), nanobind.include_dir());
  * nvcc on PATH and its toolkit's libcudart_static.a (optional, as in CMakeLists.txt: CUDA is built whenever
    nvcc is found, unless ZIPCCL_DISABLE_CUDA is set to anything but "" or "0").

The generated repository (@local_config_zipccl) provides:
  //:py_toolchain        a Python toolchain whose interpreter and stub shebang are that python;
  //:python_headers      Python.h and friends (system include);
  //:xla_ffi_headers     xla/ffi/api/*.h (system include: api.h warns with -Wreturn-type), and the bare
                         files as //:xla_ffi_header_files (exec-root path external/local_config_zipccl/xla_ffi_include);
  //:nanobind            nanobind compiled from its sources (nb_combined.cpp);
  //:cudart_static       the CUDA runtime, static (an empty library when CUDA is off);
  //:defs.bzl            PYTHON_BIN, NVCC (absolute path, "" when CUDA is off), CUDA_ENABLED.
"""

_PROBE = """
import sys, sysconfig
import jax, nanobind
print("%d.%d" % sys.version_info[:2])
print(sysconfig.get_paths()["include"])
print(jax.ffi.include_dir())
print(nanobind.source_dir())
print(nanobind.include_dir())
print(nanobind.__version__)
print(jax.__version__)
"""

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

# Python {python_version} at {python}
py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "py_runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "py_toolchain",
    toolchain = ":py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

cc_library(
    name = "python_headers",
    hdrs = glob(["python_include/**/*.h"]),
    includes = ["python_include"],
)

# jax {jax_version}
filegroup(
    name = "xla_ffi_header_files",
    srcs = glob(["xla_ffi_include/xla/ffi/api/*.h"]),
)

cc_library(
    name = "xla_ffi_headers",
    hdrs = [":xla_ffi_header_files"],
    includes = ["xla_ffi_include"],
)

# nanobind {nanobind_version}, built from its pip-shipped sources as one translation unit, the way
# nanobind/src/nb_combined.cpp documents for build systems other than CMake.
cc_library(
    name = "nanobind",
    srcs = ["nanobind/src/nb_combined.cpp"],
    hdrs = glob([
        "nanobind/include/**/*.h",
        "nanobind/ext/robin_map/include/**/*.h",
    ]),
    textual_hdrs = glob(
        [
            "nanobind/src/*.cpp",
            "nanobind/src/*.h",
        ],
        exclude = ["nanobind/src/nb_combined.cpp"],
    ),
    copts = [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-fvisibility=hidden",
        "-fno-strict-aliasing",
        "-ffunction-sections",
        "-fdata-sections",
        "-DNB_BUILD",
        "-DNDEBUG",
    ],
    defines = ["NB_COMPACT_ASSERTIONS"],
    includes = [
        "nanobind/ext/robin_map/include",
        "nanobind/include",
    ],
    linkstatic = True,
    deps = [":python_headers"],
)

# {cuda_note}
cc_library(
    name = "cudart_static",
    srcs = {cudart_srcs},
    linkopts = {cudart_linkopts},
)
"""

def _which_python(rctx):
    """Returns the python path to use and a note on where it came from."""
    env = rctx.os.environ
    if env.get("PYTHON_BIN_PATH"):
        python = env["PYTHON_BIN_PATH"]
        if "/" not in python:
            python = rctx.which(python)
        if not python or not str(python).startswith("/"):
            fail("local_config_zipccl: PYTHON_BIN_PATH must be an absolute path or a command on PATH, got " +
                 env["PYTHON_BIN_PATH"])
        return str(python), "$PYTHON_BIN_PATH"
    if env.get("VIRTUAL_ENV"):
        venv_python = rctx.path(env["VIRTUAL_ENV"] + "/bin/python")
        if venv_python.exists:
            return str(venv_python), "$VIRTUAL_ENV"
    workspace = rctx.path(Label("//third_party:local_config.bzl")).dirname.dirname
    workspace_venv = workspace.get_child(".venv").get_child("bin").get_child("python")
    if workspace_venv.exists:
        return str(workspace_venv), "<workspace>/.venv"
    python3 = rctx.which("python3")
    if python3:
        return str(python3), "PATH"
    fail("local_config_zipccl: no python found; set PYTHON_BIN_PATH or activate the venv")

def _local_config_zipccl_impl(rctx):
    python, source = _which_python(rctx)
    result = rctx.execute([python, "-c", _PROBE], environment = {"JAX_PLATFORMS": "cpu"})
    if result.return_code != 0:
        fail("local_config_zipccl: `{} -c <probe>` (python from {}) failed; it needs jax and nanobind:\n{}".format(
            python,
            source,
            result.stderr,
        ))
    lines = result.stdout.strip().splitlines()
    if len(lines) < 7:
        fail("local_config_zipccl: unexpected probe output:\n" + result.stdout)
    python_version, python_include, ffi_include, nb_src, nb_include, nb_version, jax_version = lines[-7:]

    rctx.symlink(python_include, "python_include")
    rctx.symlink(ffi_include, "xla_ffi_include")
    nb_root = rctx.path(nb_src).dirname
    if nb_root != rctx.path(nb_include).dirname:
        fail("local_config_zipccl: nanobind src ({}) and include ({}) are not siblings".format(nb_src, nb_include))
    rctx.symlink(nb_root, "nanobind")

    nvcc, cuda_note = _find_cuda(rctx)
    cuda_version = _nvcc_version(rctx, nvcc) if nvcc else ""
    rctx.file("BUILD.bazel", _BUILD.format(
        python = python,
        python_version = python_version,
        jax_version = jax_version,
        nanobind_version = nb_version,
        cuda_note = cuda_note,
        cudart_srcs = ["cuda/libcudart_static.a"] if nvcc else [],
        cudart_linkopts = ["-ldl", "-lrt", "-lpthread"] if nvcc else [],
    ))
    rctx.file("defs.bzl", "\n".join([
        '"""Generated by //third_party:local_config.bzl."""',
        "",
        "# python from " + source,
        "PYTHON_BIN = %r" % python,
        "# " + cuda_note,
        "NVCC = %r" % nvcc,
        "CUDA_ENABLED = %r" % bool(nvcc),
        "# nvcc's release (major.minor) and the oldest Linux driver of that major (minor-version compatibility)",
        "CUDA_VERSION = %r" % cuda_version,
        "CUDA_MIN_DRIVER = %r" % _MIN_DRIVER.get(cuda_version.split(".")[0], ""),
        "",
    ]))

_MIN_DRIVER = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}

def _nvcc_version(rctx, nvcc):
    """"12.9" from `nvcc --version` ("... release 12.9, V12.9.86")."""
    out = rctx.execute([nvcc, "--version"]).stdout
    at = out.find("release ")
    if at < 0:
        fail("local_config_zipccl: cannot read the CUDA version from `%s --version`:\n%s" % (nvcc, out))
    version = out[at + len("release "):].split(",")[0].strip()
    if version.split(".")[0] not in _MIN_DRIVER:
        fail("local_config_zipccl: no known minimum driver for CUDA " + version)
    return version

def _find_cuda(rctx):
    """Returns (absolute nvcc path or "", a note on why), and links libcudart_static.a as cuda/."""
    disable = rctx.os.environ.get("ZIPCCL_DISABLE_CUDA", "")
    if disable not in ("", "0"):
        return "", "CUDA off: ZIPCCL_DISABLE_CUDA=" + disable
    nvcc = rctx.which("nvcc")
    if not nvcc:
        return "", "CUDA off: no nvcc on PATH"

    # nvcc may be a wrapper script: ask it where its toolkit is.
    dryrun = rctx.execute([nvcc, "--dryrun", "-c", "-x", "cu", "/dev/null"])
    top = ""
    for line in (dryrun.stdout + dryrun.stderr).splitlines():
        if line.startswith("#$ TOP="):
            top = line[len("#$ TOP="):].strip()
    candidates = []
    if top:
        candidates += [top + "/lib64/libcudart_static.a", top + "/targets/x86_64-linux/lib/libcudart_static.a"]
    candidates.append(str(nvcc.dirname) + "/../lib64/libcudart_static.a")
    for lib in candidates:
        if rctx.path(lib).exists:
            rctx.symlink(lib, "cuda/libcudart_static.a")
            return str(nvcc), "CUDA on: nvcc %s, cudart %s" % (nvcc, lib)
    fail("local_config_zipccl: nvcc is at {} but libcudart_static.a is not in {}; set ZIPCCL_DISABLE_CUDA=1 to build without CUDA".format(
        nvcc,
        candidates,
    ))

local_config_zipccl = repository_rule(
    implementation = _local_config_zipccl_impl,
    environ = ["PYTHON_BIN_PATH", "VIRTUAL_ENV", "PATH", "ZIPCCL_DISABLE_CUDA"],
    local = True,
)
