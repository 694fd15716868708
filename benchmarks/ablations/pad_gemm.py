"""How to give cuBLAS a GEMM whose K is off 16 bytes without compiling anything (the question behind
session 25's `library.PADDED`, removed in session 26 on these figures).

`gemm_k4095` (A [4096, 4095] @ B [4095, 4096], bf16) takes cuBLAS's slow path as it is (lda of
4095 elements). This times, in one run on one GPU, each way of making the operands acceptable:

- `F.pad` of both operands with zeros (torch.compile's pad_mm pads both, in one fused kernel);
- an empty output with only the pad zeroed, then one copy (`narrow`);
- `torch.cat` with a zero block;
- only A copied to rows 4096 elements apart and read as a [4096, 4095] view (`aligned_rows`
  below): B's rows are N = 4096 long, already aligned, and nothing is zero-filled;

then each form with the matmul, the matmul alone over a padded K, eager's unaligned matmul and
torch.compile's. Every form's product is checked against an fp32 product before it is timed.

On the H100 (session 26, PyTorch 2.11): the aligned view kept cuBLAS on its slow path (1.05 ms
for the mm alone: K = 4095 itself, not the row stride, is what it minds); the best padded form
(`cat`, 0.243 ms) missed torch.compile's 0.229; the mm over padded copies alone took 0.182.

    python3 benchmarks/ablations/pad_gemm.py [--m 4096 --k 4095 --n 4096]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F




def aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """A copy of the 2-D `t` whose rows start every 16 bytes, read as a view of `t`'s shape."""
    per = 16 // t.element_size()
    row = -(-t.shape[1] // per) * per
    out = torch.empty_strided(tuple(t.shape), (row, 1), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def narrow_pad(t: torch.Tensor, dim: int, extra: int) -> torch.Tensor:
    """`t` with `extra` zeros along `dim`: only the pad is zeroed, then one copy."""
    shape = list(t.shape)
    shape[dim] += extra
    out = t.new_empty(shape)
    out.narrow(dim, t.shape[dim], extra).zero_()
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


def cat_pad(t: torch.Tensor, dim: int, extra: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_zeros(shape)], dim)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--k", type=int, default=4095)
    p.add_argument("--n", type=int, default=4096)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    from triton.testing import do_bench

    m, k, n = args.m, args.k, args.n
    extra = -k % 8                       # bf16: 8 elements make 16 bytes
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    want = (a.float() @ b.float()).bfloat16()
    tc_mm = torch.compile(lambda x, y: x @ y)
    ap, bp = F.pad(a, (0, extra)), F.pad(b, (0, 0, 0, extra))
    av = aligned_rows(a)
    forms = {
        "F.pad A and B, then mm": lambda: F.pad(a, (0, extra)) @ F.pad(b, (0, 0, 0, extra)),
        "narrow pad A and B, then mm": lambda: narrow_pad(a, 1, extra) @ narrow_pad(b, 0, extra),
        "cat pad A and B, then mm": lambda: cat_pad(a, 1, extra) @ cat_pad(b, 0, extra),
        "aligned_rows(A), then mm": lambda: aligned_rows(a) @ b,
        "mm over padded copies alone": lambda: ap @ bp,
        "mm over A's aligned view alone": lambda: av @ b,
        "eager a @ b (unaligned)": lambda: a @ b,
        "torch.compile a @ b": lambda: tc_mm(a, b),
    }
    copies = {
        "F.pad A": lambda: F.pad(a, (0, extra)),
        "narrow pad A": lambda: narrow_pad(a, 1, extra),
        "cat pad A": lambda: cat_pad(a, 1, extra),
        "aligned_rows(A)": lambda: aligned_rows(a),
        "F.pad B": lambda: F.pad(b, (0, 0, 0, extra)),
        "a.clone() (a contiguous copy)": lambda: a.clone(),
    }
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; A [{m}, {k}] @ B [{k}, {n}] bf16; "
          "do_bench medians (L2 flushed)")
    for name, f in forms.items():          # every product checked before any timing
        torch.testing.assert_close(f(), want, atol=0.5, rtol=0.02, msg=lambda s, name=name: f"{name}: {s}")
    for name, f in copies.items():
        torch.testing.assert_close(f()[:, :k] if "B" not in name else f()[:k], a if "B" not in name else b,
                                   rtol=0, atol=0)
    base = do_bench(forms["torch.compile a @ b"], warmup=25, rep=100)
    for name, f in forms.items():
        ms = do_bench(f, warmup=25, rep=100)
        print(f"  {name:34s} {ms * 1e3:8.1f} us   torch.compile's time / this: {base / ms:5.3f}")
    moved = 2 * a.numel() * a.element_size()
    for name, f in copies.items():
        ms = do_bench(f, warmup=25, rep=100)
        print(f"  copy: {name:28s} {ms * 1e3:8.1f} us   {moved / ms / 1e6:6.0f} GB/s (read + write of A's bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
