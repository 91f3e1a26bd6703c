"""Activation patching sweeps, ablations, path patching and attribution patching, batched.

    sweep = patching_sweep(model, src, tgt, corrupted_src=csrc, sites="head", metric=logit_diff(3, good, bad))
    sweep.values            # (rows, positions): metric with that site (row) at that position patched
    sweep.rows, sweep.positions, sweep.clean_metric, sweep.corrupted_metric, sweep.normalized()
    fast = attribution_patching(model, src, tgt, corrupted_src=csrc, sites="head", metric=...)  # same layout
    pp = path_patching(model, src, tgt, corrupted_src=csrc, metric=...)   # (encoder senders, decoder layers)

One sentence (src (1, S), tgt (1, T)). The clean and the corrupted run are captured once (two forwards) and
reused for every site; the patched variants then run as rows of one batch (`batch_size` per forward), each
row patching its own site. "noising" runs the clean input with one corrupted activation; "denoising" runs the
corrupted input with one clean activation. Instead of a corrupted input, `ablation="zero" | "mean" |
"resample"` patches zeros, the mean over a `reference` batch (real positions), or a reference sentence's
activation at the same position.

Site families (rows x columns):
    resid_enc / resid_dec     the stream entering layer 0 and after every layer  x  source / target position
    head_enc / head_dec_self / head_cross / head   each head's `hook_result`     x  its query position
    pattern                   each head's attention row (`hook_probs`)            x  query position
    cross_kv                  each decoder layer's cross-attention keys and values x source position
With `positions="all"` each row patches every position at once (one column).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...core.config import DecodeConfig
from ...core.heads import Head, block_path, kind_of, stack_of
from ...core.hooks import path_of
from ...core.masks import real_positions
from ...core.model import evaluating
from ...core.protocols import Metric, Progress
from ...decoding.search import decode_config, generate
from ..attribution.gradients import run_with_grads
from ..generation.generation_trace import decoding_setup, source_side

FAMILIES = ("resid_enc", "resid_dec", "head_enc", "head_dec_self", "head_cross", "head", "pattern", "cross_kv")
DIRECTIONS = ("noising", "denoising")
ABLATIONS = ("zero", "mean", "resample")
TRANSLATION_METRICS = ("bleu", "chrf")
ENCODER_SIDE = ("resid_enc", "head_enc", "cross_kv")



# -------------------------------------------------------------------------------------------- metrics


def logit_diff(position: int, token: int, baseline_token: int | None = None) -> Metric:
    """Logit of `token` at decoder position `position` (minus `baseline_token`'s)."""
    def metric(logits: torch.Tensor) -> torch.Tensor:
        row = logits[:, position].float()
        return row[:, token] - (0 if baseline_token is None else row[:, baseline_token])

    metric.__name__ = f"logit_diff({position}, {token}, {baseline_token})"
    return metric


def log_prob(targets: Sequence[int] | torch.Tensor, positions: Sequence[int] | None = None) -> Metric:
    """Summed log-probability of `targets` (T,) (e.g. the clean output, EOS included) at `positions` (all)."""
    t = torch.as_tensor(targets, dtype=torch.long).view(-1)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        if logits.size(1) != t.numel():
            raise ValueError(f"log_prob: {t.numel()} targets for logits of length {logits.size(1)}")
        lp = logits.float().log_softmax(-1).gather(-1, t.to(logits.device)[None, :, None].expand(logits.size(0), -1, 1))
        lp = lp[..., 0]
        return (lp if positions is None else lp[:, list(positions)]).sum(-1)

    metric.__name__ = "log_prob"
    return metric


# ---------------------------------------------------------------------------------------------- sites


@dataclass
class Site:
    row: int
    col: int
    edits: list[tuple[str, tuple]]  # (hook name, index into one sentence's activation)


@dataclass
class PatchingResult:
    """`values[row, col]`: the metric with that site patched (NaN where a row has no such position)."""

    values: torch.Tensor  # (rows, cols) float64
    rows: list[str]
    positions: list[int | str]
    clean_metric: float
    corrupted_metric: float
    forward_passes: int
    meta: dict[str, Any] = field(default_factory=dict)

    def normalized(self) -> torch.Tensor:
        """(value - corrupted) / (clean - corrupted): 0 = as corrupted, 1 = as clean (any direction)."""
        den = self.clean_metric - self.corrupted_metric
        if den == 0:
            raise ValueError("clean and corrupted metrics are equal; normalizing would divide by zero")
        return (self.values - self.corrupted_metric) / den

    def frame(self):
        import pandas as pd  # optional: only the tabular view needs it

        return pd.DataFrame(self.values.numpy(), index=self.rows, columns=self.positions)


def _heads_of(model, kind: str) -> list[tuple[str, Any, int, int]]:
    """(label, attention block, layer, head) of every head of a kind."""
    out = []
    for layer in range(len(getattr(model, stack_of(kind)))):
        block = model.get_submodule(block_path(kind, layer))
        for h in range(block.n_heads):
            out.append((str(Head(kind, layer, h)), block, layer, h))  # type: ignore[arg-type]
    return out


def build_sites(model, family: str, src_len: int, tgt_len: int, positions: str = "each"
                ) -> tuple[list[str], list[int | str], list[Site]]:
    """Rows, column labels and the sites of a family (see the module docstring)."""
    if family not in FAMILIES:
        raise ValueError(f"sites must be one of {FAMILIES}, got {family!r}")
    if positions not in ("each", "all"):
        raise ValueError(f"positions must be 'each' or 'all', got {positions!r}")
    rows: list[str] = []
    per_row: list[tuple[list[str], int, Callable[[int], tuple]]] = []  # hooks, length, index(pos)
    if family in ("resid_enc", "resid_dec"):
        stream = model.stream(family[-3:])
        length = src_len if stream.stack == "enc" else tgt_len
        for point in [stream.hook_embed, *(layer.hook_resid_ffn for layer in stream.layers)]:
            rows.append(point.name)
            per_row.append(([point.name], length, lambda p: (p,)))
    elif family in ("head_enc", "head_dec_self", "head_cross", "head", "pattern"):
        kinds = {"head_enc": ["enc_self"], "head_dec_self": ["dec_self"], "head_cross": ["cross"]}.get(
            family, ["enc_self", "dec_self", "cross"])
        leaf = "hook_probs" if family == "pattern" else "hook_result"
        for kind in kinds:
            length = src_len if kind == "enc_self" else tgt_len
            for label, block, _, h in _heads_of(model, kind):
                rows.append(label)
                per_row.append(([getattr(block, leaf).name], length, lambda p, h=h: (h, p)))
    else:  # cross_kv
        for layer in model.dec:
            attn = layer.cross_attn
            rows.append(_kv_label(attn))
            per_row.append(([attn.hook_k.name, attn.hook_v.name], src_len, lambda p: (slice(None), p)))
    sites: list[Site] = []
    if positions == "all":
        cols: list[int | str] = ["all"]
        for r, (names, _, index) in enumerate(per_row):
            sites.append(Site(r, 0, [(n, index(slice(None))) for n in names]))
    else:
        cols = list(range(max(length for _, length, _ in per_row)))
        for r, (names, length, index) in enumerate(per_row):
            for p in range(length):
                sites.append(Site(r, p, [(n, index(p)) for n in names]))
    return rows, cols, sites


def _kv_label(attn) -> str:
    """Row label of a cross-attention block's keys and values: "dec.1.cross_attn.kv"."""
    return f"{path_of(attn)}.kv"


# ------------------------------------------------------------------------------------------- running


def _one(ids, name: str, device) -> torch.Tensor:
    t = torch.as_tensor(ids, dtype=torch.long)
    t = t.view(1, -1) if t.dim() == 1 else t
    if t.dim() != 2 or t.size(0) != 1:
        raise ValueError(f"{name} must be one sentence, (L,) or (1, L); got shape {tuple(t.shape)}")
    return t.to(device)



def _clean_and_corrupted(model, src, tgt, corrupted_src, corrupted_tgt):
    """(src, tgt, corrupted src, corrupted tgt) as (1, L) tensors on the model's device, clean where not given."""
    dev = model.device
    src, tgt = _one(src, "src", dev), _one(tgt, "tgt", dev)
    c_src = src if corrupted_src is None else _one(corrupted_src, "corrupted_src", dev)
    c_tgt = tgt if corrupted_tgt is None else _one(corrupted_tgt, "corrupted_tgt", dev)
    if c_src.shape != src.shape or c_tgt.shape != tgt.shape:
        raise ValueError(f"corrupted inputs must match the clean lengths position for position: src "
                         f"{tuple(src.shape)} vs {tuple(c_src.shape)}, tgt {tuple(tgt.shape)} vs {tuple(c_tgt.shape)}")
    return src, tgt, c_src, c_tgt

def _donors(model, base_cache, names, ablation, reference, seed) -> dict[str, torch.Tensor]:
    if ablation == "zero":
        return {n: torch.zeros_like(base_cache[n]) for n in names}
    if reference is None:
        raise ValueError(f"ablation={ablation!r} needs reference=(sources, targets): a batch to average or sample")
    ref_src, ref_tgt = reference
    with torch.no_grad():
        _, ref = model.run_with_cache(ref_src.to(model.device), ref_tgt.to(model.device), names=names)
    pad = model.cfg.pad_id
    out = {}
    g = torch.Generator().manual_seed(seed)
    for n in names:
        acts = ref[n]  # (R, L, ...) or (R, H, L, ...); the position axis follows the head axis if any
        head_axis = acts.dim() == 4
        source = source_side(model, n)
        # decoder inputs start with the start token, which may be the padding id (Marian): lengths, not ids
        real = real_positions(ref_src if source else ref_tgt, pad, decoder=not source)  # (R, L)
        base = base_cache[n]
        length = base.size(2 if head_axis else 1)
        if ablation == "mean":
            m = real.to(acts.device, acts.dtype)
            w = m[:, None, :, None] if head_axis else m[:, :, None]
            mean = (acts * w).sum((0, 2 if head_axis else 1), keepdim=True) / w.sum((0, 2 if head_axis else 1),
                                                                                  keepdim=True)
            out[n] = mean.expand_as(base).clone()
        else:  # resample: position p from a random reference sentence long enough to have one
            donor = torch.empty_like(base)
            lengths = real.sum(1)
            for p in range(length):
                ok = (lengths > p).nonzero()[:, 0]
                if len(ok) == 0:
                    raise ValueError(f"resample: no reference sentence has position {p} "
                                     f"(longest: {int(lengths.max())})")
                r = int(ok[torch.randint(len(ok), (1,), generator=g)])
                if head_axis:
                    donor[0, :, p] = acts[r, :, p]
                else:
                    donor[0, p] = acts[r, p]
            out[n] = donor
    return out


def _patch_hook(assign: list[tuple[int, tuple]], donor: torch.Tensor):
    def hook(x: torch.Tensor, point) -> torch.Tensor:
        if donor.shape[1:] != x.shape[1:]:
            raise ValueError(f"patch at {point.name}: donor activation {tuple(donor.shape)} does not fit "
                             f"{tuple(x.shape)}; clean and corrupted inputs must have the same lengths")
        x = x.clone()
        d = donor.to(x.dtype)
        for j, idx in assign:
            x[j][idx] = d[0][idx]
        return x

    return hook


def _run_batches(model, src, tgt, sites: list[Site], donors: dict[str, torch.Tensor], metric: Metric,
                 batch_size: int, translate: Callable | None,
                 progress: Progress | None = None) -> tuple[list[float], int]:
    values: list[float] = []
    passes = 0
    for start in range(0, len(sites), batch_size):
        chunk = sites[start : start + batch_size]
        per_hook: dict[str, list[tuple[int, tuple]]] = {}
        for j, site in enumerate(chunk):
            for name, idx in site.edits:
                per_hook.setdefault(name, []).append((j, idx))
        hooks = {name: _patch_hook(assign, donors[name]) for name, assign in per_hook.items()}
        n = len(chunk)
        with torch.no_grad(), model.hooks(hooks):
            if translate is not None:
                values += translate(src.expand(n, -1))
            else:
                values += metric(model(src.expand(n, -1), tgt.expand(n, -1))).double().cpu().tolist()
        passes += 1
        if progress is not None:
            progress(len(values), len(sites))
    return values, passes


def _translation_metric(model, name: str, detokenize, reference: str, search: DecodeConfig):
    import sacrebleu  # optional: only translation metrics need it

    scorer = sacrebleu.sentence_bleu if name == "bleu" else sacrebleu.sentence_chrf

    def translate(src: torch.Tensor) -> list[float]:
        gen = generate(model, src, search)
        return [float(scorer(detokenize(h.tokens), [reference]).score) for h in gen.best]

    return translate


def patching_sweep(model, src, tgt, *, corrupted_src=None, corrupted_tgt=None, sites: str = "head",
                   metric: Metric | str, direction: str = "noising", ablation: str | None = None,
                   reference: tuple[torch.Tensor, torch.Tensor] | None = None, positions: str = "each",
                   batch_size: int = 64, detokenize: Callable[[list[int]], str] | None = None,
                   reference_text: str | None = None, seed: int = 0,
                   progress: Progress | None = None, **decode_options: Any) -> PatchingResult:
    """Patch one site at a time (each a row of a batch) and measure `metric` (see the module docstring).
    `progress(done, total)`, if given, is called with the number of sites patched after each batch.

    `metric`: a function logits (N, T, V) -> (N,) (`logit_diff`, `log_prob`), or "bleu" / "chrf" of the
    re-decoded translation against `reference_text` (needs `detokenize`; encoder-side sites only, as decoder
    positions shift when the output changes). `model` may be a `TranslationModel`: re-decoding then follows its
    settings; `config=` (a DecodeConfig) and `decode_options` set them on a bare model (default: greedy)."""
    model, config = decoding_setup(model, decode_options.pop("config", None))
    _check_sweep(sites, direction, ablation, corrupted_src, corrupted_tgt, batch_size)
    src, tgt, c_src, c_tgt = _clean_and_corrupted(model, src, tgt, corrupted_src, corrupted_tgt)
    translate = None
    if isinstance(metric, str):
        translate = _string_metric(model, metric, sites, detokenize, reference_text, config, decode_options)
    rows, cols, site_list = build_sites(model, sites, src.size(1), tgt.size(1), positions)
    names = sorted({n for s in site_list for n, _ in s.edits})
    with evaluating(model):
        with torch.no_grad():
            clean_logits, clean = model.run_with_cache(src, tgt, names=names)
            if ablation is None:
                corr_logits, corrupted = model.run_with_cache(c_src, c_tgt, names=names)
                passes = 2
            else:
                donors = _donors(model, clean, names, ablation, reference, seed)
                with model.hooks({n: (lambda x, h, d=donors[n]: d.expand_as(x).to(x.dtype)) for n in names}):
                    corr_logits = model(src, tgt)
                passes = 2 + (ablation != "zero")
            if translate is not None:
                clean_m = translate(src)[0]
                corr_m = translate(c_src)[0] if ablation is None else float("nan")
            else:
                clean_m, corr_m = (float(metric(x)[0]) for x in (clean_logits, corr_logits))
            if direction == "noising":
                base_src, base_tgt = src, tgt
                donors = {n: corrupted[n] for n in names} if ablation is None else donors
            else:
                base_src, base_tgt, donors = c_src, c_tgt, {n: clean[n] for n in names}
            vals, n_pass = _run_batches(model, base_src, base_tgt, site_list, donors, metric, batch_size, translate,
                                        progress)
    values = torch.full((len(rows), len(cols)), float("nan"), dtype=torch.float64)
    for site, v in zip(site_list, vals):
        values[site.row, site.col] = v
    return PatchingResult(values, rows, cols, clean_m, corr_m, passes + n_pass,
                          {"sites": sites, "direction": direction, "ablation": ablation,
                           "metric": getattr(metric, "__name__", str(metric))})


def _check_sweep(sites: str, direction: str, ablation: str | None, corrupted_src, corrupted_tgt, batch_size: int
                 ) -> None:
    """`patching_sweep`'s refusals: options that contradict each other or name nothing."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if ablation is not None and ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS} or None, got {ablation!r}")
    if ablation is not None and (corrupted_src is not None or corrupted_tgt is not None or direction != "noising"):
        raise ValueError("ablation replaces the corrupted input: give no corrupted_src/corrupted_tgt and keep "
                         "direction='noising'")
    if ablation is None and corrupted_src is None and corrupted_tgt is None:
        raise ValueError("give corrupted_src and/or corrupted_tgt, or an ablation")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if ablation in ("mean", "resample") and sites == "pattern":
        raise ValueError("mean/resample ablation of attention patterns is undefined across source lengths; "
                         "use ablation='zero' or a corrupted input")


def _string_metric(model, metric: str, sites: str, detokenize, reference_text, config, decode_options: dict):
    """A translation metric named by text ("bleu", "chrf"): the function of a source that re-decodes and scores."""
    if metric not in TRANSLATION_METRICS:
        raise ValueError(f"metric must be a function or one of {TRANSLATION_METRICS}, got {metric!r}")
    if sites not in ENCODER_SIDE:
        raise ValueError(f"metric={metric!r} re-decodes the translation; it supports the encoder-side sites "
                         f"{ENCODER_SIDE}, not {sites!r}")
    if detokenize is None or reference_text is None:
        raise ValueError(f"metric={metric!r} needs detokenize= and reference_text=")
    search = decode_config(config or DecodeConfig(beam=1), decode_options)
    return _translation_metric(model, metric, detokenize, reference_text, search)


def attribution_patching(model, src, tgt, *, corrupted_src=None, corrupted_tgt=None, sites: str = "head",
                         metric: Metric, direction: str = "noising", positions: str = "each") -> PatchingResult:
    """Attribution patching (Nanda 2023; Syed et al. 2023): the first-order estimate of `patching_sweep`,
    metric(base) + grad · (donor - base) at each site, from one forward + backward on the base input and one
    forward on the donor. Same layout as `patching_sweep`; its agreement is measured in docs/analysis.md."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if corrupted_src is None and corrupted_tgt is None:
        raise ValueError("give corrupted_src and/or corrupted_tgt")
    if not callable(metric):
        raise ValueError("attribution patching needs a differentiable metric function (logit_diff, log_prob)")
    src, tgt, c_src, c_tgt = _clean_and_corrupted(model, src, tgt, corrupted_src, corrupted_tgt)
    rows, cols, site_list = build_sites(model, sites, src.size(1), tgt.size(1), positions)
    names = sorted({n for s in site_list for n, _ in s.edits})
    (b_src, b_tgt), (d_src, d_tgt) = ((src, tgt), (c_src, c_tgt)) if direction == "noising" else \
        ((c_src, c_tgt), (src, tgt))
    value, acts, grads = run_with_grads(model, b_src, b_tgt, lambda logits: metric(logits)[0], names)
    with evaluating(model):
        with torch.no_grad():
            d_logits, donor = model.run_with_cache(d_src, d_tgt, names=names)
    base_m, donor_m = float(value), float(metric(d_logits)[0])
    clean_m, corr_m = (base_m, donor_m) if direction == "noising" else (donor_m, base_m)
    # grad . (donor - base) summed over the dims a site does not index, once per hook; then each site is a lookup
    reduced: dict[tuple[str, int], np.ndarray] = {}
    for site in site_list:
        for name, idx in site.edits:
            if (name, len(idx)) not in reduced:
                prod = grads[name][0].double() * (donor[name][0] - acts[name][0]).double()
                reduced[name, len(idx)] = prod.sum(tuple(range(len(idx), prod.dim()))).cpu().numpy()
    # each site is base + the sum of its lookups; integer lookups are gathered per hook in one indexing op
    total = np.full(len(site_list), base_m)
    gathers: dict[tuple[str, int], tuple[list[int], list[tuple]]] = {}
    for i, site in enumerate(site_list):
        for name, idx in site.edits:
            if all(isinstance(j, int) for j in idx):
                at, where = gathers.setdefault((name, len(idx)), ([], []))
                at.append(i)
                where.append(idx)
            else:  # a slice (all positions at once): summed here
                total[i] += float(reduced[name, len(idx)][idx].sum())
    for key, (at, where) in gathers.items():
        np.add.at(total, at, reduced[key][tuple(np.array(where).T)])
    values = torch.full((len(rows), len(cols)), float("nan"), dtype=torch.float64)
    values[[s.row for s in site_list], [s.col for s in site_list]] = torch.from_numpy(total)
    return PatchingResult(values, rows, cols, clean_m, corr_m, 2,
                          {"sites": sites, "direction": direction, "estimate": "attribution",
                           "backward_passes": 1})


SENDERS = ("encoder", "decoder", "all")
RECEIVERS = ("cross_kv", "cross_q", "self_q")


def _senders(model, which: str, embeddings: bool) -> list[tuple[str, str, int | None]]:
    """(label, hook name, head or None) of every sender: heads (`hook_result`), FFNs, token embeddings."""
    out: list[tuple[str, str, int | None]] = []
    for stack in ("enc", "dec") if which == "all" else (which[:3],):
        stream = model.stream(stack)
        if embeddings:
            out.append((stream.hook_tok.name, stream.hook_tok.name, None))
        for i, sub in stream.sublayers():
            if sub.is_attention:
                kind = kind_of(sub.block.hook_result.name)
                out += [(str(Head(kind, i, h)), sub.block.hook_result.name, h) for h in range(sub.block.n_heads)]
            else:
                out.append((path_of(sub.block), sub.block.hook_out.name, None))
    return out


def _receivers(model, which: str) -> list[tuple[str, list[str]]]:
    """(label, hook names patched together) per receiver."""
    if which == "cross_kv":
        return [(_kv_label(layer.cross_attn), [layer.cross_attn.hook_k.name, layer.cross_attn.hook_v.name])
                for layer in model.dec]
    block = "cross_attn" if which == "cross_q" else "self_attn"
    return [(getattr(layer, block).hook_q.name, [getattr(layer, block).hook_q.name]) for layer in model.dec]


def path_patching(model, src, tgt, *, corrupted_src, metric: Metric, batch_size: int = 64, senders: str = "encoder",
                  receivers: str = "cross_kv", embeddings: bool = False) -> PatchingResult:
    """Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): from sender components to receivers, along
    the residual stream only.

    Senders (`senders`): every head (`hook_result`) and FFN of the encoder, the decoder or both; with
    `embeddings=True` also each stack's token embedding (`hook_src_tok` / `hook_tgt_tok`). Receivers
    (`receivers`): each decoder layer's cross-attention keys and values ("cross_kv", read from the memory),
    cross-attention queries ("cross_q") or self-attention queries ("self_q"). For each sender the model runs on
    the clean input with that sender's output taken from the corrupted run and every other component (of both
    stacks) frozen at its clean output, so the change reaches a receiver only along the residual stream (norms
    still rescale it). Each receiver's recomputed input is patched, alone, into a clean run; values[sender,
    receiver] is the metric. A path that cannot exist (a decoder sender to the memory's keys, an encoder sender
    to a query: every cross-attention output is frozen) gives the clean metric.
    Forwards: 2 + senders/batch + senders x receivers/batch."""
    if senders not in SENDERS:
        raise ValueError(f"senders must be one of {SENDERS}, got {senders!r}")
    if receivers not in RECEIVERS:
        raise ValueError(f"receivers must be one of {RECEIVERS}, got {receivers!r}")
    dev = model.device
    src, tgt = _one(src, "src", dev), _one(tgt, "tgt", dev)
    c_src = _one(corrupted_src, "corrupted_src", dev)
    if c_src.shape != src.shape:
        raise ValueError(f"corrupted_src must have the clean source's length: {tuple(src.shape)} vs "
                         f"{tuple(c_src.shape)}")
    sender_list = _senders(model, senders, embeddings)
    frozen = sorted({n for _, n, _ in _senders(model, "all", False)})  # every component, both stacks
    moved = sorted({n for _, n, _ in sender_list} | set(frozen))
    recv = _receivers(model, receivers)
    recv_names = [n for _, names in recv for n in names]
    with evaluating(model):
        with torch.no_grad():
            clean_logits, clean = model.run_with_cache(src, tgt, names=moved)
            corr_logits, corr = model.run_with_cache(c_src, tgt, names=moved)
            values_in, n_first = _receiver_inputs(model, src, tgt, sender_list, moved, clean, corr, recv_names,
                                                  batch_size)
            vals, n_second = _patch_receivers(model, src, tgt, len(sender_list), recv, values_in, metric, batch_size)
            passes = 2 + n_first + n_second
    values = torch.tensor(vals, dtype=torch.float64).view(len(sender_list), len(recv))
    return PatchingResult(values, [s for s, _, _ in sender_list], [label for label, _ in recv],
                          float(metric(clean_logits)[0]), float(metric(corr_logits)[0]), passes,
                          {"sites": f"path:{senders}->{receivers}", "embeddings": embeddings})


def _receiver_inputs(model, src, tgt, sender_list: list, moved: list[str], clean, corr, recv_names: list[str],
                     batch_size: int) -> tuple[dict[str, torch.Tensor], int]:
    """`path_patching`'s first half: each receiver's input recomputed with one sender corrupted and every other
    component frozen clean ({receiver hook: (senders, ...)}), and the forwards it took."""
    passes = 0
    new_inputs: dict[str, list[torch.Tensor]] = {n: [] for n in recv_names}
    for start in range(0, len(sender_list), batch_size):
        chunk = sender_list[start : start + batch_size]
        n = len(chunk)

        def freeze(x, hook, chunk=chunk):
            out = clean[hook.name].expand_as(x).clone()
            for j, (_, name, h) in enumerate(chunk):
                if name == hook.name:
                    if h is None:
                        out[j] = corr[name][0]
                    else:
                        out[j, h] = corr[name][0, h]
            return out

        with model.capture(recv_names) as store, model.hooks({n_: freeze for n_ in moved}):
            model(src.expand(n, -1), tgt.expand(n, -1))
        passes += 1
        for name in recv_names:
            new_inputs[name].append(store[name][-1])
    return {n: torch.cat(v) for n, v in new_inputs.items()}, passes  # (senders, ...)


def _patch_receivers(model, src, tgt, n_senders: int, recv: list, values_in: dict[str, torch.Tensor], metric: Metric,
                     batch_size: int) -> tuple[list[float], int]:
    """`path_patching`'s second half: the metric with each (sender, receiver) input patched alone into a clean run,
    sender-major, and the forwards it took."""
    passes = 0
    recv_names = [n for _, names in recv for n in names]
    jobs = [(s, r) for s in range(n_senders) for r in range(len(recv))]
    vals: list[float] = []
    for start in range(0, len(jobs), batch_size):
        chunk = jobs[start : start + batch_size]

        def put(x, hook, chunk=chunk):
            out = x.clone()
            for j, (s, r) in enumerate(chunk):
                if hook.name in recv[r][1]:
                    out[j] = values_in[hook.name][s]
            return out

        with model.hooks({n_: put for n_ in recv_names}):
            logits = model(src.expand(len(chunk), -1), tgt.expand(len(chunk), -1))
        vals += metric(logits).double().cpu().tolist()
        passes += 1
    return vals, passes


# ------------------------------------------------------------------------------------- many sentences


def sequence_log_prob(targets: torch.Tensor, lengths: torch.Tensor | Sequence[int] | None = None) -> Metric:
    """Per sentence of a padded batch: summed log-probability of its own `targets` (B, T) over its first
    `lengths[b]` positions (all: None). The batched `log_prob`."""
    t = torch.as_tensor(targets, dtype=torch.long)
    if t.dim() != 2:
        raise ValueError(f"targets must be (B, T), got shape {tuple(t.shape)}")
    n = torch.full((t.size(0),), t.size(1)) if lengths is None else torch.as_tensor(lengths).view(-1)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[:2] != t.shape:
            raise ValueError(f"sequence_log_prob: targets {tuple(t.shape)} for logits {tuple(logits.shape)}")
        lp = logits.float().log_softmax(-1).gather(-1, t.to(logits.device)[..., None])[..., 0]
        keep = torch.arange(t.size(1), device=logits.device)[None] < n.to(logits.device)[:, None]
        return (lp * keep).sum(-1)

    metric.__name__ = "sequence_log_prob"
    return metric


@dataclass
class BatchPatchingResult:
    """`values[b, row, col]`: sentence b's metric with that site patched (NaN on its padding)."""

    values: torch.Tensor  # (B, rows, cols) float64
    rows: list[str]
    positions: list[int | str]
    clean_metric: torch.Tensor  # (B,)
    corrupted_metric: torch.Tensor  # (B,)
    meta: dict[str, Any] = field(default_factory=dict)

    def sentence(self, b: int) -> PatchingResult:
        """Sentence b as a one-sentence `PatchingResult` (columns up to the batch's longest)."""
        return PatchingResult(self.values[b], self.rows, self.positions, float(self.clean_metric[b]),
                              float(self.corrupted_metric[b]), 2, dict(self.meta))


def batch_attribution_patching(model, src: torch.Tensor, tgt: torch.Tensor, *, corrupted_src=None,
                               corrupted_tgt=None, sites: str = "head", metric: Metric, direction: str = "noising",
                               positions: str = "each") -> BatchPatchingResult:
    """`attribution_patching` for a padded batch of sentences in one forward + backward and one donor forward:
    src (B, S), tgt (B, T) (e.g. `tm.encode_batch`'s), corrupted inputs of the same shapes, `metric` logits
    (B, T, V) -> (B,) per sentence (`sequence_log_prob`, `logit_diff`). Sentences do not interact in a batch, so
    each row's gradient is its own; sites on a sentence's padding are NaN."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if corrupted_src is None and corrupted_tgt is None:
        raise ValueError("give corrupted_src and/or corrupted_tgt")
    dev = model.device
    src, tgt = torch.as_tensor(src).to(dev), torch.as_tensor(tgt).to(dev)
    c_src = src if corrupted_src is None else torch.as_tensor(corrupted_src).to(dev)
    c_tgt = tgt if corrupted_tgt is None else torch.as_tensor(corrupted_tgt).to(dev)
    if src.dim() != 2 or tgt.dim() != 2 or c_src.shape != src.shape or c_tgt.shape != tgt.shape:
        raise ValueError(f"need src (B, S), tgt (B, T) and corrupted inputs of the same shapes; got "
                         f"{tuple(src.shape)}, {tuple(tgt.shape)}, {tuple(c_src.shape)}, {tuple(c_tgt.shape)}")
    rows, cols, site_list = build_sites(model, sites, src.size(1), tgt.size(1), positions)
    names = sorted({n for s in site_list for n, _ in s.edits})
    (b_src, b_tgt), (d_src, d_tgt) = ((src, tgt), (c_src, c_tgt)) if direction == "noising" else \
        ((c_src, c_tgt), (src, tgt))
    per_row: dict[str, torch.Tensor] = {}

    def total(logits: torch.Tensor) -> torch.Tensor:
        per_row["m"] = metric(logits)
        return per_row["m"].sum()

    _, acts, grads = run_with_grads(model, b_src, b_tgt, total, names)
    base_m = per_row["m"].detach().double().cpu()
    with evaluating(model), torch.no_grad():
        d_logits, donor = model.run_with_cache(d_src, d_tgt, names=names)
    donor_m = metric(d_logits).double().cpu()
    values = torch.full((src.size(0), len(rows), len(cols)), float("nan"), dtype=torch.float64)
    reduced: dict[tuple[str, int], torch.Tensor] = {}
    for site in site_list:
        total_b = base_m.clone()
        for name, idx in site.edits:
            if (name, len(idx)) not in reduced:
                prod = grads[name].double() * (donor[name] - acts[name]).double()  # (B, ...)
                reduced[name, len(idx)] = prod.sum(tuple(range(len(idx) + 1, prod.dim()))).cpu()
            total_b += reduced[name, len(idx)][(slice(None), *idx)].reshape(src.size(0), -1).sum(-1)
        values[:, site.row, site.col] = total_b
    # padding: a source-side column past a sentence's source, a decoder-side one past its decoder input
    if positions == "each":
        src_real = real_positions(src, model.cfg.pad_id, decoder=False).cpu()
        tgt_real = real_positions(tgt, model.cfg.pad_id, decoder=True).cpu()
        for r in range(len(rows)):
            name = next(s.edits[0][0] for s in site_list if s.row == r)
            real = src_real if source_side(model, name) else tgt_real
            width = real.size(1)
            values[:, r, :width] = values[:, r, :width].masked_fill(~real, float("nan"))
    clean_m, corr_m = (base_m, donor_m) if direction == "noising" else (donor_m, base_m)
    return BatchPatchingResult(values, rows, cols, clean_m, corr_m,
                               {"sites": sites, "direction": direction, "estimate": "attribution", "batch": True})

