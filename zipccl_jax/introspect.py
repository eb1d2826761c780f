"""`explain()`: why each call site went raw or compressed, since a reset or in a given program.

Two views, the same rows:

* ``explain()``: the decisions logged since :func:`zipccl_jax.strategy.reset_decisions` (every
  call traced since then; a cached program that JAX reuses is not traced again, so it adds none);
* ``explain(program=...)``: the call sites of one program -- ``jax.jit(f).trace(x)``,
  ``.lower(x)``, ``.lower(x).compile()`` or its HLO text -- read from the program itself. Every
  recorded call binds its ops in a named scope holding its record's key
  (:func:`zipccl_jax.accounting.site_scope`), which stays in the HLO metadata however often JAX
  re-traces, re-lowers or reuses the program, and whatever was reset; a compiled program holds
  only the calls XLA kept (:func:`zipccl_jax.stats` takes ``program`` the same way).

Where ``compress="auto"`` kept every call raw on CPU, the table ends with a note saying why and
how to try the coded path anyway.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from zipccl_jax import accounting, strategy
from zipccl_jax.strategy.profile import current_platform, get_profile, np_dtype

__all__ = ["explain"]


def explain(site: str | None = None, program=None) -> str:
  """Why each call site went raw or compressed.

  ``explain()`` is a table of every decision logged since the last reset; ``explain(site)`` the
  full reasoning for one site (KeyError if it was never traced). ``program`` (a traced, lowered
  or compiled ``jax.jit`` function, or HLO text) restricts both to the call sites in that program,
  read from it (module docstring).
  """
  ds = strategy.decisions() if program is None else _program_decisions(program)
  if site is not None:
    if site not in ds:  # KeyError as documented, saying what was traced instead
      known = ", ".join(map(repr, sorted(ds)[:8])) + (", ..." if len(ds) > 8 else "")
      raise KeyError(f"zipccl_jax.explain: no decision for site {site!r}; "
                     + (f"the sites decided: {known}" if ds else "nothing was decided since the last reset"))
    d = ds[site]
    lines = [d.summary()]
    for f in dataclasses.fields(d):
      v = getattr(d, f.name)
      if isinstance(v, float):
        v = f"{v:.6g}"
      lines.append(f"  {f.name:17s} {v}")
    return "\n".join(lines)
  hdr = (f"{'site':40s} {'op':12s} {'dtype':8s} {'chunk B':>9s} {'n':>3s} {'choice':10s} "
         f"{'cap B':>9s} {'est ms':>8s} {'raw ms':>8s} {'ratio':>5s} reason")
  rows = [hdr]
  for s, d in sorted(ds.items()):
    raw_chunk = d.chunk_elems * np.dtype(np_dtype(d.dtype)).itemsize
    rows.append(f"{s[:40]:40s} {d.op:12s} {d.dtype:8s} {raw_chunk:9d} {d.axis_size:3d} "
                f"{_choice(d):10s} {d.capacity:9d} "
                f"{d.est_compressed_s * 1e3:8.3f} {d.est_raw_s * 1e3:8.3f} {d.ratio:5.2f} "
                f"{d.reason}")
  return "\n".join(rows + _cpu_note(ds.values()))


def _choice(d) -> str:
  return ("compressed" if d.compress else "raw") + (f" K={d.pieces}" if d.pieces > 1 else "")


def _program_decisions(program) -> dict:
  """{site: decision} of the recorded calls in `program` (and their two-level "<site> [levels]")."""
  out = {}
  for stats, d in accounting.program_sites(program).values():
    if d is not None:
      out[stats.name] = d
  levels = {s: d for s, d in strategy.decisions().items() if " [" in s}
  out.update({s: d for s, d in levels.items() if s.split(" [")[0] in out})
  return out


def _cpu_note(ds) -> list[str]:
  """Why compress="auto" coded nothing, where the model decided so on CPU."""
  auto = [d for d in ds if d.mode == "auto"]
  by_model = any(d.reason.startswith(("model:", "capacity saves")) for d in auto)
  if not by_model or any(d.compress for d in auto) or current_platform() != "cpu":
    return []
  link, _ = get_profile().link(None, "all_to_all", "cpu")
  codec, _ = get_profile().codec_model(np.float32, "cpu")
  return [f"note: compress='auto' coded nothing: on CPU the profile's codec (encode "
          f"{codec.encode_Bps / 1e9:.3g} GB/s, decode {codec.decode_Bps / 1e9:.3g} GB/s, on host "
          f"cores every device shares) costs more time than its smaller frames save on the link "
          f"({link.bandwidth_Bps / 1e9:.3g} GB/s). To see the coded path, pass compress=True "
          f"(compress_collectives(f, compress=True)); calibrate() measures this machine."]
