"""The cost of a program: what one collective's raw and coded programs send and how long they take.

``structure(op, n)`` is the table of the package docstring (phases, and the chunks each phase sends,
encodes and decodes); a raw program costs its phases on their links (`phases_time`), a reduction's
raw program is jax.lax's ring (`lax_reduction_time`), a coded program adds the codec and its
transport's extras (`coded_time`).

A compressed all_to_all, all_gather, psum_scatter, psum or ppermute can code each chunk as ``K``
chains (``zipccl_jax._exchange``, "Pieces"). Per coded phase the model has three stages, encode
(``e = T_e / K + o_e``: the phase's encode bytes / encode_Bps, the encode overhead per piece),
transfer (``w = T_w / K + latency``) and decode (``d = T_d / K + o_d``), laid out as XLA:GPU
schedules the chains: per transfer, the encodes and decodes that run during it (`overlap_pattern`,
a table per transport, op and K read from the compiled schedules of benchmarks/gpu_schedule.py),
and every other encode and decode in turn. For a padded all_to_all in K <= 4 pieces: encode k+1
runs during transfer k, the first K - 1 decodes during the last transfer, the last decode after
it; on the ragged transport (`_pieces.pipelined_pieces`) every encode first, then decode k-1
during transfer k, and each piece's raw-row exchange (one latency) in turn::

  t(K) = e + (K - 1) max(w, e) + max(w, (K - 1) d) + d      padded
  t(K) = K e + w + (K - 1) max(w, d) + d + K latency         ragged, K >= RAGGED_PIPELINED_FROM
  t(K) = sum_s (T_s + K o_s)                                 otherwise (CPU; ragged, fewer pieces)

(`pipeline_time`; ``t(1) = e + w + d`` is the unpipelined time either way). The codec bytes of
each phase are the rows it codes (`strategy`'s structure table: the own row is never coded), so
``t(1)`` equals `strategy.decide`'s unpipelined estimate.
"""

from __future__ import annotations

from zipccl_jax import format as fmt
from zipccl_jax.accounting import sent_bytes
from zipccl_jax.strategy.profile import Profile


# op -> phases [(link collective, chunks sent, chunks encoded, chunks decoded)]: the own row is
# never coded (_exchange.own_row); psum's invariant gather decodes every row
def structure(op: str, n: int, algorithm: str | None = None):
  if op == "psum" and algorithm == "gather-sum":  # the chunk is the whole message
    return [("all_gather", 1, 1, n)]
  if op == "ragged_all_to_all":  # frames of `bound` rows
    return [("all_to_all", n, n, n)]
  if op in ("all_to_all", "psum_scatter"):
    return [("all_to_all", n, n - 1, n - 1)]
  if op == "all_gather":
    return [("all_gather", 1, 1, n - 1)]
  if op == "psum":
    return [("all_to_all", n, n - 1, n - 1), ("all_gather", 1, 1, n)]
  if op == "ppermute":
    return [("ppermute", 1, 1, 1)]
  raise ValueError(f"zipccl_jax: unknown collective {op!r}")


def phases_time(links, phases, chunk_bytes: int, n: int) -> tuple[int, float]:
  """(bytes one device sends, seconds) of `phases` moving `chunk_bytes` chunks uncoded."""
  sent = [sent_bytes(coll, k * chunk_bytes, n) for coll, k, *_ in phases]
  return sum(sent), sum(lk.time(b) for lk, b in zip(links, sent))


# The reductions whose raw program is jax.lax's own call (unless fixed_order): XLA's ring, which on
# a cluster spreads the host crossings over every device's link (one ring per link), where an
# all-to-all sends (n - L) / n of the message through each device's own.
LAX_REDUCTIONS = ("psum_scatter", "psum")


def lax_reduction_time(prof: Profile, op: str, axis_name, n: int, message_bytes: int,
                       plat: str) -> tuple[float, int]:
  """(seconds, bytes one device sends) of ``jax.lax.psum_scatter`` / ``psum`` of a
  `message_bytes` operand over `n` ranks: a ring reduce-scatter (``S (n-1)/n`` on the profile's
  all_gather link of the axis, the ring's), for psum followed by a ring all-gather."""
  lk, _ = prof.link(axis_name, "all_gather", plat)
  rs = sent_bytes("reduce-scatter", int(message_bytes), n)
  return (lk.time(rs), rs) if op == "psum_scatter" else (2 * lk.time(rs), 2 * rs)


