"""Hook points and call-scoped hooks.

A `HookPoint` is an identity module placed where an intermediate tensor is born; its name is
its path in `named_modules()` (TransformerLens's scheme), so keys and code cannot drift.

Hooks are *not* registered on modules. `hooks(model, {...})` sets a `ContextVar` holding
{hook point: [functions]} for the duration of a `with` block. Context variables are per thread
and per asyncio task, so one model can serve many browser sessions while each session's
ablations stay its own (TransformerLens's module-registered hooks are global state by its own
docstring). A process-wide count of active contexts is the fast path: while it is zero a hook
point is one integer test, and `torch.compile` sees a plain global.

Threads: a thread does not inherit the context, so a job handed to a thread pool inside
`with model.hooks(...)` runs the unedited model. Submit it with `submit(executor, fn, ...)`
(or wrap it with `in_context(fn)`): it then runs with the hooks active where it was submitted,
even if the block has ended by the time it runs. The workbench's own thread pools do this.

Heads: a function wrapped by `reads_heads(fn, [2, 5])` promises to read heads 2 and 5 and edit nothing, which
lets attention compute only those heads' probabilities (`HookPoint.wanted_heads`); `run_with_cache(heads=...)`
is built on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import fnmatch
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import torch
from torch import nn
from torch.nn.modules import module as _nn

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
"""TransformerLens's signature: fn(tensor, hook) -> replacement tensor, or None to keep it."""

NameFilter = str | Iterable[str] | Callable[[str], bool] | None
P = ParamSpec("P")
R = TypeVar("R")

_ACTIVE: contextvars.ContextVar[dict[HookPoint, tuple[HookFn, ...]] | None] = contextvars.ContextVar(
    "workbench_hooks", default=None
)
_ACTIVE_COUNT = 0  # number of open hook contexts in the process; 0 = nothing can listen


@dataclass(frozen=True)
class DecodingStep:
    """Where a search stands while its decoder runs: what a hook sees as `hook.decoding` during generation.

    Row r of the activation decodes input sentence `sentences[r]` (an index into the batch given to the
    search) on its beam `beams[r]` (0 in greedy search); `step` is the decoder position being computed (0 reads
    the start token). None outside a search, and for the encoder (which runs once, before step 0)."""

    step: int
    sentences: torch.Tensor  # (rows,) long
    beams: torch.Tensor  # (rows,) long


_DECODING: contextvars.ContextVar[DecodingStep | None] = contextvars.ContextVar("workbench_decoding", default=None)


@contextlib.contextmanager
def decoding_step(step: int, sentences: torch.Tensor, beams: torch.Tensor) -> Iterator[None]:
    """Mark the block as one decoding step (the searches wrap each decoder call in it)."""
    token = _DECODING.set(DecodingStep(step, sentences, beams))
    try:
        yield
    finally:
        _DECODING.reset(token)
_COUNT_LOCK = threading.Lock()


# torch's process-wide hook dicts (`register_module_forward_hook` ...): mutated in place, never rebound, so
# reading them through these names is one global lookup
_GLOBAL_FORWARD, _GLOBAL_PRE = _nn._global_forward_hooks, _nn._global_forward_pre_hooks
_GLOBAL_BACKWARD, _GLOBAL_BACKWARD_PRE = _nn._global_backward_hooks, _nn._global_backward_pre_hooks


def observed(module: nn.Module) -> bool:
    """True when plain PyTorch machinery watches `module`: a forward or backward (pre-)hook registered on it
    or on every module (`register_module_forward_hook`), or a `forward` replaced on the instance (nnsight's
    way in). Code that would bypass the module's call for speed (fused projections, the hook points' fast
    call) asks this first and calls the module through `nn.Module.__call__` when it is True."""
    return bool(module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__
                or module._backward_hooks or module._backward_pre_hooks or _GLOBAL_FORWARD or _GLOBAL_PRE
                or _GLOBAL_BACKWARD or _GLOBAL_BACKWARD_PRE)


