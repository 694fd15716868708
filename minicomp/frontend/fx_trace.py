"""Tracing for the torch.fx frontend: make_fx under an interception mode (see fx.py's docstring).

- `SDPA`, `MATMUL`, `LINEAR`: minicomp's own traceable stand-ins (`torch.library.custom_op`
  with fake implementations) for calls that must reach the IR whole.
- `_Intercept`: the TorchFunctionMode active while tracing; it redirects those calls and
  stamps every new fx node with the user's frame (`file`, `line`) as its stack trace.
- `trace(fn, inputs)`: the fx GraphModule and the structure of `fn`'s result; anything the
  user's code raises becomes a MinicompError at the user's line.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import sys
import sysconfig
import traceback
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from minicomp.errors import CaptureRefused, MinicompError
from minicomp.frontend.fx_eager import eager_trace
from minicomp.frontend.pyframes import frame_error

_log = logging.getLogger(__name__)
# the eager tracer first (make_fx where it declines), make_fx only, or make_fx over fake inputs
# with symbolic sizes (frontend/fx_symbolic.py: the inputs are already fake)
TRACERS = ("eager", "fake", "symbolic")

# --------------------------------------------------------------------------- traced stand-ins


def _define_op(name: str, impl: Callable, fake: Callable) -> Any:
    """A `minicomp::<name>` custom op (once per process: a second import reuses it)."""
    try:
        return getattr(torch.ops.minicomp, name).default
    except AttributeError:
        pass
    op = torch.library.custom_op(f"minicomp::{name}", impl, mutates_args=())
    op.register_fake(fake)
    return getattr(torch.ops.minicomp, name).default


def _sdpa_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
               dropout_p: float, is_causal: bool, scale: Optional[float], enable_gqa: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def _sdpa_fake(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))


# matmul and linear compute their fake results by running themselves on fake tensors
def _matmul_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def _linear_impl(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return F.linear(x, weight, bias)


def _one_dtype(what: str, *tensors: Optional[torch.Tensor]) -> None:
    """Fake tensors let mixed-dtype matmuls pass; eager refuses them, so capture must too
    (else the refusal comes at run time, from deep inside the compiled call)."""
    dtypes = [t.dtype for t in tensors if t is not None]
    if len(set(dtypes)) > 1:
        raise RuntimeError(f"{what} expects operands of one dtype, got {' and '.join(map(str, dtypes))}")


# The result shapes of the common cases come from shape arithmetic: running matmul or linear
# on fake tensors goes through their decompositions, ~10 ms a call the first time a process
# meets a shape (a quarter of gpt_block's first compile). Other ranks run the real thing.
def _matmul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _one_dtype("matmul", a, b)
    if a.dim() < 2 or b.dim() < 2:
        return torch.matmul(a, b)
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"matmul: operands of shapes {list(a.shape)} and {list(b.shape)} must have the same "
                           f"reduction dim ({a.shape[-1]} != {b.shape[-2]})")
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty(tuple(batch) + (a.shape[-2], b.shape[-1]))


def _linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    _one_dtype("linear", x, weight, bias)
    if x.dim() < 1 or weight.dim() != 2:
        return F.linear(x, weight, bias)
    if x.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"linear: input of shape {list(x.shape)} cannot be multiplied by a weight of shape "
                           f"{list(weight.shape)} ({x.shape[-1]} != {weight.shape[1]})")
    out = tuple(x.shape[:-1]) + (weight.shape[0],)
    if bias is not None:
        out = tuple(torch.broadcast_shapes(out, bias.shape))
    return x.new_empty(out)


def _sdpa_checked_fake(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Eager's refusals, on fake tensors: a call eager rejects must not be captured (the eager
    tracer hands a user's error to make_fx, which runs this)."""
    _one_dtype("scaled_dot_product_attention", q, k, v)
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2 or not (q.dim() == k.dim() == v.dim()):
        raise RuntimeError(f"scaled_dot_product_attention: query, key and value must have one rank of at least 2, "
                           f"got {q.dim()}, {k.dim()} and {v.dim()}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise RuntimeError(f"scaled_dot_product_attention: shapes {list(q.shape)}, {list(k.shape)} and "
                           f"{list(v.shape)} do not fit (query and key head dims, key and value lengths)")
    if attn_mask is not None:
        scores = tuple(q.shape[:-1]) + (k.shape[-2],)
        if attn_mask.dim() < 2:
            raise RuntimeError(f"scaled_dot_product_attention: attn_mask of shape {list(attn_mask.shape)} must have "
                               f"at least 2 dimensions and broadcast to the scores' shape {list(scores)}")
        if tuple(torch.broadcast_shapes(attn_mask.shape, scores)) != scores:
            raise RuntimeError(f"scaled_dot_product_attention: attn_mask of shape {list(attn_mask.shape)} does not "
                               f"broadcast to the scores' shape {list(scores)}")
        if attn_mask.dtype != torch.bool and attn_mask.dtype != q.dtype:
            raise RuntimeError(f"scaled_dot_product_attention: attn_mask must be bool or {q.dtype} like the query, "
                               f"got {attn_mask.dtype}")
        if is_causal:
            raise RuntimeError("scaled_dot_product_attention: attn_mask cannot be given with is_causal=True")
    return _sdpa_fake(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


SDPA = _define_op("sdpa", _sdpa_impl, _sdpa_checked_fake)
MATMUL = _define_op("matmul", _matmul_impl, _matmul_fake)
LINEAR = _define_op("linear", _linear_impl, _linear_fake)
_IMPLS = {SDPA: _sdpa_impl, MATMUL: _matmul_impl, LINEAR: _linear_impl}   # what the eager tracer runs


def sdpa_call(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    return SDPA(query, key, value, attn_mask, float(dropout_p), bool(is_causal), scale, bool(enable_gqa))


def _redirect(func: Callable, args: tuple, kwargs: dict) -> Any:
    """The stand-in call for `func(*args, **kwargs)`, or NotImplemented to run it as is."""
    if func is F.scaled_dot_product_attention:
        return sdpa_call(*args, **kwargs)
    if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__) and not kwargs and len(args) == 2:
        return MATMUL(*args)
    if func is F.linear:
        x, weight, *rest = args
        return LINEAR(x, weight, rest[0] if rest else kwargs.get("bias"))
    return NotImplemented


# --------------------------------------------------------------------------- origins

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# minicomp's own package (capture, the api's wrappers) is never the user's code
_MINICOMP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep
_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def is_user_file(filename: str) -> bool:
    stdlib = filename.startswith(_STDLIB_DIR) and "-packages" + os.sep not in filename
    return not (filename.startswith(_TORCH_DIR) or stdlib or os.path.abspath(filename).startswith(_MINICOMP_DIR)
                or filename.startswith("<"))


def _user_frame(frame) -> Any | None:
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def short_path(path: str) -> str:
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return path if rel.startswith("..") else rel


def origin_of(node: fx.Node) -> str | None:
    """`file:line` of the last user frame in a node's stack trace."""
    trace = node.meta.get("stack_trace") or ""
    hits = [m for m in _FRAME_RE.finditer(trace) if is_user_file(m.group("file"))]
    if not hits:
        return None
    return f"{short_path(hits[-1].group('file'))}:{hits[-1].group('line')}"


# value reads that make_fx does not refuse on its own (the eager tracer declines all of them first)
_NUMPY_READS = {torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.data_ptr}


class _Intercept(TorchFunctionMode):
    """Active while tracing: stamps origins on new nodes and redirects the calls kept whole."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        frame = _user_frame(sys._getframe(1))
        if frame is not None:
            code = frame.f_code
            fx_traceback.set_stack_trace([f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}\n'])
        if func in _NUMPY_READS:   # make_fx's fake tensors would hand over uninitialised memory
            where = f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}: " if frame is not None else ""
            raise CaptureRefused(f"{where}the function reads a tensor's values into Python ({func.__name__}); "
                                 "minicomp captures one static graph")
        try:
            out = _redirect(func, args, kwargs)
            return func(*args, **kwargs) if out is NotImplemented else out
        finally:
            fx_traceback.set_stack_trace([])


# --------------------------------------------------------------------------- tracing


def input_names(fn: Any, count: int) -> list[str]:
    """Parameter names of `fn` (or `module.forward`), `arg{i}` where there are none."""
    target = fn.forward if isinstance(fn, nn.Module) else fn
    names: list[str] = []
    try:
        for p in inspect.signature(target).parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
            elif p.kind == p.VAR_POSITIONAL:
                break
    except (TypeError, ValueError):
        pass
    names = names[:count] + [f"arg{i}" for i in range(len(names), count)]
    seen: set[str] = set()
    for i, n in enumerate(names):  # unique, in case a *args name collides
        if n in seen:
            names[i] = f"arg{i}"
        seen.add(names[i])
    return names


def def_origin(fn: Any) -> str | None:
    target = fn.forward if isinstance(fn, nn.Module) else fn
    code = getattr(inspect.unwrap(target), "__code__", None)
    return f"{short_path(code.co_filename)}:{code.co_firstlineno}" if code else None


def describe(fn: Any) -> str:
    return type(fn).__name__ if isinstance(fn, nn.Module) else getattr(fn, "__name__", type(fn).__name__)


# what make_fx raises for valid PyTorch that one static graph cannot hold (CaptureRefused), by
# exception type name or message; anything else the user's code raised is the user's error
_LIMIT_TYPES = ("DataDependent", "DynamicOutputShape", "UnsupportedOperator")
_LIMIT_TEXT = ("data-dependent", "unallocated storage", "Cannot access data pointer", "setup_context",
               "SymFloat", "SymInt", "SymBool")   # a value read stands for a tensor's value: Python refused it


def is_capture_limit(exc: BaseException) -> bool:
    return any(t in type(exc).__name__ for t in _LIMIT_TYPES) or any(t in str(exc) for t in _LIMIT_TEXT)


def user_error(exc: BaseException, what: str) -> MinicompError:
    """A one-paragraph error at the innermost user frame of `exc`'s traceback: CaptureRefused
    where the capture's limits caused it, else the user's own error."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename)]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = f"{what}: {type(exc).__name__}" + (f": {text}" if text else "")
    if "DataDependent" in type(exc).__name__ or "data-dependent" in str(exc):
        message += (" (a tensor's value decides Python control flow or is read with .item()/.tolist(); "
                    "minicomp captures one static graph, so compute it with tensor ops such as torch.where)")
    error = frame_error(message, frames[-1], short_path(frames[-1].filename)) if frames else MinicompError(message)
    return CaptureRefused(str(error)) if is_capture_limit(exc) else error


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """FakeTensorMode logs a full traceback before re-raising a failing op (a user's shape
    error); the error itself becomes one MinicompError paragraph, so the log is only noise."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    was = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = was


def _written(func: Any, args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """The tensors an aten call writes in place (its `Tensor(a!)` arguments)."""
    schema = func._schema
    if not schema.is_mutable:
        return
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            yield from (t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))


class _NoOutsideWrites(TorchDispatchMode):
    """make_fx's capture runs on fake tensors, but the function's weights, buffers and globals
    stay real, and fake mode runs an op whose operands are all real for real: `self.steps += 1`
    or BatchNorm's running-stat update would write the caller's tensor. This mode sits on top
    of make_fx's own and refuses such a write before it happens (the eager tracer's `_Recorder`
    does the same for its capture)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from torch._subclasses.fake_tensor import FakeTensor   # make_fx imported it already
        if any(not isinstance(t, FakeTensor) for t in _written(func, args, kwargs)):
            frames = _FRAME_RE.findall(fx_traceback.get_current_meta().get("stack_trace") or "")
            where = f"{short_path(frames[-1][0])}:{frames[-1][1]}" if frames else "capture"
            raise MinicompError(f"{where}: {func} mutates an input or weight in place; minicomp graphs are "
                                "pure: return the new value instead (nothing was written)")
        return func(*args, **kwargs)