def rides_ragged(tr: str, op: str, phase: int) -> bool:
  """Whether `op`'s coded phase `phase` (0-based) sends ragged frames on transport `tr`: every
  phase does but psum's second, whose all_gather of the reduced chunks stays padded."""
  return tr == "ragged" and not (op == "psum" and phase == 1)


def coded_time(tr: str, *, op, links, phases, n, cap, exp_frame, t_fixed, flag_latency):
  """(seconds, bytes sent) of the coded call on transport `tr` (`t_fixed`: codec and fallback)."""
  # flag: padded ppermute's 4-byte overflow psum (the ragged one reads its sender's size instead)
  t, wire = t_fixed + (flag_latency if tr == "padded" else 0.0), 0.0
  for i, (lk, (coll, k, *_)) in enumerate(zip(links, phases)):
    ragged = rides_ragged(tr, op, i)
    chunk = exp_frame if ragged else cap
    s = sent_bytes(coll, k * chunk, n)
    wire += s
    t += lk.time(s)
    if ragged:  # the int32 size exchange, and the raw-row exchange that moves the rows that do
      t += 2 * lk.latency_s  # not fit raw (`_exchange`: no conditional, nothing when all fit)
  return t, wire


def with_pieces(coded_time, stages, m: int, plat: str, pinned, piece: list, op: str = ""):
  """`coded_time` plus each transport's best K (:func:`choose_pieces` of ``stages(transport)``);
  `piece[2]` collects, per transport, [K, reason suffix]."""
  piece.append({})

  def timed(tr: str):
    t, wire = coded_time(tr)
    k, t_k, cands = choose_pieces(stages(tr), m, plat, pinned, transport=tr, op=op)
    if pinned:
      who = "use_algorithm"
    elif sequential_pieces(op, m, plat) > 1:
      who = "sequential, for memory"
    elif tr == "ragged":
      who = RAGGED_MEMORY
    else:
      who = "model"
    why = "" if len(cands) == 1 else f"; K={k} ({who}: " + \
        ", ".join(f"K={i} {t * 1e3:.3f} ms" for i, t in cands) + ")"
    piece[2][tr] = [k, why]
    return t + t_k - cands[0][1], wire

  return timed


# --------------------------------------------------------------------------- #
# Pieces (pipelining)
# --------------------------------------------------------------------------- #


PIPELINED_OPS = ("all_to_all", "all_gather", "psum_scatter", "psum", "ppermute")
MAX_PIECES = 8

# platforms whose collectives run asynchronously beside independent work (the model's overlap)
_OVERLAP_PLATFORMS = ("gpu", "tpu")
# The reductions whose pieces run one after another (`_exchange.reduce_rows`), and how many pieces
# psum_scatter takes off CPU: one piece's frames, decoded rows and sum alive at a time, so its temp
# stays within ~1.3x its operand (8 x H100, deviceless: benchmarks/gpu_memory.py) where one shot held
# the frames sent, the frames received and every decoded row at once (2.7x).
SEQUENTIAL_OPS = ("psum_scatter",)
MEMORY_PIECES = 4


def pipeline_stages(links, phases, codecs, cap: int, raw_chunk: int, n: int, *,
                    transport: str = "padded", op: str = "", exp_frame: int = 0):
  """Per coded phase (``(collective, chunks sent, chunks encoded, chunks decoded)``, with its link
  and its codec model: `links`, `codecs`), its three stages as (seconds for the whole message, seconds per piece): encode (codec throughput,
  overhead), transfer (bytes / bandwidth, latency), decode; then the seconds of each piece's
  raw-row exchange (one latency where the phase rides the ragged transport: `rides_ragged`, which
  sends `exp_frame` bytes a chunk where a padded phase sends `cap`; else 0)."""
  out = []
  for i, (lk, codec, (coll, k, enc, dec)) in enumerate(zip(links, codecs, phases)):
    ragged = rides_ragged(transport, op, i)
    out.append(((enc * raw_chunk / codec.encode_Bps, codec.encode_overhead_s),
                (sent_bytes(coll, k * (exp_frame if ragged else cap), n) / lk.bandwidth_Bps,
                 lk.latency_s),
                (dec * raw_chunk / codec.decode_Bps, codec.decode_overhead_s),
                lk.latency_s if ragged else 0.0))
  return out