class HookPoint(nn.Module):
    """Identity at a named place in the forward pass; active hooks may read or replace the tensor.

    Two ways in, which compose: the workbench's call-scoped `hooks()` (below), and plain PyTorch hooks
    (`register_forward_hook`, `register_forward_pre_hook`, nnsight's instrumented `forward`), which see the
    tensor after the call-scoped hooks ran and may replace it in turn.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name = "<unnamed>"  # set by `name_hook_points` from the owning model's module paths

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _ACTIVE_COUNT == 0:
            return x
        return _run_hooks(self, x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # nn.Module.__call__'s machinery costs ~1 µs and these run hundreds of times per forward: take it only
        # when a plain PyTorch hook (or a replaced forward) is there to see the call; the test is a few dict reads
        d = self.__dict__  # item reads, not attribute lookups: a fifth cheaper
        if (_GLOBAL_FORWARD or _GLOBAL_PRE or _GLOBAL_BACKWARD or d["_forward_hooks"] or d["_forward_pre_hooks"]
                or d["_backward_hooks"] or "forward" in d):
            return nn.Module.__call__(self, x)
        if _ACTIVE_COUNT == 0:
            return x
        return _run_hooks(self, x)

    def is_active(self) -> bool:
        """True when a hook in the current context, or a plain PyTorch hook, listens here (lets attention
        and the norms pick their path)."""
        d = self.__dict__
        return ((_ACTIVE_COUNT != 0 and _listens(self)) or bool(
            _GLOBAL_FORWARD or _GLOBAL_PRE or d["_forward_hooks"] or d["_forward_pre_hooks"] or "forward" in d))

    def asked(self) -> bool:
        """True when a call-scoped hook, or a forward hook registered on this very point, listens: what an
        optional activation (the per-head inputs) waits for before it is computed. Process-wide hooks and an
        instrumented `forward` (nnsight replaces every module's) watch every module, so they do not ask for one:
        the model then runs its usual path, and nnsight's reads of the projections stay in order."""
        d = self.__dict__
        return (_ACTIVE_COUNT != 0 and _listens(self)) or bool(d["_forward_hooks"] or d["_forward_pre_hooks"])

    def wanted_heads(self) -> tuple[int, ...] | None:
        """The heads (dim 1) that the listeners here read: () when nothing listens, None when one reads or may
        edit every head (a function without a `heads` attribute, or a plain PyTorch hook). See `reads_heads`."""
        d = self.__dict__
        if _GLOBAL_FORWARD or _GLOBAL_PRE or d["_forward_hooks"] or d["_forward_pre_hooks"] or "forward" in d:
            return None
        if _ACTIVE_COUNT == 0:
            return ()
        return _wanted_heads(self)

    def listeners(self) -> tuple[HookFn, ...] | None:
        """The call-scoped functions listening here in this context, in order (() when none); None when a plain
        PyTorch hook or a replaced forward listens too, whose wishes cannot be read (a splice then hands the
        whole tensor: `core.splice.edits_features`)."""
        d = self.__dict__
        if _GLOBAL_FORWARD or _GLOBAL_PRE or d["_forward_hooks"] or d["_forward_pre_hooks"] or "forward" in d:
            return None
        if _ACTIVE_COUNT == 0:
            return ()
        return _listeners(self)

    @property
    def decoding(self) -> DecodingStep | None:
        """During generation, the step and each row's sentence and beam (see `DecodingStep`); else None."""
        return _DECODING.get()

    def extra_repr(self) -> str:
        return self.name


# Under torch.compile the no-hook path is one guarded integer test. The two functions below run
# only while some context is open; dynamo cannot trace ContextVar lookups, so once dynamo is in use
# they are swapped for `torch.compiler.disable`d versions (a graph break, then eager hook calls).
# The swap is lazy because importing torch._dynamo costs seconds, and `import workbench` should not.
def _run_hooks_eager(point: HookPoint, x: torch.Tensor) -> torch.Tensor:
    active = _ACTIVE.get()
    fns = active.get(point) if active else None
    if fns is None:
        return x
    for fn in fns:
        out = fn(x, point)
        if out is not None:
            if not isinstance(out, torch.Tensor) or out.shape != x.shape:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"hook on {point.name} must return None or a tensor of shape "
                                 f"{tuple(x.shape)}, got {got}")
            if out.dtype != x.dtype or out.device != x.device:
                # caught here, the error names the hook; later torch fails deep in a matmul without it
                raise ValueError(f"hook {getattr(fn, '__name__', fn)!r} on {point.name} returned a {out.dtype} "
                                 f"tensor on {out.device}, but the activation is {x.dtype} on {x.device}; "
                                 f"return out.to(x.dtype, x.device)")
            x = out
    return x


