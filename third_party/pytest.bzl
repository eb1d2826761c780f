"""py_test that runs pytest (through //third_party:pytest_main.py) against the Bazel-built zipccl_jax."""

def pytest_test(name, srcs, deps = [], data = [], args = [], **kwargs):
    """One py_test running pytest on `srcs`.

    Args:
      name: target name.
      srcs: the test_*.py files pytest collects.
      deps: py_library deps; //:zipccl_jax (the package plus the Bazel-built _zipccl.so) is always added.
      data: support files (conftest.py, helpers, data, example sources...).
      args: extra pytest arguments, after the test files.
      **kwargs: size, timeout, tags, env...
    """
    native.py_test(
        name = name,
        srcs = ["//third_party:pytest_main.py"] + srcs,
        main = "//third_party:pytest_main.py",
        args = ["$(rootpath %s)" % src for src in srcs] + args,
        data = data,
        deps = depset(deps + ["//:zipccl_jax"]).to_list(),
        # No generated __init__.py files: a runfiles-root zipccl_jax/__init__.py must not shadow the package.
        legacy_create_init = False,
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )
