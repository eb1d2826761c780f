"""Pieces (pipelining): the K-chain schedule of a coded collective and the choice of K.

A compressed all_to_all, all_gather, psum_scatter, psum or ppermute can code each chunk as ``K``
independent chains (``zipccl_jax._exchange``, "Pieces"). Per coded phase the model has three stages, encode
(``e = T_e / K + o_e``: the phase's encode bytes / encode_Bps, the encode overhead per piece),
transfer (``w = T_w / K + latency``) and decode (``d = T_d / K + o_d``), laid out as XLA:GPU
schedules the padded transport's chains (`overlap_pattern`, read from the compiled schedule of
benchmarks/gpu_schedule.py): encode k+1 runs during transfer k, the first K - 1 decodes during the
last transfer, the last decode after it::

  t(K) = e + (K - 1) max(w, e) + max(w, (K - 1) d) + d      where transfers overlap codec
  t(K) = sum_s (T_s + K o_s)                                 otherwise (CPU, ragged)

(`pipeline_time`; ``t(1) = e + w + d`` is the unpipelined time either way). The codec bytes of
each phase are the rows it codes (`strategy`'s structure table: the own row is never coded), so
``t(1)`` equals `strategy.decide`'s unpipelined estimate.
"""

from __future__ import annotations

from zipccl_jax import format as fmt
from zipccl_jax.accounting import sent_bytes

PIPELINED_OPS = ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute")
MAX_PIECES = 8
# platforms whose collectives run asynchronously beside independent work (the model's overlap)
_OVERLAP_PLATFORMS = ("gpu", "tpu")


def pipeline_stages(links, phases, codec, cap: int, raw_chunk: int, n: int):
  """Per coded phase (``(collective, chunks sent, chunks encoded, chunks decoded)``), its three
  stages as (seconds for the whole message, seconds per piece): encode (codec throughput,
  overhead), transfer (bytes / bandwidth, latency), decode."""
  out = []
  for lk, (coll, k, enc, dec) in zip(links, phases):
    out.append(((enc * raw_chunk / codec.encode_Bps, codec.encode_overhead_s),
                (sent_bytes(coll, k * cap, n) / lk.bandwidth_Bps, lk.latency_s),
                (dec * raw_chunk / codec.decode_Bps, codec.decode_overhead_s)))
  return out


def overlap_pattern(pieces: int) -> list[tuple[int, int]]:
  """(encodes, decodes) XLA:GPU runs during each of the `pieces` transfers of a padded coded
  call, in order: one encode (the next piece's) during each transfer but the last, the K - 1
  earlier decodes during the last (tests/test_pieces.py checks it against compiled schedules)."""
  return [(1, 0)] * (pieces - 1) + [(0, pieces - 1)]


def pipeline_time(stages, pieces: int, overlap: bool) -> float:
  """Seconds for a message in `pieces` chains, summed over phases. With `overlap`, the first
  encode, then each transfer beside what `overlap_pattern` runs during it, then the decodes left;
  without, every stage of every piece one after another (``K = 1`` is the unpipelined time
  either way)."""
  t = 0.0
  for phase in stages:
    e, w, d = (total / pieces + fixed for total, fixed in phase)
    if not overlap:
      t += pieces * (e + w + d)
      continue
    pattern = overlap_pattern(pieces)
    t += e + sum(max(w, ne * e + nd * d) for ne, nd in pattern)
    t += (pieces - sum(nd for _, nd in pattern)) * d
  return t


def choose_pieces(stages, chunk_elems: int, platform: str, pinned: int | None = None,
                  transport: str = "padded"):
  """(K, its time, [(k, time), ...] compared) for a coded call of `stages` (`pipeline_stages`).

  Pinned: that K (at most one piece per element). Otherwise K = 1 on CPU (XLA:CPU's
  collectives are blocking thunks and the virtual devices share the host's cores: no overlap to
  win, only per-piece overheads) and on the ragged transport (XLA:GPU schedules its chains one
  after another, every collective sync: benchmarks/gpu_schedule.py); on GPU/TPU with the padded
  transport the fastest K of 1..MAX_PIECES (each piece at least one codec block of 65536
  elements; a tie keeps the fewer pieces). No margin here: the profile's ``min_gain`` is applied
  once, to compressed against raw (`strategy.decide`), so the decision is monotone in the
  capacity and the rates.
  """
  overlap = platform in _OVERLAP_PLATFORMS and transport != "ragged"
  if pinned is not None:
    ks = sorted({1, max(1, min(int(pinned), int(chunk_elems)))})
  elif overlap:
    ks = list(range(1, max(1, min(MAX_PIECES, int(chunk_elems) // fmt.BLOCK_ELEMS)) + 1))
  else:
    ks = [1]
  cands = [(k, pipeline_time(stages, k, overlap)) for k in ks]
  if pinned is not None:
    return cands[-1][0], cands[-1][1], cands
  best = min(cands, key=lambda c: (c[1], c[0]))
  return best[0], best[1], cands