def _listens_eager(point: HookPoint) -> bool:
    active = _ACTIVE.get()
    return bool(active) and point in active


def _wanted_heads_eager(point: HookPoint) -> tuple[int, ...] | None:
    active = _ACTIVE.get()
    fns = active.get(point) if active else None
    if not fns:
        return ()
    heads: set[int] = set()
    for fn in fns:
        read = getattr(fn, "heads", None)
        if read is None:
            return None
        heads.update(read)
    return tuple(sorted(heads))


def _listeners_eager(point: HookPoint) -> tuple[HookFn, ...]:
    active = _ACTIVE.get()
    return (active.get(point) if active else None) or ()


_run_hooks, _listens, _wanted_heads = _run_hooks_eager, _listens_eager, _wanted_heads_eager
_listeners = _listeners_eager


def _guard_for_compile() -> None:
    global _run_hooks, _listens, _wanted_heads, _listeners
    if _run_hooks is _run_hooks_eager and "torch._dynamo" in sys.modules:
        _run_hooks = torch.compiler.disable(_run_hooks_eager)
        _listens = torch.compiler.disable(_listens_eager)
        _wanted_heads = torch.compiler.disable(_wanted_heads_eager)
        _listeners = torch.compiler.disable(_listeners_eager)


def reads_heads(fn: HookFn, heads: Iterable[int]) -> HookFn:
    """`fn` marked as reading only these heads of a (B, H, ...) hook point, and never editing it.

    Attention honours the mark at `hook_probs`: when every function listening there carries one, the block
    computes the probabilities of the union of those heads only and hands the hooks that (B, len(heads), Lq,
    Lk) tensor, heads in ascending order; its output then comes from the fused kernel, so a marked function
    that returns a tensor is an error. Other hook points ignore the mark (they pass every head)."""
    return marked(fn, "heads", heads)


def marked(fn: HookFn, attr: str, indices: Iterable[int]) -> HookFn:
    """`fn` wrapped and carrying `attr` = the sorted distinct `indices` (non-negative, at least one): how a hook
    declares what it reads or edits (`reads_heads`, `splice.edits_features`)."""
    chosen = tuple(sorted({int(i) for i in indices}))
    if not chosen or chosen[0] < 0:
        raise ValueError(f"{attr} must be non-negative indices, at least one, got {list(chosen)}")

    def wrapped(x: torch.Tensor, hook: HookPoint) -> torch.Tensor | None:
        return fn(x, hook)

    setattr(wrapped, attr, chosen)
    wrapped.__name__ = getattr(fn, "__name__", attr)
    return wrapped


def path_of(module: nn.Module) -> str:
    """A module's path in its model (`path_of(model.dec[1].cross_attn)` -> "dec.1.cross_attn"), read from the name
    its first hook point got from `name_hook_points`: labels of blocks and norms come from the tree, not from
    spelling it. "" for the model itself."""
    for rel, sub in module.named_modules():
        if isinstance(sub, HookPoint):
            if sub.name == "<unnamed>":
                break
            if not rel:
                return sub.name
            if sub.name == rel:
                return ""
            if not sub.name.endswith("." + rel):
                raise ValueError(f"hook point {sub.name!r} is not at {rel!r} inside its {type(module).__name__}")
            return sub.name[: -len(rel) - 1]
    raise ValueError(f"{type(module).__name__} holds no named hook point: it is not part of a named model")


