"""Real text available offline: the Python standard library sources, as bytes.

Files are the ``*.py`` files under ``sysconfig.get_paths()['stdlib']`` (``site-packages`` excluded so that
installed packages never change the corpus), read in sorted order of their relative path and joined with a
NUL separator.  Tokens are bytes (vocabulary 256).  Batches are random windows drawn by a NumPy generator
seeded from ``--seed``, so every process of a multi-process run builds the same global batch.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig

import numpy as np

VOCAB = 256


def stdlib_files(root: str | None = None) -> list[str]:
    root = root or sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        for f in filenames:
            if f.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return [os.path.join(root, r) for r in sorted(out)]


def load_corpus(max_bytes: int = 4 << 20, root: str | None = None) -> np.ndarray:
    """The first ``max_bytes`` bytes of the concatenated stdlib sources, as uint8."""
    chunks, total = [], 0
    for path in stdlib_files(root):
        with open(path, "rb") as fh:
            b = fh.read()
        chunks.append(b + b"\0")
        total += len(b) + 1
        if total >= max_bytes:
            break
    data = np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)
    if data.size < 1024:
        raise RuntimeError(f"stdlib corpus too small ({data.size} bytes) under {root}")
    return data


def corpus_digest(data: np.ndarray) -> str:
    return hashlib.sha256(data.tobytes()).hexdigest()[:16]


class Batches:
    """Deterministic stream of (batch, seq_len + 1) int32 token windows."""

    def __init__(self, data: np.ndarray, batch: int, seq_len: int, seed: int):
        self.data, self.batch, self.seq_len = data, batch, seq_len
        self.rng = np.random.default_rng(seed)

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        starts = self.rng.integers(0, self.data.size - self.seq_len - 1, size=self.batch)
        idx = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        return self.data[idx].astype(np.int32)
