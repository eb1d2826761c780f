"""Train a dense Transformer with FSDP (ZeRO-3 style) through compressed all_gather / psum_scatter, on
byte-level Python standard library sources.

    python examples/dense_fsdp/train.py --steps 3 --json /tmp/dense.json
    python examples/dense_fsdp/train.py --steps 3 --json /tmp/dense_raw.json --no-compress   # bit-identical
    python examples/dense_fsdp/train.py --steps 3 --spawn 2                                  # 2 processes

Mesh ('data', 'fsdp') = hybrid sharded data parallelism: parameters are sharded over 'fsdp' (all_gather
before the step, psum_scatter of the gradients) and replicated over 'data' (psum of the gradient shards).
``--mesh 1x8`` is plain FSDP over all devices.  Tokens are sharded over both axes.
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys

if "common" not in sys.modules:  # examples/common, registered by path: sys.path stays as it is
    _init = pathlib.Path(__file__).resolve().parents[1] / "common" / "__init__.py"
    _spec = importlib.util.spec_from_file_location("common", _init, submodule_search_locations=[str(_init.parent)])
    sys.modules["common"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["common"])
from common import launch  # noqa: E402  (no jax import)


def _run(args, trainer) -> None:
    if args.experts:
        raise SystemExit("dense_fsdp trains a dense model; use examples/moe_flax for experts")
    plan = (trainer.BucketPlan("dense", lambda k: True, shard_axes=("fsdp",), psum_axes=("data",)),)
    trainer.run(args, name="dense_fsdp", plan=plan, expert_axis=None, axis_names=("data", "fsdp"))


def main(argv=None) -> int:
    return launch.example_main(argv, __doc__, _run, mesh="2x4", layers=2, experts=0)


if __name__ == "__main__":
    sys.exit(main())