def name_hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Give every HookPoint its module path as name; return them in module order."""
    points = {}
    for name, module in model.named_modules():
        if isinstance(module, HookPoint):
            module.name = name
            points[name] = module
    return points


def select_names(names: Iterable[str], spec: NameFilter) -> list[str]:
    """Names matching an exact name, a glob pattern, a list of those, or a predicate.

    A pattern or exact name that matches nothing raises KeyError with the closest names,
    so a typo never silently captures or edits nothing.
    """
    names = list(names)
    if spec is None:
        return names
    if callable(spec):
        return [n for n in names if spec(n)]
    patterns = [spec] if isinstance(spec, str) else list(spec)
    chosen: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern) if _is_glob(pattern) else [pattern] if pattern in names else []
        if not hits:
            raise KeyError(_missing(pattern, names))
        chosen.update(hits)
    return [n for n in names if n in chosen]


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _missing(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f"; closest: {close}" if close else f"; {len(names)} names exist, e.g. {names[:3]}"
    return f"no hook point matches {name!r}{hint}"


@contextlib.contextmanager
def hooks(
    points: Mapping[str, HookPoint],
    spec: Mapping[str, HookFn | Iterable[HookFn]] | Iterable[tuple[str, HookFn]],
) -> Iterator[None]:
    """Activate hooks for the duration of the block, in this thread/task only.

    `spec` maps names or glob patterns to one function or a list; contexts nest, and an inner
    context's functions run after the outer ones at the same point. Hooks are removed in
    `finally`, so an exception inside the block never leaves one behind.
    """
    global _ACTIVE_COUNT
    _guard_for_compile()
    items = spec.items() if isinstance(spec, Mapping) else spec
    merged: dict[HookPoint, tuple[HookFn, ...]] = dict(_ACTIVE.get() or {})
    for pattern, fns in items:
        fn_list = (fns,) if callable(fns) else tuple(fns)
        exact = isinstance(pattern, str) and pattern in points  # the common case: no scan of every name
        for name in (pattern,) if exact else select_names(points, pattern):
            point = points[name]
            merged[point] = merged.get(point, ()) + fn_list
    token = _ACTIVE.set(merged)
    with _COUNT_LOCK:
        _ACTIVE_COUNT += 1
    try:
        yield
    finally:
        with _COUNT_LOCK:
            _ACTIVE_COUNT -= 1
        _ACTIVE.reset(token)


def active_hook_count() -> int:
    """Hook points listening in the current context (0 outside any `hooks` block)."""
    return len(_ACTIVE.get() or {})


def in_context(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` bound to the calling context: run in another thread, it sees the hooks active here.

    The context is captured now and copied again at each call (a Context cannot be entered by two
    threads at once), so one wrapped function may run in several workers side by side.
    """
    captured = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return captured.copy().run(_run_counted, fn, args, kwargs)

    return run


def _run_counted(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    # the block that set the hooks may end while the job runs; the job holds its own count so
    # the hook points do not take the no-hook fast path under it
    global _ACTIVE_COUNT
    if not _ACTIVE.get():
        return fn(*args, **kwargs)
    with _COUNT_LOCK:
        _ACTIVE_COUNT += 1
    try:
        return fn(*args, **kwargs)
    finally:
        with _COUNT_LOCK:
            _ACTIVE_COUNT -= 1


def submit(executor: Executor, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
    """`executor.submit(fn, *args, **kwargs)`, with the hooks active here carried into the job."""
    return executor.submit(in_context(fn), *args, **kwargs)
