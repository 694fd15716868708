"""Ablation sweeps of the memory-bound kernels: copies, row reductions, pointwise.

What a plain copy of each shape reaches; softmax and layernorm variants (masks,
reciprocal, persistent grid, rows per program, warps); pointwise block shapes and gelu
forms; text edits of the generated pointwise kernel; calls timed with the host's time
hidden; where the generated pointwise kernel lost to the hand-written one; norm weights
loaded first. Run through run.py.
"""

from __future__ import annotations

import torch
import triton

from benchmarks.ablations.harness import (Results, attempt, bench, bench_host_hidden, check, grid_for, hand_pointwise,
                                         host_ms_per_call, pointwise_anchor)
from benchmarks.ablations.handwritten import copy_kernel, layernorm_kernel, pointwise_1d, pointwise_2d, softmax_kernel


def sweep_copy(res: Results):
    for shape in [(16384, 4096), (8192, 8192), (1 << 30,)]:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        nbytes = 2 * x.nbytes
        attempt(res, "copy", f"torch copy_ {list(shape)}", nbytes, lambda: y.copy_(x))
        for block, warps in [(1024, 4), (2048, 8), (4096, 8), (8192, 16)]:
            n = x.numel()
            attempt(res, "copy", f"triton copy {list(shape)} BLOCK={block} warps={warps}", nbytes,
                    lambda: copy_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK=block, num_warps=warps) and y)
        del x, y


def sweep_softmax(res: Results):
    R, C = 16384, 4096
    x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
    ref = torch.softmax(x.float(), -1).to(torch.bfloat16)
    y = torch.empty_like(x)
    nbytes = 2 * x.nbytes
    for masked in (1, 0):
        for recip in (0, 1):
            for br in (1, 2, 4):
                for warps in (4, 8, 16, 32):
                    for persistent in (0, 8):
                        if br * C > 16384 or (persistent and (masked or warps == 32)) or (masked and warps == 32):
                            continue
                        nb = triton.cdiv(R, br)

                        def run():
                            softmax_kernel[grid_for(nb, persistent)](x, y, R, C, BLOCK_R=br, BLOCK_C=C, MASKED=masked,
                                                                     RECIP=recip, num_warps=warps)
                            return y
                        attempt(res, "softmax", f"masked={masked} recip={recip} BR={br} warps={warps} "
                                f"persistent={persistent}", nbytes, run, ref)


