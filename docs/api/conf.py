"""Sphinx configuration of the API reference: built from the docstrings (autodoc, Google-style sections via
napoleon). Build with `pip install '.[docs]' && sphinx-build -W -b html docs/api build/docs` (CI: .ci/run)."""

project = "zipccl_jax"
author = "zipccl_jax authors"
copyright = "zipccl_jax authors, Apache License 2.0"  # noqa: A001 (Sphinx's name)

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
autodoc_typehints = "none"          # the signatures as written; annotations name private types
autodoc_member_order = "bysource"
autodoc_default_options = {"members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
html_theme = "alabaster"
html_static_path: list[str] = []
exclude_patterns = ["_build"]
