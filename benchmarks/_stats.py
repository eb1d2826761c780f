"""How every benchmark summarises repeated, interleaved timings: median, spread, paired ratios, machine load.

The machine the benchmarks run on is shared, so one number per variant is not enough: each variant is timed
several times, interleaved with the others (drift hits every variant alike), and reported as the median with
its spread, the interquartile range (p75 - p25, seconds). A comparison between two variants is the ratio of
their medians, with the spread of the per-repetition ratios (repetition k of A over repetition k of B: the two
ran back to back, so load they share cancels).
"""
from __future__ import annotations

import os
import statistics
from typing import Sequence


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty sequence, q in [0, 1]."""
    s = sorted(float(x) for x in xs)
    if not s:
        raise ValueError("quantile of an empty sequence")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(xs: Sequence[float]) -> float:
    """Interquartile range (p75 - p25), in the unit of xs; 0 for a single value."""
    return quantile(xs, 0.75) - quantile(xs, 0.25)


def summary(xs: Sequence[float]) -> dict:
    """{'median_s', 'spread_s', 'min_s', 'max_s', 'n'} of repeated timings (seconds)."""
    return {"median_s": statistics.median(xs), "spread_s": spread(xs), "min_s": min(xs), "max_s": max(xs),
            "n": len(xs)}


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> dict:
    """A over B: {'ratio' (median(a) / median(b)), 'ratio_spread' (IQR of a[k] / b[k]), 'ratio_p25',
    'ratio_p75'}; a and b are repetitions timed back to back, index by index."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_ratio needs two equally long, non-empty series, got {len(a)} and {len(b)}")
    per = [x / y for x, y in zip(a, b)]
    return {"ratio": statistics.median(a) / statistics.median(b), "ratio_spread": spread(per),
            "ratio_p25": quantile(per, 0.25), "ratio_p75": quantile(per, 0.75)}


def machine_load() -> dict:
    """The load averages (1, 5, 15 min) and the core count: how busy the shared machine was."""
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1min": one, "loadavg_5min": five, "loadavg_15min": fifteen, "cpu_count": os.cpu_count()}
