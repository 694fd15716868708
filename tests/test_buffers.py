"""Buffer reuse in run() (codegen/buffers.py): a kernel output takes the memory of a buffer that
nothing reads any more. The plan's rules on their own, then whole functions compiled and compared
with eager: layers that repeat shapes, a view of a dead-looking buffer read later, outputs, and
a transformers model called the plain way."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.codegen.buffers import BufferPlan

sys.path.insert(0, str(Path(__file__).parent))
from conftest import tol  # noqa: E402

KEY = ((4, 8), (8, 1), torch.float32)


def _line(nid: int) -> str:
    return f"buf{nid} = _empty((4, 8), (8, 1), torch.float32)"


def _plan(reads, allocs, aliases=()) -> BufferPlan:
    p = BufferPlan()
    for pos, nids in reads:
        p.read(pos, nids)
    for pos, ins, outs in aliases:
        p.may_alias(pos, ins, outs)
    for pos, nid, key in allocs:
        p.alloc(pos, nid, f"buf{nid}", _line(nid), key)
    return p


def test_a_buffer_is_reused_only_after_its_last_reader_and_only_for_its_own_layout():
    # buf1 (pos 0) read at 1 and 2; buf2 (pos 1) read at 2; buf3 (pos 2) read at 3; buf4 (pos 3);
    # buf5 (pos 3, another dtype)
    other = ((4, 8), (8, 1), torch.float16)
    p = _plan([(1, [1]), (2, [1, 2]), (3, [3])],
              [(0, 1, KEY), (1, 2, KEY), (2, 3, KEY), (3, 4, KEY), (3, 5, other)])
    swap = p.lines(kept=set())
    assert _line(2) not in swap                    # buf1 still read at 2
    assert _line(3) not in swap                    # buf1 and buf2 read at 2 itself: not free before 3
    assert swap[_line(4)].startswith("buf4 = buf1  #")
    assert _line(5) not in swap                    # no dead fp16 buffer


def test_launches_of_one_position_never_share_memory_and_outputs_are_never_reused():
    # a combo launch at 2 writes buf3 and buf4; buf1 is dead after 1 but only one of them takes it;
    # buf2 is a graph output
    p = _plan([(1, [1])], [(0, 1, KEY), (1, 2, KEY), (2, 3, KEY), (2, 4, KEY), (3, 5, KEY)])
    swap = p.lines(kept={2})
    assert swap[_line(3)].startswith("buf3 = buf1") and _line(4) not in swap
    assert not any(v.startswith("buf5 = buf2") for v in swap.values())


def test_a_view_keeps_what_it_views_alive_until_its_own_last_reader():
    # buf1 (pos 0) is viewed by a view group at 1 as node 9, which is read at 4: buf1 lives to 4
    p = _plan([(1, [1]), (4, [9])], [(0, 1, KEY), (2, 2, KEY), (5, 3, KEY)], aliases=[(1, [1], [9])])
    swap = p.lines(kept=set())
    assert _line(2) not in swap
    assert swap[_line(3)].startswith("buf3 = buf1")
    # and a view that is an output keeps it for good
    p = _plan([(1, [1])], [(0, 1, KEY), (5, 3, KEY)], aliases=[(1, [1], [9])])
    assert not p.lines(kept={9})


def mlp_stack(x, ws):
    """Four residual blocks of one shape: every block's buffers are dead by the next block's."""
    for w1, w2 in ws:
        x = x + F.gelu(F.layer_norm(x, x.shape[-1:]) @ w1) @ w2
    return x


@pytest.mark.parametrize("reuse", ["1", "0"])
def test_repeated_blocks_reuse_buffers_and_equal_eager(reuse, monkeypatch):
    monkeypatch.setenv("MINICOMP_REUSE_BUFFERS", reuse)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 17, 24, generator=g)
    ws = [(torch.randn(24, 40, generator=g) / 5, torch.randn(40, 24, generator=g) / 6) for _ in range(4)]
    f = minicomp.compile(mlp_stack)
    for _ in range(2):
        torch.testing.assert_close(f(x, ws), mlp_stack(x, ws), **tol(torch.float32))
    reused = f.source.count("memory: nothing reads it after this")
    assert (reused >= 6) if reuse == "1" else reused == 0, f.source


def test_a_buffer_viewed_by_pytorch_stays_alive_until_the_view_is_read():
    """`h.unfold(...)` runs through PyTorch (an opaque op) and returns a view of h's memory, read
    only at the end; the blocks in between write buffers of h's shape, and none may take h's."""
    def fn(x, w):
        h = torch.tanh(x @ w)
        v = h.unfold(1, 16, 16)          # [16, 1, 16]: laid out as h, so not copied
        y = h
        for _ in range(3):
            y = torch.sigmoid(y @ w) * 2.0
        return y + 1.0, v.sum(-1) * 1.0
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g) / 4
    f = minicomp.compile(fn)
    for got, want in zip(f(x, w), fn(x, w)):
        torch.testing.assert_close(got, want, **tol(torch.float32))
    assert "aten.unfold" in f.source and "memory: nothing reads it after this" in f.source, f.source


def test_a_transformers_gpt2_reuses_buffers_and_equals_eager():
    import transformers
    cfg = transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=3, n_head=4, n_positions=32)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg).eval().requires_grad_(False)
    f = minicomp.compile(lambda ids: m(input_ids=ids).logits)
    ids = torch.randint(0, 96, (2, 11))
    torch.testing.assert_close(f(ids), m(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    assert f.source.count("memory: nothing reads it after this") >= 6, f.source
