"""Train a small MoE Transformer with expert-parallel compressed all_to_all and FSDP compressed
all_gather / psum_scatter, on byte-level Python standard library sources.

    python examples/moe_flax/train.py --steps 3 --json /tmp/moe.json
    python examples/moe_flax/train.py --steps 3 --json /tmp/moe_raw.json --no-compress   # bit-identical losses
    python examples/moe_flax/train.py --steps 3 --spawn 2                                 # 2 processes x 4 devices

Mesh ('data', 'expert'): tokens are sharded over both axes; experts over 'expert'; every parameter is
additionally FSDP-sharded: dense parameters over both axes, expert parameters over 'data'.
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
    plan = (
        trainer.BucketPlan("expert", lambda k: k[-1] in ("w_in", "w_out"), shard_axes=("data",),
                           group_axis="expert"),
        trainer.BucketPlan("dense", lambda k: True, shard_axes=("data", "expert")),
    )
    trainer.run(args, name="moe_flax", plan=plan, expert_axis="expert", axis_names=("data", "expert"))


def main(argv=None) -> int:
    return launch.example_main(argv, __doc__, _run, mesh="2x4", layers=2, experts=8)


if __name__ == "__main__":
    sys.exit(main())
