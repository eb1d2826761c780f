"""`python -m zipccl_jax.info`: prints `zipccl_jax.info()` as JSON, for bug reports.

The dict is built in `_info.py`. This module is only the command line: the package imports `_info`, not this
module, so `python -m` runs it once, as `__main__` (runpy warned when the package had already imported it).
"""

import json

from zipccl_jax._info import info


def main() -> None:
  print(json.dumps(info(), indent=2))


if __name__ == "__main__":
  main()
