"""py_test that runs pytest (through //third_party:pytest_main.py) against the Bazel-built zipccl_jax."""

def pytest_test(name, srcs, data = [], **kwargs):
    """One py_test running pytest on `srcs`, with //:zipccl_jax (the package plus the Bazel-built _zipccl.so).

    Args:
      name: target name.
      srcs: the test_*.py files pytest collects.
      data: support files (conftest.py, helpers, data, example sources...).
      **kwargs: size, tags, ... of py_test.
    """
    native.py_test(
        name = name,
        srcs = ["//third_party:pytest_main.py"] + srcs,
        main = "//third_party:pytest_main.py",
        args = ["$(rootpath %s)" % src for src in srcs],
        data = data,
        deps = ["//:zipccl_jax"],
        # No generated __init__.py files: pytest imports tests/ exactly as in the source tree.
        legacy_create_init = False,
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )
