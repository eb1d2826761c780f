"""The codec's cost: per-device encode and decode speed, and the documented defaults with their sources.

A :class:`CodecModel` is what :func:`zipccl_jax.calibrate` fits per dtype (``Profile.codec``);
:data:`DEFAULT_CODEC` applies where a profile has none, and :data:`DEFAULT_CODEC_SOURCE` says where each
default comes from (measured, scaled from a measurement, or assumed: what ``zipccl_jax.model`` prints).
"""

from __future__ import annotations

import dataclasses

from zipccl_jax import format as fmt


_FP8_NAMES = tuple(dt.name for dt in fmt.FP8_DTYPES)
_DTYPE_NAMES = tuple(dt.name for dt in fmt.SUPPORTED_DTYPES)


@dataclasses.dataclass
class CodecModel:
  """Per-device codec speed: ``t = overhead + bytes / throughput`` per side.

  Bytes are the raw (uncompressed) bytes encoded or decoded. The overheads
  cover the per-call fixed costs of the coded path (FFI launch, header check,
  branch).

  ``slot_Bps`` and ``slot_overhead_s``: the same line for the passes the two-level all_to_all's
  mixed slot exchange runs over its own host's rows instead of coding them (into their slots as
  bytes, back out, joined with their tails: ``zipccl_jax._mixed.slot_passes``), per raw byte of
  those rows. :func:`zipccl_jax.calibrate` measures it beside the codec; ``slot_Bps == 0`` means
  not measured, and those passes then cost nothing (the defaults, and profiles from before it).
  """
  encode_Bps: float
  decode_Bps: float
  encode_overhead_s: float = 0.0
  decode_overhead_s: float = 0.0
  slot_Bps: float = 0.0
  slot_overhead_s: float = 0.0

  def encode_time(self, nbytes: float) -> float:
    return self.encode_overhead_s + float(nbytes) / self.encode_Bps

  def decode_time(self, nbytes: float) -> float:
    return self.decode_overhead_s + float(nbytes) / self.decode_Bps

  def slot_time(self, nbytes: float) -> float:
    """Seconds of the mixed slot exchange's passes over `nbytes` raw bytes of own-host rows (0 where
    not measured)."""
    return self.slot_overhead_s + float(nbytes) / self.slot_Bps if self.slot_Bps > 0 else 0.0

  def scaled(self, factor: float) -> "CodecModel":
    """This model with every cost `factor` times as large (throughputs divided, overheads times)."""
    return CodecModel(self.encode_Bps / factor, self.decode_Bps / factor,
                      self.encode_overhead_s * factor, self.decode_overhead_s * factor,
                      self.slot_Bps / factor, self.slot_overhead_s * factor)


DEFAULT_CODEC: dict[str, dict[str, CodecModel]] = {
    "cpu": {
        "bfloat16": CodecModel(1.0e9, 1.5e9, 30e-6, 30e-6),
        "float16": CodecModel(1.0e9, 1.5e9, 30e-6, 30e-6),
        "float32": CodecModel(1.5e9, 2.0e9, 30e-6, 30e-6),
        # one-byte floats: ~0.8x (encode) and ~0.7x (decode) the bfloat16 element rate
        # (benchmarks/codec_fp8.py), i.e. ~0.4x its byte rate
        **{d: CodecModel(0.4e9, 0.5e9, 30e-6, 30e-6) for d in _FP8_NAMES},
    },
    # Measured on an NVIDIA H200 by the GPU kit, wire format v2 (benchmarks/results/gpu_report_h200_v2.json):
    # bfloat16 is the codec inside a jitted step, as a collective runs it (a 64 MB MoE dispatch payload in 8
    # frames at the padded capacity: encode 127.4, decode 101.3 GB/s); the other dtypes scale it by their
    # kernel rates relative to bfloat16's (256 MB per call, "codec_gb_per_s"). Rounded down; the 10 us
    # per-side overhead is still assumed.
    "gpu": {
        "bfloat16": CodecModel(125e9, 100e9, 10e-6, 10e-6),
        "float16": CodecModel(115e9, 89e9, 10e-6, 10e-6),
        "float32": CodecModel(155e9, 87e9, 10e-6, 10e-6),
        **{d: CodecModel(81e9, 77e9, 10e-6, 10e-6) for d in _FP8_NAMES},
    },
    "tpu": {d: CodecModel(400e9, 400e9, 10e-6, 10e-6) for d in _DTYPE_NAMES},
}

# Where each DEFAULT_CODEC rate comes from (what zipccl_jax.model labels them with); the scale factors
# are the H200 kernel rates of benchmarks/results/gpu_report_h200_v2.json ("codec_gb_per_s").
_H200 = ("on an H200 (GPU kit, wire format v2, benchmarks/results/gpu_report_h200_v2.json); 10 us overheads "
         "assumed")

_SCALED = "scaled: bfloat16's measurement x the {} / bfloat16 kernel rates{} " + _H200

DEFAULT_CODEC_SOURCE: dict[str, dict[str, str]] = {
    "cpu": {d: "assumed: documented default for cpu" for d in _DTYPE_NAMES},
    "gpu": {"bfloat16": "measured: bfloat16 codec inside a jitted step " + _H200,
            "float16": _SCALED.format("float16", ""), "float32": _SCALED.format("float32", ""),
            **{d: _SCALED.format("float8", " (float8_e4m3fn's and float8_e5m2's mean, for every float8 "
                                 "type)") for d in _FP8_NAMES}},
    "tpu": {d: "assumed: documented default for tpu (not measured)" for d in _DTYPE_NAMES},
}


def codec_time(codecs, phases, raw_chunk_bytes: int) -> float:
  """Seconds of the codec for one call of `phases` (:func:`~zipccl_jax.strategy.programs.structure`),
  `codecs` one model per phase (`Profile.phase_codecs`): every phase's encoded and decoded chunks of
  `raw_chunk_bytes`, and one overhead per side per phase."""
  return sum(p[2] * raw_chunk_bytes / c.encode_Bps + p[3] * raw_chunk_bytes / c.decode_Bps
             + c.encode_overhead_s + c.decode_overhead_s for c, p in zip(codecs, phases))
