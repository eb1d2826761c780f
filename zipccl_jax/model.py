"""``python -m zipccl_jax.model``: what compression buys on a cluster, predicted by the cost model that
``compress="auto"`` decides with.

    python -m zipccl_jax.model --hosts 16 --per-host 8 --intra 450GB/s --inter 400Gbit/s \\
        --workload moe_dispatch --bytes 64MiB --json out.json --png out.png

The command's door: the predictions are :mod:`zipccl_jax.strategy.cluster`'s (its docstring draws the
topology's links), the flags, verdict and plot :mod:`zipccl_jax.strategy.cli`'s. From Python::

  from zipccl_jax import model
  from zipccl_jax.strategy.links import LinkModel

  top = model.Topology(16, 8, inter=LinkModel(15e-6, model.parse_rate("400Gbit/s")),
                       intra=LinkModel(5e-6, model.parse_rate("450GB/s")))
  res = model.predict_step(top, model.workload("moe_dispatch", 64 << 20, top.devices))
  res["auto_choice"]          # the step variant compress="auto" runs
  res["calls"][0]["variants"]  # [{"name": "raw", "time_s": ..., "speedup_vs_raw": 1.0}, ...]
"""

import sys

from zipccl_jax.strategy.cli import main, verdict
from zipccl_jax.strategy.cluster import (OPS, WORKLOADS, Call, Topology, assumptions, crossover, parse_bytes,
                                         parse_rate, predict_call, predict_step, sweep, workload)

__all__ = ["OPS", "Topology", "Call", "WORKLOADS", "workload", "predict_call", "predict_step", "crossover",
           "assumptions", "sweep", "verdict", "parse_rate", "parse_bytes", "main"]

if __name__ == "__main__":
  sys.exit(main())