_RETURNABLE = (torch.Tensor, int, float, bool, str, type(None), torch.SymInt, torch.dtype, torch.device)


def _check_returned(fn: Callable, out: Any) -> None:
    """CaptureRefused where `fn` returns an object a graph cannot hold (a model's KV cache
    object, which pytree does not take apart): valid PyTorch that Dynamo compiles instead."""
    odd = [leaf for leaf in pytree.tree_leaves(out) if not isinstance(leaf, _RETURNABLE)]
    if odd:
        raise CaptureRefused(f"{describe(fn)} returns a {type(odd[0]).__module__}.{type(odd[0]).__qualname__}; "
                             "one graph returns tensors and numbers")


def trace(fn: Callable, example_inputs: Sequence[torch.Tensor], *, tracer: str = "eager",
          on_tracer: Callable[[str], None] | None = None) -> tuple[fx.GraphModule, pytree.TreeSpec]:
    """make_fx capture of `fn` (see the module docstring) and the pytree structure of what it
    returns (tuple, list, dict, namedtuple...); user errors become MinicompError. No tensor
    of the caller's is written, by either tracer. `tracer` "fake" skips the eager tracer (the
    Target's `capture`, from $MINICOMP_CAPTURE); `on_tracer` is told which tracer captured
    (or raised): "eager" or "fake"."""
    if tracer not in TRACERS:
        raise MinicompError(f"tracer {tracer!r}: expected one of {', '.join(TRACERS)}")
    told = on_tracer or (lambda name: None)
    returned: list[pytree.TreeSpec] = []
    fake = [False]

    def positional(*args):  # make_fx would also make placeholders for defaulted parameters
        with _NoOutsideWrites() if fake[0] else contextlib.nullcontext():
            out = fn(*args)
        _check_returned(fn, out)
        returned.append(pytree.tree_structure(out))
        return out

    functional = torch.func.functionalize(positional, remove="mutations")

    def with_make_fx(mode: str, what: str) -> fx.GraphModule:
        told(mode)
        fake[0] = True
        try:
            with torch.no_grad(), fx_traceback.preserve_node_meta(), _Intercept(), _quiet_fake_tensor_log():
                return make_fx(functional, tracing_mode=mode, _allow_non_fake_inputs=True)(*example_inputs)
        except MinicompError:
            raise
        except Exception as e:  # anything the user's code raised while running on fake tensors
            raise user_error(e, f"capturing {describe(fn)}{what} failed") from None

    if tracer == "symbolic":     # the inputs are fake already, with symbolic sizes (fx_symbolic.py)
        return with_make_fx("symbolic", " over symbolic sizes"), returned[-1]
    if tracer == "eager":
        try:
            with torch.no_grad(), fx_traceback.preserve_node_meta(), _Intercept():
                gm = eager_trace(functional, example_inputs, _IMPLS)
            told("eager")
            return gm, returned[-1]
        except Exception as e:  # declined, or the user's code failed: make_fx's errors are the clear ones
            _log.debug("eager tracer declined %s (%s: %s); capturing with make_fx", describe(fn),
                       type(e).__name__, e)
    return with_make_fx("fake", ""), returned[-1]
