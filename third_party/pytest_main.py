"""Entry point of the py_test targets: runs pytest on the files given as arguments.

It checks that `zipccl_jax` and its extension `zipccl_jax._zipccl` come from this test's runfiles tree (the
Bazel-built .so), not from a pip install in the venv, and fails the test if not.
"""
import importlib.util
import os
import sys

sys.dont_write_bytecode = True  # runfiles are symlinks into the source tree


def _runfiles_dir():
    for var in ("TEST_SRCDIR", "RUNFILES_DIR", "PYTHON_RUNFILES"):
        if os.environ.get(var):
            return os.path.abspath(os.environ[var])
    sys.exit("pytest_main: no TEST_SRCDIR/RUNFILES_DIR; run it with `bazel test` or `bazel run`")


def _check_origin(name, path, runfiles):
    path = os.path.abspath(path or "")
    if not path.startswith(runfiles + os.sep):
        sys.exit(f"pytest_main: {name} was loaded from {path}, not from the Bazel runfiles tree {runfiles}")
    print(f"pytest_main: {name} from {path}")


def main():
    runfiles = _runfiles_dir()
    # Before the tests run, without executing the package: where `import zipccl_jax` will resolve.
    spec = importlib.util.find_spec("zipccl_jax")
    if spec is None:
        sys.exit("pytest_main: zipccl_jax is not importable")
    _check_origin("zipccl_jax", spec.origin, runfiles)

    import pytest

    args = ["-p", "no:cacheprovider", "-q", "-ra"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
    rc = pytest.main(args + sys.argv[1:])

    # After: the modules the tests actually used.
    import zipccl_jax
    import zipccl_jax._zipccl

    _check_origin("zipccl_jax", zipccl_jax.__file__, runfiles)
    _check_origin("zipccl_jax._zipccl", zipccl_jax._zipccl.__file__, runfiles)
    sys.exit(int(rc))


if __name__ == "__main__":
    main()
