"""The hand-written Triton kernels `benchmarks/ablations/run.py` times: variants of the kernels
minicomp generates, one code-shape knob at a time (see that script's docstring)."""

import triton
import triton.language as tl

@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                   MASKED: tl.constexpr, RECIP: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)[None, :]
    for rb in range(pid, tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)):
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
        if MASKED:
            mask = (rows < n_rows) & (cols < n_cols)
            x = tl.load(x_ptr + cols + rows * BLOCK_C, mask=mask, other=0.0).to(tl.float32)
            m = tl.max(tl.where(mask, x, -float("inf")), 1)[:, None]
            e = tl.exp(x - m)
            s = tl.sum(tl.where(mask, e, 0.0), 1)[:, None]
        else:
            x = tl.load(x_ptr + cols + rows * BLOCK_C).to(tl.float32)
            m = tl.max(x, 1)[:, None]
            e = tl.exp(x - m)
            s = tl.sum(e, 1)[:, None]
        if RECIP:
            y = e * (1.0 / s)
        else:
            y = e / s
        if MASKED:
            tl.store(y_ptr + cols + rows * BLOCK_C, y.to(tl.bfloat16), mask=mask)
        else:
            tl.store(y_ptr + cols + rows * BLOCK_C, y.to(tl.bfloat16))


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr,
                     BLOCK_C: tl.constexpr, MASKED: tl.constexpr, HOIST_W: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)[None, :]
    if HOIST_W:
        w = tl.load(w_ptr + cols).to(tl.float32)
        b = tl.load(b_ptr + cols).to(tl.float32)
    for rb in range(pid, tl.cdiv(n_rows, BLOCK_R), tl.num_programs(0)):
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
        if MASKED:
            mask = (rows < n_rows) & (cols < n_cols)
            x = tl.load(x_ptr + cols + rows * BLOCK_C, mask=mask, other=0.0).to(tl.float32)
            mu = tl.sum(tl.where(mask, x, 0.0), 1)[:, None] / BLOCK_C
            xc = x - mu
            var = tl.sum(tl.where(mask, xc * xc, 0.0), 1)[:, None] / BLOCK_C
        else:
            x = tl.load(x_ptr + cols + rows * BLOCK_C).to(tl.float32)
            mu = tl.sum(x, 1)[:, None] / BLOCK_C
            xc = x - mu
            var = tl.sum(xc * xc, 1)[:, None] / BLOCK_C
        y = xc * tl.rsqrt(var + 1e-5)
        if not HOIST_W:
            w = tl.load(w_ptr + cols).to(tl.float32)
            b = tl.load(b_ptr + cols).to(tl.float32)
        y = (y * w + b).to(tl.bfloat16)
        if MASKED:
            tl.store(y_ptr + cols + rows * BLOCK_C, y, mask=mask)
        else:
            tl.store(y_ptr + cols + rows * BLOCK_C, y)


@triton.jit
def _gelu(a, FORM: tl.constexpr):
    z = 0.7978845608028654 * (a + 0.044715 * a * a * a)
    if FORM == 0:      # what minicomp emitted: 0.5 a (1 + tanh z) with tanh z = 1 - 2 / (e^2z + 1)
        g = 0.5 * a * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    elif FORM == 1:    # the same value as a * sigmoid(2z), IEEE division
        g = a / (1.0 + tl.exp(-2.0 * z))
    else:              # a * sigmoid(2z), approximate division (div.full.f32, 2 ulp)
        g = tl.fdiv(a, 1.0 + tl.exp(-2.0 * z), ieee_rounding=False)
    return g


@triton.jit
def pointwise_1d(x_ptr, w_ptr, b_ptr, y_ptr, n, C: tl.constexpr, BLOCK: tl.constexpr, FORM: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    c = offs % C
    w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, _gelu(x * w + b, FORM).to(tl.bfloat16), mask=m)


@triton.jit
def pointwise_2d(x_ptr, w_ptr, b_ptr, y_ptr, R, C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                 FORM: tl.constexpr):
    # grid (cdiv(C, BC), cdiv(R, BR)): w and b loaded once per tile of BR rows
    cols = tl.program_id(0) * BC + tl.arange(0, BC)[None, :]
    rows = tl.program_id(1) * BR + tl.arange(0, BR)[:, None]
    m = (rows < R) & (cols < C)
    w = tl.load(w_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < C, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + rows * C + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows * C + cols, _gelu(x * w + b, FORM).to(tl.bfloat16), mask=m)


@triton.jit
def gemm_tma_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    GROUP_M: tl.constexpr, PERSIST: tl.constexpr, W_KN: tl.constexpr):
    """y = x @ W (+ bias) with TMA descriptor loads; W is [N, K] (nn.Linear) or [K, N] (W_KN)."""
    a_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    if W_KN:
        b_desc = tl.make_tensor_descriptor(w_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    else:
        b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    step = tl.num_programs(0) if PERSIST else num_tiles
    for tile in range(tl.program_id(0), num_tiles, step):
        band = tile // (GROUP_M * num_pid_n)
        first_m = band * GROUP_M
        rows_in_band = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile % (GROUP_M * num_pid_n)) % rows_in_band
        pid_n = (tile % (GROUP_M * num_pid_n)) // rows_in_band
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = a_desc.load([pid_m * BM, k0])
            if W_KN:
                b = b_desc.load([k0, pid_n * BN])
            else:
                b = b_desc.load([pid_n * BN, k0]).T
            acc = tl.dot(a, b, acc)
        cols = pid_n * BN + tl.arange(0, BN)
        bias = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        y_desc.store([pid_m * BM, pid_n * BN], (acc + bias[None, :]).to(tl.bfloat16))
