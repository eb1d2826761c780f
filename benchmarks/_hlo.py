"""Wire bytes of the collectives in a compiled HLO module (``jax.jit(f).lower(...).compile().as_text()``).

"Wire bytes" (DESIGN.md) are the operand sizes of the compiled HLO collectives, per device. Collectives inside
the branches of a ``conditional`` run only when their branch is taken, so two figures are returned:

* ``fast``: each conditional counts as its cheapest branch (the compressed path when no chunk overflowed);
* ``worst``: each conditional counts as its most expensive branch (the raw fallback).

A ``while`` body is counted once (its trip count is not known statically).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

COLLECTIVE_OPS = {
    "all-to-all", "ragged-all-to-all", "all-gather", "all-gather-start", "reduce-scatter", "all-reduce",
    "all-reduce-start", "collective-permute", "collective-permute-start", "collective-broadcast",
}

_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5, "s2": 0.25, "u2": 0.25,
}
_ARRAY_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_COMP_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_REF_ATTRS = re.compile(r"\b(to_apply|calls|body|condition|branch_computations|true_computation|"
                        r"false_computation)=(\{[^}]*\}|%?[\w.\-]+)")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string such as 'bf16[2,3]{1,0}' or '(u8[4]{0}, s32[])' (tuples are summed)."""
    total = 0.0
    for dt, dims in _ARRAY_RE.findall(shape):
        if dt not in _DTYPE_BYTES:
            continue
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _DTYPE_BYTES[dt]
    return int(total)


def _split_balanced(s: str, open_ch: str = "(", close_ch: str = ")") -> tuple[str, str]:
    """s starts with open_ch: return (inside, rest_after_close)."""
    depth = 0
    for i, ch in enumerate(s):
        if ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return s[1:i], s[i + 1:]
    return s[1:], ""


@dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: str
    attrs: str


@dataclass
class Computation:
    name: str
    entry: bool
    instrs: list[Instr] = field(default_factory=list)


def parse_module(text: str) -> dict[str, Computation]:
    comps: dict[str, Computation] = {}
    cur: Computation | None = None
    for line in text.splitlines():
        if cur is None:
            m = _COMP_RE.match(line.strip())
            if m:
                cur = Computation(m.group(2), bool(m.group(1)))
                comps[cur.name] = cur
            continue
        if line.strip() == "}":
            cur = None
            continue
        m = _INSTR_RE.match(line)
        if not m:
            continue
        name, rest = m.group(1), m.group(2).strip()
        if rest.startswith("("):
            inner, rest = _split_balanced(rest)
            shape = "(" + inner + ")"
        else:
            shape, _, rest = rest.partition(" ")
        rest = rest.strip()
        op_m = re.match(r"([\w\-]+)\(", rest)
        if not op_m:
            continue
        opcode = op_m.group(1)
        operands, attrs = _split_balanced(rest[len(opcode):])
        cur.instrs.append(Instr(name, shape, opcode, operands, attrs))
    return comps


def _operand_bytes(instr: Instr, shapes: dict[str, str]) -> int:
    # Operands print either as '%name' (compiled modules) or as 'f32[2]{0} %name'.
    total = 0
    for part in _top_level_split(instr.operands):
        part = part.strip()
        if not part:
            continue
        if _ARRAY_RE.search(part.split("%")[0]):
            total += shape_bytes(part.split("%")[0])
        else:
            ref = part.lstrip("%")
            total += shape_bytes(shapes.get(ref, ""))
    return total


def _top_level_split(s: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(s[start:i])
            start = i + 1
    out.append(s[start:])
    return out


def collectives(text: str) -> list[dict]:
    """Every collective instruction: computation, opcode, operand bytes (per device)."""
    comps = parse_module(text)
    shapes = {i.name: i.shape for c in comps.values() for i in c.instrs}
    return [{"computation": c.name, "opcode": i.opcode, "bytes": _operand_bytes(i, shapes)}
            for c in comps.values() for i in c.instrs if i.opcode in COLLECTIVE_OPS]


def wire_bytes(text: str) -> dict:
    """{'fast': int, 'worst': int, 'ops': [...]} for the ENTRY computation of a compiled HLO module."""
    comps = parse_module(text)
    shapes = {i.name: i.shape for c in comps.values() for i in c.instrs}

    def refs(instr: Instr) -> list[tuple[str, list[str]]]:
        out = []
        for key, val in _REF_ATTRS.findall(instr.attrs):
            names = [v.strip().lstrip("%") for v in val.strip("{}").split(",") if v.strip()]
            out.append((key, names))
        return out

    memo: dict[tuple[str, str], int] = {}

    def total(comp: str, pick, stack: tuple = ()) -> int:
        key = (comp, pick.__name__)
        if key in memo:
            return memo[key]
        if comp not in comps or comp in stack:
            return 0
        n = 0
        for instr in comps[comp].instrs:
            if instr.opcode in COLLECTIVE_OPS:
                n += _operand_bytes(instr, shapes)
            branches: list[str] = []
            for attr, names in refs(instr):
                if attr in ("branch_computations", "true_computation", "false_computation"):
                    branches += names
                elif attr != "to_apply" or instr.opcode not in COLLECTIVE_OPS:
                    n += sum(total(c, pick, stack + (comp,)) for c in names)
            if branches:
                n += pick(total(c, pick, stack + (comp,)) for c in branches)
        memo[key] = n
        return n

    entry = next((c.name for c in comps.values() if c.entry), None)
    if entry is None:
        raise ValueError("no ENTRY computation in HLO text")
    return {"fast": total(entry, min), "worst": total(entry, max), "ops": collectives(text)}
