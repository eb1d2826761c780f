"""Observed frame sizes per call site: the `observe()` block and the collectives' hook.

Inside ``with zipccl_jax.observe():`` every coded-dtype collective traced encodes its rows once
more at full capacity and reports the frame sizes to the host; on exit the largest frame per
call site goes into the profile (`profile.SiteObservation`), from which ``compress="auto"``
derives per-site capacities (`strategy.observed_capacity`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from typing import Callable

import jax
import numpy as np

from zipccl_jax import codec
from zipccl_jax.capacity import CODED_DTYPES
from zipccl_jax.strategy.profile import Profile, SiteObservation, get_profile

__all__ = ["observe"]

_OBSERVER: dict | None = None
_OBSERVER_LOCK = threading.Lock()


def observing() -> bool:
  return _OBSERVER is not None


def _fold_callback(site: str, op: str, dtype_name: str, chunk_elems: int):
  """A host callback that folds a (frames,) nbytes array into the observer."""
  target = _OBSERVER

  def cb(nbytes):
    nb = np.asarray(nbytes).astype(np.int64).reshape(-1)
    if nb.size == 0:
      return
    o = SiteObservation(op, dtype_name, int(chunk_elems), int(nb.max()), int(nb.size),
                        int(nb.sum()))
    with _OBSERVER_LOCK:
      if target is None:
        return
      prev = target.get(site)
      target[site] = o if prev is None else prev.merge(o)

  return cb


def _merge_sites(into: dict, new: dict) -> None:
  for s in sorted(new):
    o = new[s]
    into[s] = o if s not in into else into[s].merge(o)


def allgather_json(obj) -> list:
  """Every process's JSON-able ``obj``, in process order (a collective over all processes)."""
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils
  raw = np.frombuffer(json.dumps(obj, sort_keys=True).encode(), dtype=np.uint8)
  lens = np.asarray(multihost_utils.process_allgather(np.array([raw.size], np.int32)))
  width = int(lens.max())
  buf = np.zeros((width,), np.uint8)
  buf[:raw.size] = raw
  allb = np.asarray(multihost_utils.process_allgather(buf)).reshape(-1, width)
  return [json.loads(bytes(allb[i, :int(lens.reshape(-1)[i])]).decode())
          for i in range(allb.shape[0])]


@contextlib.contextmanager
def observe(profile: Profile | None = None, *, agree: bool = True):
  """Records the frame sizes of every coded-dtype call site traced inside the block.

  Functions traced inside the ``with`` block encode each message once more
  (at full capacity, whatever the plan) and report the frame sizes to the
  host; run them on representative data (eagerly, or a few jitted steps),
  still inside the block. On exit the maximum frame size per call site is
  stored in ``profile.sites`` (default: the active profile), merged across
  processes when ``agree`` (a collective: every process must leave the block
  together), so all ranks derive the same capacities. Then trace again
  (a new ``jax.jit`` or ``jax.clear_caches()``): ``compress="auto"`` uses
  ``round_up_8(max_frame * (1 + profile.margin))`` for those sites.
  """
  global _OBSERVER
  prof = profile if profile is not None else get_profile()
  with _OBSERVER_LOCK:
    if _OBSERVER is not None:
      raise RuntimeError("zipccl_jax: observe() blocks cannot nest")
    _OBSERVER = {}
    mine = _OBSERVER
  try:
    yield prof
  finally:
    try:
      jax.effects_barrier()
    finally:
      with _OBSERVER_LOCK:
        _OBSERVER = None
  local = {s: dataclasses.asdict(o) for s, o in mine.items()}
  gathered = allgather_json(local) if agree else [local]
  merged: dict = {}
  for d in gathered:
    _merge_sites(merged, {s: SiteObservation(**o) for s, o in d.items()})
  _merge_sites(prof.sites, merged)



def record_frames(site: str, op: str, rows_fn: Callable) -> None:
  """Inside `observe`: report the frame sizes of this call's rows (`rows_fn()`, (F, m)) to the host.

  Encodes the rows once more at full capacity (only while observing) and
  folds ``nbytes`` into the observer with a debug callback.
  """
  if not observing():
    return
  rows = rows_fn()
  if np.dtype(rows.dtype) not in CODED_DTYPES or rows.size == 0:
    return
  _, nbytes = codec.encode_frames(rows)
  jax.debug.callback(_fold_callback(site, op, np.dtype(rows.dtype).name, rows.shape[-1]), nbytes)
