"""Train a small MoE Transformer with expert-parallel compressed all_to_all and FSDP compressed
all_gather / psum_scatter, on byte-level Python standard library sources.

    python examples/moe_flax/train.py --steps 3 --json /tmp/moe.json
    python examples/moe_flax/train.py --steps 3 --json /tmp/moe_raw.json --no-compress   # bit-identical losses
    python examples/moe_flax/train.py --steps 3 --spawn 2                                 # 2 processes x 4 devices

Mesh ('data', 'expert'): tokens are sharded over both axes; experts over 'expert'; every parameter is
additionally FSDP-sharded: dense parameters over both axes, expert parameters over 'data'.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

# examples/common is a package next to this example's directory; register it by path (the
# script's own directory is on sys.path, examples/ is not, and sys.path stays as it is)
if "common" not in sys.modules:
    _COMMON = pathlib.Path(__file__).resolve().parents[1] / "common"
    _spec = importlib.util.spec_from_file_location("common", _COMMON / "__init__.py",
                                                   submodule_search_locations=[str(_COMMON)])
    sys.modules["common"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["common"])
from common import launch  # noqa: E402  (no jax import)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_process_args(p)
    # parse the process flags first: the device count must be set before jax is imported
    pre, _ = p.parse_known_args(argv)
    if pre.spawn:
        return launch.spawn(pre, argv)
    launch.setup_env(pre)
    from common import trainer  # imports jax
    trainer.add_common_args(p, mesh="2x4", layers=2, experts=8)
    args = p.parse_args(argv)
    launch.init_distributed(args)
    plan = (
        trainer.BucketPlan("expert", lambda k: k[-1] in ("w_in", "w_out"), shard_axes=("data",),
                           group_axis="expert"),
        trainer.BucketPlan("dense", lambda k: True, shard_axes=("data", "expert")),
    )
    trainer.run(args, name="moe_flax", plan=plan, expert_axis="expert", axis_names=("data", "expert"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
