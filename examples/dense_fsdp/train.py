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
    trainer.add_common_args(p, mesh="2x4", layers=2, experts=0)
    args = p.parse_args(argv)
    if args.experts:
        raise SystemExit("dense_fsdp trains a dense model; use examples/moe_flax for experts")
    launch.init_distributed(args)
    plan = (trainer.BucketPlan("dense", lambda k: True, shard_axes=("fsdp",), psum_axes=("data",)),)
    trainer.run(args, name="dense_fsdp", plan=plan, expert_axis=None, axis_names=("data", "fsdp"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
