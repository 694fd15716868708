"""Composites: aten ops that lower to several registry ops and have no op of their own.

A `Composite` names what the fx frontend builds for its aten overloads (with the functions
of `minicomp/ir/composites.py`, or a handler in frontend/fx_ops*.py), the registry ops it
may use, and the kind of group those form. `identity` is the aten ops that lower to no
node at all (the operand itself). Like an `OpDef`'s, each aten name is claimed once in the
whole table (`ATEN`), which is what `docs/ops.md` lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.ir.ops import claim_aten

GROUP_KINDS = ("pointwise", "reduction", "gemm", "attention", "view", "none")


@dataclass(frozen=True)
class Composite:
    name: str
    kind: str                  # the group its nodes form: GROUP_KINDS ("none": no node)
    ops: tuple[str, ...]       # the registry ops it lowers to (casts around half types aside)
    aten: tuple[str, ...]      # the aten overloads it stands for
    note: str = ""


COMPOSITES: dict[str, Composite] = {}


def composite(c: Composite) -> Composite:
    assert c.kind in GROUP_KINDS and c.name not in COMPOSITES, c.name
    COMPOSITES[c.name] = c
    claim_aten(c.aten, c.name)
    return c


composite(Composite(
    "identity", "none", (),
    ("positive.default", "clone.default", "contiguous.default", "alias.default", "detach.default",
     "lift_fresh_copy.default", "lift_fresh.default", "resolve_conj.default",
     "resolve_neg.default", "dropout.default", "native_dropout.default"),
    "the operand itself; dropout only when not training (in training it stays a PyTorch call)"))
composite(Composite("softmax", "reduction", ("amax", "sub", "exp", "sum", "div"),
                    ("_softmax.default", "softmax.int"), "half types computed in fp32"))
composite(Composite("safe_softmax", "reduction", ("amax", "sub", "exp", "sum", "div", "eq", "where"),
                    ("_safe_softmax.default",), "SDPA's math path: 0 for a row of only -inf; half types in fp32"))
composite(Composite("log_softmax", "reduction", ("amax", "sub", "exp", "sum", "log"),
                    ("_log_softmax.default", "log_softmax.int"), "half types computed in fp32"))
composite(Composite("layer_norm", "reduction", ("mean", "sub", "mul", "add", "rsqrt"),
                    ("native_layer_norm.default", "layer_norm.default"), "only the normalised output is lowered"))
composite(Composite("group_norm", "reduction", ("reshape", "mean", "sub", "mul", "add", "rsqrt"),
                    ("native_group_norm.default", "group_norm.default"),
                    "reduced over [N, G, C/G, HW]; only the normalised output is lowered"))
composite(Composite("rms_norm", "reduction", ("mean", "mul", "add", "rsqrt"),
                    ("rms_norm.default", "_fused_rms_norm.default"), "only the normalised output is lowered"))
composite(Composite("linear", "gemm", ("permute", "matmul", "add"),
                    ("linear.default", "minicomp::linear.default"), "the bias add is the GEMM's epilogue"))
composite(Composite("clamp_tensor", "pointwise", ("maximum", "minimum"), ("clamp.Tensor",),
                    "clamp with tensor bounds"))
composite(Composite("eye", "pointwise", ("full", "triu", "tril"), ("eye.default", "eye.m"),
                    "the diagonal is what both triu and tril keep"))
composite(Composite("div_rounding", "pointwise", ("div", "floor_divide", "div_trunc"),
                    ("div.Tensor_mode", "div.Scalar_mode"), "rounding_mode None, 'floor' or 'trunc'"))
composite(Composite("glu", "pointwise", ("slice", "sigmoid", "mul"), ("glu.default",),
                    "first half times the sigmoid of the second, along dim"))
composite(Composite("batch_norm", "pointwise", ("add", "rsqrt", "mul", "sub", "reshape"),
                    ("native_batch_norm.default", "_native_batch_norm_legit_no_training.default"),
                    "inference only (running statistics); the saved statistics are not lowered"))
composite(Composite("nll_loss", "reduction", ("ne", "where", "gather", "reshape", "cast", "neg", "mul", "sum", "div"),
                    ("nll_loss_forward.default",),
                    "[N, C] log-probabilities and [N] classes; ignore_index and class weights; only the loss is lowered"))
composite(Composite("mse_loss", "reduction", ("sub", "mul", "mean", "sum"), ("mse_loss.default",),
                    "reduction none (pointwise), mean or sum"))
composite(Composite("smooth_l1_loss", "reduction", ("sub", "abs", "lt", "mul", "div", "where", "mean", "sum"),
                    ("smooth_l1_loss.default",), "reduction none (pointwise), mean or sum"))
composite(Composite("huber_loss", "reduction", ("sub", "abs", "lt", "mul", "where", "mean", "sum"),
                    ("huber_loss.default",), "reduction none (pointwise), mean or sum"))
