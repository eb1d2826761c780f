"""Repository rule that discovers the local toolchain pieces the build needs.

It finds, on this machine and without any download:
  * the Python interpreter: $PYTHON_BIN_PATH, else the active venv ($VIRTUAL_ENV), else <workspace>/.venv, else
    `python3` on PATH;
  * that interpreter's C headers (sysconfig "include");
  * jaxlib's XLA FFI headers (jax.ffi.include_dir()) and that jaxlib's version;
  * nanobind's pip-shipped sources, headers and robin_map (nanobind.source_dir(), nanobind.include_dir()).
No CUDA: the Bazel extension is CPU-only (CMake builds the kernels with NVRTC), and the CUDA handlers that
//tests/cc:ffi_contract_test builds need no toolkit (they reach the driver through codec/cuda_driver.h).

The generated repository (@local_config_zipccl) provides:
  //:py_toolchain        a Python toolchain whose interpreter and stub shebang are that python;
  //:python_headers      Python.h and friends (system include);
  //:xla_ffi_headers     xla/ffi/api/*.h (system include: api.h warns with -Wreturn-type), and the bare
                         files as //:xla_ffi_header_files (exec-root path external/local_config_zipccl/xla_ffi_include);
  //:nanobind            nanobind compiled from its sources (nb_combined.cpp);
  //:defs.bzl            PYTHON_BIN, JAXLIB_VERSION.
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
import jaxlib
print(jaxlib.__version__)
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
    if len(lines) < 8:
        fail("local_config_zipccl: unexpected probe output:\n" + result.stdout)
    python_version, python_include, ffi_include, nb_src, nb_include, nb_version, jax_version, jaxlib_version = lines[-8:]

    rctx.symlink(python_include, "python_include")
    rctx.symlink(ffi_include, "xla_ffi_include")
    nb_root = rctx.path(nb_src).dirname
    if nb_root != rctx.path(nb_include).dirname:
        fail("local_config_zipccl: nanobind src ({}) and include ({}) are not siblings".format(nb_src, nb_include))
    rctx.symlink(nb_root, "nanobind")

    rctx.file("BUILD.bazel", _BUILD.format(
        python = python,
        python_version = python_version,
        jax_version = jax_version,
        nanobind_version = nb_version,
    ))
    rctx.file("defs.bzl", "\n".join([
        '"""Generated by //third_party:local_config.bzl."""',
        "",
        "# python from " + source,
        "PYTHON_BIN = %r" % python,
        "# the jaxlib whose XLA FFI headers //:xla_ffi_headers are (build_info()'s \"jaxlib\")",
        "JAXLIB_VERSION = %r" % jaxlib_version,
        "",
    ]))

local_config_zipccl = repository_rule(
    implementation = _local_config_zipccl_impl,
    environ = ["PYTHON_BIN_PATH", "VIRTUAL_ENV", "PATH"],
    local = True,
)