def sweep_layernorm(res: Results):
    R, C = 16384, 4096
    x = torch.randn(R, C, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(C, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.layer_norm(x.float(), (C,), w.float(), b.float(), 1e-5).to(torch.bfloat16)
    y = torch.empty_like(x)
    nbytes = 2 * x.nbytes + w.nbytes + b.nbytes
    for masked in (1, 0):
        for br in (1, 2, 4):
            for warps in (4, 8, 16):
                for persistent, hoist in ((0, 0), (4, 1), (8, 1)):
                    if br * C > 16384 or (masked and persistent):
                        continue
                    nb = triton.cdiv(R, br)

                    def run():
                        layernorm_kernel[grid_for(nb, persistent)](x, w, b, y, R, C, BLOCK_R=br, BLOCK_C=C,
                                                                   MASKED=masked, HOIST_W=hoist, num_warps=warps)
                        return y
                    attempt(res, "layernorm", f"masked={masked} BR={br} warps={warps} persistent={persistent} "
                            f"hoist_w={hoist}", nbytes, run, ref)


def sweep_pointwise(res: Results):
    x, w, b, ref, y, nbytes = pointwise_anchor()
    (R, C), n = x.shape, x.numel()
    for form in (0, 1, 2):
        for block, warps in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]:
            def run():
                pointwise_1d[(triton.cdiv(n, block),)](x, w, b, y, n, C=C, BLOCK=block, FORM=form, num_warps=warps)
                return y
            attempt(res, "pointwise", f"1d form={form} BLOCK={block} warps={warps}", nbytes, run, ref)
        for br, bc, warps in [(8, 512, 4), (16, 256, 4), (4, 1024, 4), (8, 1024, 8), (16, 512, 8), (32, 256, 8)]:
            def run():
                pointwise_2d[(triton.cdiv(C, bc), triton.cdiv(R, br))](x, w, b, y, R, C=C, BR=br, BC=bc, FORM=form,
                                                                        num_warps=warps)
                return y
            attempt(res, "pointwise", f"2d form={form} BR={br} BC={bc} warps={warps}", nbytes, run, ref)


def _pointwise_variants(source: str) -> dict[str, str]:
    """Text edits of minicomp's generated broadcast-tile pointwise kernel (8192x8192)."""
    out = {"shipped": source}
    const = (source.replace("col_blocks = tl.cdiv(n_cols, BLOCK_C)", "col_blocks = tl.cdiv(8192, BLOCK_C)")
             .replace("cols < n_cols", "cols < 8192").replace("rows < n_rows", "rows < 8192"))
    out["const_bounds"] = const
    two = {}
    for label, src in (("two_axes", source), ("two_axes+const_bounds", const)):
        t = src.replace("rows = (pid // col_blocks) * BLOCK_R", "rows = tl.program_id(1) * BLOCK_R")
        t = t.replace("cols = (pid % col_blocks) * BLOCK_C", "cols = tl.program_id(0) * BLOCK_C")
        t = t.replace("grid = lambda meta: (triton.cdiv(8192, meta['BLOCK_R']) * triton.cdiv(8192, meta['BLOCK_C']),)",
                      "grid = lambda meta: (triton.cdiv(8192, meta['BLOCK_C']), triton.cdiv(8192, meta['BLOCK_R']))")
        assert t != src
        two[label] = t
    out.update(two)
    out["triton_launch_path"] = source.replace("_launch(mc_pw_mul_add_gelu_0, grid, ", "mc_pw_mul_add_gelu_0[grid](")
    return out


def sweep_pointwise_variants(res: Results):
    import minicomp
    from benchmarks import workloads as W
    from minicomp.runtime.loader import import_source
    x, w, b, ref, y, nbytes = pointwise_anchor()
    attempt(res, "pw_var", "torch copy_ of x", 2 * x.nbytes, lambda: y.copy_(x))
    for br, bc, warps in ((16, 256, 4), (8, 512, 4)):
        attempt(res, "pw_var", f"ablation kernel BR={br} BC={bc} warps={warps}", nbytes,
                hand_pointwise(x, w, b, y, br, bc, warps), ref)
    c = minicomp.compile(W.gelu_tanh_affine)
    c.compile_for(x, w, b)
    for variant, src in _pointwise_variants(c.source).items():
        try:
            mod = import_source(src, f"pw_{variant}", interpret=False)
            attempt(res, "pw_var", variant, nbytes, lambda: mod.call(x, w, b)[0], ref)
            for name in dir(mod):
                k = getattr(mod, name)
                if (name.startswith("mc_pw") and getattr(k, "best_config", None) is not None
                        and res.rows[-1]["variant"] == variant):
                    res.rows[-1]["config"] = str(k.best_config)
        except Exception as e:
            res.add("pw_var", variant, None, error=f"{type(e).__name__}: {str(e)[:200]}")


def sweep_overhead(res: Results):
    """Launch cost of the compiled call vs the bare kernel, on the softmax anchor."""
    import minicomp
    from benchmarks import workloads as W
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    small = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    for name, t in (("16384x4096", x), ("64x256", small)):
        c = minicomp.compile(W.softmax_by_hand)
        ref = W.softmax_by_hand(t)
        attempt(res, "overhead", f"minicomp call softmax {name}", 2 * t.nbytes, lambda: c(t), ref)
        attempt(res, "overhead", f"eager softmax {name}", 2 * t.nbytes, lambda: W.softmax_by_hand(t), ref)
        for label, f in (("minicomp", lambda: c(t)), ("eager", lambda: W.softmax_by_hand(t))):
            res.add("overhead", f"host time per call {label} softmax {name}", host_ms_per_call(f))


def sweep_host_hidden(res: Results):
    """Is a gap between a generated kernel and a hand-written one host time? Each callable timed
    as the suite does (do_bench) and with the host's time hidden (`bench_host_hidden`)."""
    import minicomp
    from benchmarks import workloads as W
    x, w, b, ref, y, nbytes = pointwise_anchor()
    s = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    soft = minicomp.compile(lambda t: torch.softmax(t, -1))
    pw = minicomp.compile(W.gelu_tanh_affine)
    check(pw(x, w, b), ref, "pointwise")
    check(soft(s), torch.softmax(s, -1), "softmax")

    hand = hand_pointwise(x, w, b, y, 8, 512, 4)
    check(hand(), ref, "hand pointwise")
    cases = [("torch copy_ 8192x8192", lambda: y.copy_(x), 2 * x.nbytes),
             ("hand pointwise kernel 8x512 w4", hand, nbytes),
             ("minicomp pointwise call", lambda: pw(x, w, b), nbytes),
             ("torch copy_ 16384x4096", lambda: torch.empty_like(s).copy_(s), 2 * s.nbytes),
             ("minicomp softmax call", lambda: soft(s), 2 * s.nbytes)]
    for label, fn, nb in cases:
        res.add("hidden", f"{label} do_bench", bench(fn), nb)
        res.add("hidden", f"{label} host hidden", bench_host_hidden(fn), nb)
    for label, fn, _ in cases:
        res.add("hidden", f"{label} host ms per call (200 calls, no sync)", host_ms_per_call(fn))


def sweep_pointwise_kernel(res: Results):
    """Where the generated pointwise kernel's gap to the hand-written one is: the generated
    kernel launched directly into a preallocated output (as the hand one is), into a fresh
    output per call, with its loads reordered, and the module's call, one config each."""
    import re

    import minicomp
    from benchmarks import workloads as W
    from minicomp.runtime.loader import import_source
    x, w, b, ref, y, nbytes = pointwise_anchor()
    R, C = x.shape
    c = minicomp.compile(W.gelu_tanh_affine)
    c.compile_for(x, w, b)
    src = c.source
    name = re.search(r"def (mc_pw_\w+)\(", src).group(1)
    reordered = re.sub(r"(    x = tl.load\(.*\n)((?:.*\n)*?)(    b = tl.load\(.*\n)",
                       lambda m: m.group(2).replace("    mul3 = x * w\n", "") + m.group(3) + m.group(1)
                       + "    mul3 = x * w\n", src, count=1)
    variants = {"generated": src, "loads w, b before x": reordered}
    for br, bc, warps in ((8, 512, 4), (16, 256, 4)):
        attempt(res, "pw_kernel", f"hand kernel {br}x{bc} w{warps}", nbytes, hand_pointwise(x, w, b, y, br, bc, warps),
                ref)
        for label, text in variants.items():
            mod = import_source(text, f"pwk_{label}".replace(" ", "_").replace(",", ""), interpret=False)
            fn = getattr(mod, name).fn
            grid = (triton.cdiv(R, br) * triton.cdiv(C, bc),)

            def direct(out=y):
                fn[grid](x, w, b, out, R, C, BLOCK_R=br, BLOCK_C=bc, num_warps=warps)
                return out
            attempt(res, "pw_kernel", f"{label} {br}x{bc} w{warps}: direct, preallocated output", nbytes, direct, ref)
            attempt(res, "pw_kernel", f"{label} {br}x{bc} w{warps}: direct, fresh output", nbytes,
                    lambda: direct(torch.empty_like(x)), ref)
    for label, text in variants.items():
        mod = import_source(text, f"pwk_{label}".replace(" ", "_").replace(",", ""), interpret=False)
        attempt(res, "pw_kernel", f"{label}: module call, autotuned", nbytes, lambda: mod.call(x, w, b)[0], ref)
        res.rows[-1]["config"] = str(getattr(getattr(mod, name), "best_config", None))


def _hoist_column_loads(source: str) -> str:
    """The generated row-reduction kernels with their loads of column-only operands (norm
    weights) moved up to just before each kernel's first load of a whole tile."""
    import re
    chunks = re.split(r"(?m)^(?=def )", source)          # one chunk per top-level function
    out = []
    for chunk in chunks:
        lines = chunk.split("\n")
        full = [i for i, line in enumerate(lines) if "tl.load(" in line and "mask=mask" in line]
        hoist = [i for i, line in enumerate(lines)
                 if re.match(r"\s+\w+ = tl\.load\(\w+ \+ cols, mask=col_mask", line) and full and i > full[0]]
        if hoist:
            moved = [lines[i] for i in hoist]
            lines = [line for i, line in enumerate(lines) if i not in hoist]
            lines = lines[:full[0]] + moved + lines[full[0]:]
        out.append("\n".join(lines))
    return "".join(out)


def _streaming(source: str) -> str:
    """The generated kernels with their whole-tile loads marked evict_first and their stores
    streaming (.cs): each byte is touched once, so L2 need not keep it."""
    import re
    source = re.sub(r"(tl\.load\([^\n]*mask=mask, other=0\.0)\)", r'\1, eviction_policy="evict_first")', source)
    return re.sub(r"(tl\.store\([^\n]*mask=mask)\)", r'\1, cache_modifier=".cs")', source)


def sweep_norm_variants(res: Results):
    """Row reductions with the norm weights loaded before the row (as the pointwise tiles do), and
    with streaming cache hints; a copy of the same bytes is the reference row."""
    import minicomp
    from benchmarks.workloads import WORKLOADS
    from minicomp.runtime.loader import import_source
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    attempt(res, "norm_var", "torch copy_ [16384, 4096]", 2 * x.nbytes, lambda: y.copy_(x))
    del x, y
    for wname in ("layernorm", "add_rmsnorm"):
        built = WORKLOADS[wname].build("cuda", torch.bfloat16, False)
        ref = built.fn(*built.inputs)
        ref0 = ref[0] if isinstance(ref, (list, tuple)) else ref
        nbytes = sum(t.nbytes for t in built.inputs) + sum(
            t.nbytes for t in (ref if isinstance(ref, (list, tuple)) else [ref]))
        c = minicomp.compile(built.fn)
        compiled = c.compile_for(*built.inputs)
        for label, src in (("shipped", compiled.generated.source),
                           ("weights loaded first", _hoist_column_loads(compiled.generated.source)),
                           ("streaming hints", _streaming(compiled.generated.source))):
            mod = import_source(src, f"norm_{wname}_{label}".replace(" ", "_"), interpret=False)
            mod.CONSTANTS[:] = list(compiled.call.module.CONSTANTS)
            attempt(res, "norm_var", f"{wname} {label}", nbytes, lambda: mod.call(*built.inputs)[0], ref0)
