"""The planner's incremental search (plan/search.py: cached move keys, a queue, candidate sets
kept up to date, successors carried across steps) takes exactly the moves of the literal greedy
walk its docstring defines: at every step, every candidate move scored from scratch
(`moves.scored_moves`), the first legal one that saves bytes applied. Checked on transformers
models and the repo's samples, whose graphs have the merges, siblings and recomputations a plan
meets in use, and on every text model of the zoo (tests/zoo_models.py) called with a padding
mask. The search rescores after a merge only the moves through clusters whose cost changed
(`search.cost_changed`) and whose tracked nodes' reader counts moved (`search.recounted`), and
never previews a sibling merge `moves.entangled` proves a cycle; these are what hold those
shortcuts to the walk."""

from __future__ import annotations

import importlib

import pytest
import torch

from minicomp.codegen import library_plan
from minicomp.errors import CaptureRefused
from minicomp.frontend.fx import capture
from minicomp.passes.manager import run_pipeline
from minicomp.plan.moves import candidates, creates_cycle, entangled, is_legal, scored_moves
from minicomp.plan.search import search
from minicomp.plan.state import initial_state
from minicomp.target import Target


def _fresh_successors(state, cid):
    return {r for n in state.clusters[cid].owned for r in state.readers.get(n, ())} - {cid}


def _literal_walk(state):
    """The greedy walk done literally; each step also checks the successors a State carries over
    from the one before (`State.commit` keeps those of clusters the move did not touch)."""
    applied = []
    while True:
        for cid in state.clusters:          # every cluster's successors cached before the step
            assert state.successors(cid) == _fresh_successors(state, cid), cid
        for gain, move, after in scored_moves(state):
            if gain <= 0:
                return state, applied
            if is_legal(state, after, move):
                applied.append(move)
                state = state.commit(after)
                break
        else:
            return state, applied


def _groups(state):
    return sorted((sorted(c.owned), sorted(c.copies)) for c in state.clusters.values())


def _graph(fn, inputs):
    return run_pipeline(capture(fn, inputs))[0]


def _hf(name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "llama":
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    else:
        cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=32)
        model = transformers.BertModel._from_config(cfg, attn_implementation="sdpa")
    model = model.eval().requires_grad_(False)
    ids = torch.randint(0, 64, (2, 7))
    field = "logits" if name == "llama" else "last_hidden_state"
    return _graph(lambda ids: getattr(model(input_ids=ids), field), [ids])


def _sample(name):
    m = importlib.import_module(f"samples.{name}")
    model, inputs = m.build(device="cpu", dtype=torch.float32)
    return _graph(model, inputs)


CASES = {"llama": lambda: _hf("llama"), "bert": lambda: _hf("bert"),
         "gpt_block": lambda: _sample("gpt_block"), "llama_block": lambda: _sample("llama_block")}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("library", [False, True], ids=["cpu_plan", "sm90_library"])
def test_the_incremental_search_takes_the_literal_walks_moves(case, library):
    graph = CASES[case]()
    _assert_search_is_the_walk(graph, library_plan.planned(graph, Target("cuda", (9, 0))) if library else None)


def _assert_search_is_the_walk(graph, chosen):
    got, recomputed = search(initial_state(graph, chosen))
    want, moves = _literal_walk(initial_state(graph, chosen))
    assert len(moves) > 3, moves                      # the walk had work to do
    assert _groups(got) == _groups(want)
    assert [m for m, _, _ in recomputed] == [m for m in moves if m.kind == "recompute"]


def _zoo_graph(name):
    pytest.importorskip("transformers")
    from zoo_models import zoo
    zm = zoo()[name]
    model = zm.model("eager").requires_grad_(False)
    kwargs, _ = zm.inputs("left_pad", model)
    ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
    try:
        return _graph(lambda ids, mask: getattr(model(input_ids=ids, attention_mask=mask), zm.output), [ids, mask])
    except CaptureRefused:   # the encoders' mask code asks `padding_mask.all()`: capture the plain call
        pass
    try:
        return _graph(lambda ids: getattr(model(input_ids=ids), zm.output), [ids])
    except CaptureRefused as e:   # Bloom's GELU is an autograd.Function: the zoo runs it through Dynamo
        pytest.skip(f"minicomp's own capture refuses {name}: {str(e).splitlines()[0][-120:]}")


def _zoo_text_models():
    try:
        from zoo_models import zoo
        return sorted(n for n, zm in zoo().items() if zm.kind == "text")
    except ImportError:          # transformers missing: the test skips itself
        return ["llama"]


@pytest.mark.parametrize("name", _zoo_text_models())
def test_on_the_zoo_the_incremental_search_takes_the_literal_walks_moves(name):
    graph = _zoo_graph(name)
    for chosen in (None, library_plan.planned(graph, Target("cuda", (9, 0), graphs=True))):
        _assert_search_is_the_walk(graph, chosen)


@pytest.mark.parametrize("name", _zoo_text_models())
def test_a_sibling_merge_the_search_skips_as_entangled_always_makes_a_cycle(name):
    """`moves.entangled` is a sufficient test for a cycle: at every state of the walk, each
    sibling move it names is one `creates_cycle` refuses, and it names some (a layer's readers of
    the rotary table or the mask against the next layer's). On Gemma 2 a third group recomputes a
    cheap value two siblings share, so a test that counted cheap nodes too would be wrong."""
    graph = _zoo_graph(name)
    state, named = initial_state(graph), 0
    while True:
        for move in candidates(state):
            if entangled(state, move):
                named += 1
                assert creates_cycle(state, move), move
        step = next(((m, after) for gain, m, after in scored_moves(state) if gain > 0 and is_legal(state, after, m)),
                     None)
        if step is None:
            break
        state = state.commit(step[1])
    assert named > 0