# (encodes, decodes) XLA:GPU runs during each transfer of a padded coded call in K pieces, in order,
# per op and K: the deviceless 8 x H100 compiles of jax 0.11.2's XLA:GPU, 16 MiB per device
# (`python benchmarks/gpu_schedule.py --op OP --pieces K`, benchmarks/results/
# gpu_schedule_{a2a,ag,pp}_k{K}_padded.json; tests/test_pieces.py compares every entry with them).
# XLA's memory-minimising scheduler decides, so the pattern is not one formula: past K = 4 some
# transfers carry two encodes or a decode, and XLA combines some pieces' collectives into one (a
# tuple with fewer transfers than pieces: all_gather at K = 6, 7, 8).
SCHEDULED = {
    "all_to_all": {
        2: ((1, 0), (0, 1)),
        3: ((0, 0), (1, 0), (0, 2)),
        4: ((1, 0), (1, 0), (1, 0), (0, 3)),
        5: ((1, 0), (1, 0), (1, 0), (1, 1), (0, 3)),
        6: ((1, 0), (1, 0), (1, 0), (2, 0), (0, 2), (0, 3)),
        7: ((2, 0), (1, 0), (2, 0), (1, 0), (0, 2), (0, 2), (0, 2)),
        8: ((1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (0, 7)),
    },
    "all_gather": {
        2: ((1, 0), (0, 1)),
        3: ((1, 0), (1, 0), (0, 2)),
        4: ((1, 0), (1, 0), (1, 0), (0, 3)),
        5: ((1, 0), (1, 0), (1, 0), (1, 0), (0, 4)),
        6: ((2, 0), (2, 0), (0, 4)),
        7: ((2, 0), (2, 0), (2, 0), (0, 5)),
        8: ((2, 0), (2, 0), (2, 0), (0, 6)),
    },
    "ppermute": {
        2: ((1, 0), (0, 1)),
        3: ((1, 0), (1, 0), (0, 2)),
        4: ((1, 0), (1, 0), (1, 0), (0, 3)),
        5: ((1, 0), (1, 0), (1, 0), (1, 0), (0, 4)),
        6: ((1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (0, 5)),
        7: ((1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (1, 1), (0, 4)),
        8: ((1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (1, 0), (1, 1), (0, 5)),
    },
}


# The ragged transport's pieces (`_pieces.pipelined_pieces`): per op, the fewest pieces from which
# XLA:GPU schedules every encode first, then decode k-1 while frames transfer k is in flight (each
# of the first K - 1 decodes inside exactly one), at every size compiled: the deviceless 8 x H100
# compiles of jax 0.11.2, K = 2..8, XLA's default scheduler at 64 Ki to 16 Mi bfloat16 elements per
# row, its latency-hiding one at 64 Ki to 4 Mi (`python benchmarks/gpu_schedule.py --op OP --pieces K
# --transport ragged`, recorded at 1 Mi as benchmarks/results/gpu_schedule_{a2a,ag,pp}_k{K}_ragged
# .json; tests/test_deviceless_gpu.py compiles every K). Before each frames transfer's operands
# passed one barrier (`_exchange._ragged_frames`), all_to_all pipelined from 3 pieces and ppermute
# from 4 (3 from 1 Mi elements a row). psum's and psum_scatter's ragged pieces are costed in turn.
RAGGED_PIPELINED_FROM = {"all_to_all": 2, "all_gather": 2, "ppermute": 2}


# Why the ragged transport keeps K = 1 unless pinned: its pieces (`_pieces.pipelined_pieces`) hold
# every piece's receive buffer and decoded columns at once, about twice the call's size of temp
# over jax.lax where one shot holds one receive buffer (XLA's memory analysis, 8 x H100 deviceless,
# 64 MiB per device: all_to_all, all_gather and ppermute 2.0-2.6x at K = 2..8, 1.0x at K = 1;
# `python benchmarks/gpu_memory.py --pieces K`). `explain()` shows what each K would save.
RAGGED_MEMORY = "ragged pieces hold 2x the call's size in temp; use_algorithm(pieces=K) trades it"


def overlap_pattern(pieces: int, op: str = "all_to_all",
                    transport: str = "padded") -> tuple[tuple[int, int], ...]:
  """(encodes, decodes) XLA:GPU runs during each transfer of a coded call of `op` in `pieces` on
  `transport`, in order. Padded: `SCHEDULED`; an op or K not compiled there (psum's phases) takes
  the pipeline all_to_all compiles to at K <= 4: the next piece's encode during each transfer but
  the last, the K - 1 earlier decodes during the last. Ragged: from `RAGGED_PIPELINED_FROM` pieces
  no encode and one decode (the previous piece's) during each transfer but the first; fewer, or
  another op, nothing during any (the pieces in turn)."""
  if pieces == 1:
    return ((0, 0),)
  if transport == "ragged":
    if pieces < RAGGED_PIPELINED_FROM.get(op, MAX_PIECES + 1):
      return ((0, 0),) * pieces
    return ((0, 0),) + ((0, 1),) * (pieces - 1)
  got = SCHEDULED.get(op, {}).get(pieces)
  return got if got is not None else ((1, 0),) * (pieces - 1) + ((0, pieces - 1),)


def pipeline_time(stages, pieces: int, overlap: bool, op: str = "all_to_all",
                  transport: str = "padded") -> float:
  """Seconds for a message in `pieces` chains, summed over phases. With `overlap`: each transfer
  beside what `overlap_pattern` runs during it, and every encode and decode that runs beside no
  transfer, in turn (a transfer carries pieces / transfers of the message: XLA may combine
  pieces' collectives); without, every stage of every piece one after another (``K = 1`` is the
  unpipelined time either way). Either way, each piece's raw-row exchange too (a stage's last
  entry: a latency in turn where the phase rides the ragged transport)."""
  t = 0.0
  pattern = overlap_pattern(pieces, op, transport)
  for (te, oe), (tw, lat), (td, od), raw_rows in stages:
    e, d = te / pieces + oe, td / pieces + od
    t += pieces * raw_rows
    if not overlap:
      t += pieces * (e + tw / pieces + lat + d)
      continue
    w = tw / len(pattern) + lat
    t += sum(max(w, ne * e + nd * d) for ne, nd in pattern)
    t += (pieces - sum(ne for ne, _ in pattern)) * e + (pieces - sum(nd for _, nd in pattern)) * d
  return t


def sequential_pieces(op: str, chunk_elems: int, platform: str) -> int:
  """The fewest pieces `op` runs in, for memory: off CPU, psum_scatter runs in `MEMORY_PIECES`
  sequential pieces (at most one per codec block of its chunk), so that one piece's frames and rows
  are alive at a time (`_exchange.reduce_rows`); everything else, and every op on CPU, 1."""
  if op not in SEQUENTIAL_OPS or platform == "cpu":
    return 1
  return max(1, min(MEMORY_PIECES, int(chunk_elems) // fmt.BLOCK_ELEMS))


def choose_pieces(stages, chunk_elems: int, platform: str, pinned: int | None = None,
                  transport: str = "padded", op: str = ""):
  """(K, its time, [(k, time), ...] compared) for a coded call of `stages` (`pipeline_stages`).

  Pinned: that K (at most one piece per element). Otherwise K = 1 on CPU (XLA:CPU's
  collectives are blocking thunks and the virtual devices share the host's cores: no overlap to
  win, only per-piece overheads) and on the ragged transport (its pieces are priced as
  `overlap_pattern` lays them out, but kept to one for memory: `RAGGED_MEMORY`); on GPU/TPU with
  the padded transport the fastest K of 1..MAX_PIECES (each piece at least one codec block of
  65536 elements; a tie keeps the fewer pieces). psum_scatter off CPU: `sequential_pieces`, its
  pieces one after another (no overlap: the time of each piece's stages, summed). No margin
  here: the profile's ``min_gain`` is applied once, to compressed against raw (`strategy.decide`),
  so the decision is monotone in the capacity and the rates.
  """
  sequential = op in SEQUENTIAL_OPS
  overlap = platform in _OVERLAP_PLATFORMS and not sequential
  least = sequential_pieces(op, chunk_elems, platform)
  if pinned is not None:
    ks = sorted({1, max(1, min(int(pinned), int(chunk_elems)))})
  elif overlap:
    ks = list(range(1, max(1, min(MAX_PIECES, int(chunk_elems) // fmt.BLOCK_ELEMS)) + 1))
  else:
    ks = sorted({1, least})
  cands = [(k, pipeline_time(stages, k, overlap, op, transport)) for k in ks]
  if pinned is not None or least > 1:
    return cands[-1][0], cands[-1][1], cands
  if transport == "ragged":  # priced, not picked: for memory (`RAGGED_MEMORY`)
    return 1, cands[0][1], cands
  best = min(cands, key=lambda c: (c[1], c[0]))
  return best[0], best[1], cands
