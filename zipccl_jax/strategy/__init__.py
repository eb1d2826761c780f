"""Adaptive strategy: a calibrated cost model for ``compress="auto"``.

Every zipccl_jax collective called with ``compress="auto"`` (the default)
asks :func:`decide` at trace time whether to send raw or compressed, with
which per-chunk capacity and transport. The answer is a pure function of the
static call (operation, dtype, chunk size, axis size, axis name, call-site
name) and of the active :class:`Profile`, so every rank that traces the same
program with the same profile decides the same way: no collective is needed
to agree, and the compiled programs match.

Cost model
----------
For one call, per device (``_sent`` is the per-collective byte model of
:func:`zipccl_jax.hlo_wire_bytes`: all-to-all ``S (n-1)/n``, all-gather
``S (n-1)``, collective-permute ``S``)::

  t_raw  = sum over phases p:  link(p).latency + sent_raw(p) / link(p).bandwidth
  t_comp = sum over phases p:  link(p).latency + sent_wire(p) / link(p).bandwidth
           + encode_bytes / codec.encode_Bps + decode_bytes / codec.decode_Bps
           + coded_phases * (codec.encode_overhead_s + codec.decode_overhead_s)
           + extra latencies (padded ppermute's 4-byte overflow psum; per ragged phase, its
             size exchange and its raw-row exchange)
           + fallback_risk * t_raw

=============  ======================  ===========================  ===========================
op             phases (raw = coded)    encode bytes                 decode bytes
=============  ======================  ===========================  ===========================
all_to_all     all_to_all n*chunk      (n-1)*chunk                  (n-1)*chunk
psum_scatter   all_to_all n*chunk      (n-1)*chunk                  (n-1)*chunk
all_gather     all_gather chunk        chunk                        (n-1)*chunk
psum           all_to_all n*chunk,     n*chunk                      (2n-1)*chunk
               all_gather chunk
psum           all_gather message      message                      n*message
 (gather-sum)
ppermute       ppermute chunk          chunk                        chunk
=============  ======================  ===========================  ===========================

The chunk a rank keeps is never coded (``_exchange.own_row``); psum's gather, whose result must
not depend on the rank, decodes every row. (ragged_all_to_all: n frames each way.)

psum has two algorithms (:func:`decide_psum`): ``"a2a-sum+gather"`` (reduce-scatter, then
all-gather; ``chunk = ceil(size / n)``) and ``"gather-sum"`` (one all-gather of the whole message,
then every rank sums the ``n`` rows: one latency instead of two, ``n - 1`` messages on the wire
instead of about 2). Each is costed as above, raw and compressed, and the cheaper one runs; both
compute the same float32 order, so the choice never changes a bit.

Pieces (pipelining): :mod:`zipccl_jax.strategy.programs` (the K-chain schedule, the fastest ``K``, on
GPU/TPU with the padded transport; ``K = 1`` on CPU and on the ragged transport).
``use_algorithm(pieces=K)`` pins it.

The padded transport's wire chunk is the capacity ``C``; the ragged one's is
the expected frame size ``32 + expected_ratio * raw + 64 * blocks`` (capped at
``C``), plus one size-exchange latency per phase.

Raw is what ``compress=False`` runs: the ``jax.lax`` call as written. For the reductions
that is XLA's ring (`lax_reduction_time`: a ring reduce-scatter of ``S (n-1)/n`` on the axis's
all_gather link, psum twice that), not the table's all-to-all, which is the coded program's
phase; with ``fixed_order=True`` raw is zipccl's fixed-order all-to-all and sum (the table).

The call is compressed when ``t_comp * (1 + min_gain) < t_raw`` (and the
capacity saves bytes, the axis has more than one rank, and the dtype is coded):
``min_gain`` applies once, here, so the decision is monotone in the capacity and the rates.
Solving for the bandwidth gives the crossover of a phase-uniform link::

  bw* = (B_raw - (1 + g) B_wire) / ((1 + g) (L_comp + K) - L_raw)

with ``B`` the sent bytes, ``L`` the latencies, ``K`` the codec time and
``g = min_gain``: links slower than ``bw*`` compress, faster ones stay raw. A two-level plan
(:mod:`.levels`) ranks a compressed program that :func:`zipccl_jax.calibrate` timed over the tuple
at its time with ``timed_gain`` (default 0) instead: its estimate is a measurement beside the raw
program's, not the model whose error ``min_gain`` covers.

Capacity (padded transport, ``compress="auto"``, no explicit ``capacity=``):

1. a per-call-site capacity from observed frame sizes (:func:`observe`):
   ``round_up_8(max_frame_bytes * (1 + margin))``;
2. otherwise :func:`zipccl_jax.padded_capacity` with the profile's
   ``capacity_ratio[role][dtype]`` (role ``activation`` for forward data
   movement, ``gradient`` for reductions and every backward collective).

Transport: on CPU the padded one (XLA:CPU has no ragged all-to-all; the
collectives keep ``lax.platform_dependent`` so a CPU-traced program still
lowers ragged for GPU). On GPU/TPU, with ``transport="auto"``, the cheaper of
padded and ragged under the model.

Profiles and defaults
---------------------
:mod:`zipccl_jax.strategy.profile` holds the models and the documented defaults (its docstring has
the table); :func:`calibrate` (:mod:`zipccl_jax.strategy.calibration`) measures a profile;
:func:`set_profile`, :func:`use_profile`, :func:`load_profile` and the ``ZIPCCL_PROFILE``
environment variable (a JSON path read at first use) make one active.

Decisions are static per trace: after changing the profile, trace again (a new
``jax.jit``, or ``jax.clear_caches()``) for it to take effect.

Introspection
-------------
Each decision is logged at DEBUG level on the ``zipccl_jax.strategy`` logger::

  zipccl all_to_all site=a2a@model.py:12: compressed (est 1.230 ms vs raw 1.610 ms; ratio 0.70, bw 0.125 GB/s)

and kept in a log: :func:`decisions` (site -> :class:`Decision`) and
:func:`zipccl_jax.explain` (a table, or one site's reasoning; :mod:`zipccl_jax.introspect`).

The package
-----------
One concern per module, imports pointing down the list:

==================  ==========================================================================
module              concern
==================  ==========================================================================
``links``           :class:`LinkModel`, the default links, a cluster's flat link over two levels
``codec_cost``      :class:`CodecModel`, the default codec rates and where each comes from
``profile``         :class:`Profile` (links, codec, ratios, observed sites), the active one
``programs``        a program's cost: the phases table above, raw and coded times, pieces
``decision``        :func:`decide` (raw or compressed, capacity, transport, K), the decision log
``planning``        :func:`plan`: the one plan per call the collectives obey
``levels``          two-level calls: flat or hierarchical, which level codes; ``use_algorithm``
``calibration``     :func:`zipccl_jax.calibrate`: a profile measured on the running mesh
``cluster``         the cost model at scale (``python -m zipccl_jax.model``'s predictions)
``cli``             the command's flags, verdict, text and plot
==================  ==========================================================================

The package imports the modules the collectives decide with (``links`` to ``planning``); ``levels``
(it sizes all_to_all's mixed slots with ``zipccl_jax._mixed``), ``calibration`` (it runs the
collectives), ``cluster`` and ``cli`` are imported by name by those who use them.
"""

from zipccl_jax.strategy.decision import (PSUM_ALGORITHMS, Decision, crossover_bandwidth, decide,
                                          decide_psum, decisions, forget_decision, log_decision,
                                          observed_capacity, reset_decisions)
from zipccl_jax.strategy.planning import Plan, plan
from zipccl_jax.strategy.programs import PIPELINED_OPS

__all__ = ["Decision", "Plan", "plan", "decide", "decide_psum", "decisions", "reset_decisions",
           "log_decision", "forget_decision", "crossover_bandwidth", "observed_capacity",
           "PSUM_ALGORITHMS", "PIPELINED_OPS"]
