"""Mixed-precision plans for a bits-per-weight target, handed to mlx-lm's
converter as its `quant_predicate`.

Without calibration data (nothing is downloaded), layers are ranked by a
data-free sensitivity order in the spirit of mlx-lm's mixed recipes and
llama.cpp's K-quants: the output head and embeddings first, then the
value and down projections, layers near the ends of the stack before the
middle ones. Every layer starts at the largest candidate width whose
uniform size fits the target; layers are then raised one width in that
order while the whole model stays at or under the target. Bits per weight
count every parameter, as mlx-lm's `compute_bits_per_weight` does: packed
weights, a scale and a bias per group, and the layers left unquantized.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}


@dataclass
class Plan:
    low: int
    high: int | None
    raised: set[str]
    bpw: float
    histogram: dict[int, int]
    fixed: dict  # path -> what the model's own predicate insists on (False, or its params)

    def predicate(self, group: int):
        def choose(path: str, module):
            if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group != 0:
                return False
            if path in self.fixed:
                return self.fixed[path]
            bits = self.high if path in self.raised else self.low
            return {"bits": bits, "group_size": group, "mode": "affine"}
        return choose


def _rank(path: str, layers: int) -> tuple:
    """Smaller sorts first: more sensitive to quantization error."""
    if "lm_head" in path:
        return (0, 0)
    if "embed" in path:
        return (1, 0)
    found = re.search(r"\.(\d+)\.", path)
    index = int(found.group(1)) if found else 0
    edge = min(index, max(layers - 1 - index, 0))  # 0 at the first and last layer
    kind = 0 if re.search(r"v_proj|down_proj|v_a_proj|v_b_proj", path) else 1
    return (2 + kind, edge, path)


def plan(model, target_bpw: float, candidates: list[int], group: int, dtype: str) -> Plan:
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    float_bits = DTYPE_BITS.get(dtype, 16)
    overhead = 2 * float_bits / group  # a scale and a bias per group, in the float dtype
    own = getattr(model, "quant_predicate", None)  # e.g. MoE routers kept at 8 bits, or not quantized
    quantizable: dict[str, int] = {}
    fixed: dict = {}
    fixed_bits = 0.0
    # Without a destination, tree_flatten answers a list of (path, leaf).
    leaves = cast("list[tuple[str, Any]]", tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module))
    for path, module in leaves:
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group != 0:
            continue
        rule = own(path, module) if own is not None else True
        if rule is False:
            fixed[path] = False
        elif isinstance(rule, dict):
            fixed[path] = rule
            size = rule.get("group_size", group)
            fixed_bits += module.weight.size * (rule.get("bits", 8) + 2 * float_bits / size)
        else:
            quantizable[path] = module.weight.size
    total = sum(v.size for _, v in cast("list[tuple[str, Any]]", tree_flatten(model.parameters())))
    kept_params = total - sum(quantizable.values()) - sum(
        m.weight.size for p, m in leaves if isinstance(fixed.get(p), dict))
    other_bits = kept_params * float_bits + fixed_bits
    if not quantizable:
        raise ValueError("this model has no layers that can be quantized at this group size")

    def bpw(bits_of: dict[str, int]) -> float:
        return (other_bits + sum(n * (bits_of[p] + overhead) for p, n in quantizable.items())) / total

    widths = sorted(set(candidates))
    fitting = [b for b in widths if bpw(dict.fromkeys(quantizable, b)) <= target_bpw]
    if not fitting:
        smallest = bpw(dict.fromkeys(quantizable, widths[0]))
        raise ValueError(f"target_bpw {target_bpw} is below what {widths[0]} bits give this model "
                         f"({smallest:.2f} bits per weight with group size {group})")
    low = fitting[-1]
    high = next((b for b in widths if b > low), None)
    bits_of = dict.fromkeys(quantizable, low)
    raised: set[str] = set()
    if high is not None:
        layers = len(getattr(model, "layers", []) or [])
        budget = target_bpw * total - (other_bits + sum(n * (low + overhead) for n in quantizable.values()))
        for path in sorted(quantizable, key=lambda p: _rank(p, layers)):
            cost = quantizable[path] * (high - low)
            if cost <= budget:
                budget -= cost
                bits_of[path] = high
                raised.add(path)
    histogram: dict[int, int] = {}
    for bits in bits_of.values():
        histogram[bits] = histogram.get(bits, 0) + 1
    for rule in fixed.values():
        if isinstance(rule, dict):
            histogram[rule.get("bits", 8)] = histogram.get(rule.get("bits", 8), 0) + 1
    return Plan(low, high, raised, round(bpw(bits_of), 4), histogram, fixed)
