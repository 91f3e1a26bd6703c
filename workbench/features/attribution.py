"""From an output word back to the dictionary features that drive it: feature-level attribution of one output token.

    fa = feature_attribution(tm, dictionary, "Zwei Hunde spielen im Schnee.", "Two dogs play in the snow.", 1)
    fa.top(5)             # [{position, piece, feature, activation, attribution}], largest attribution first
    fa.by_position()      # (L,) per source position (decoder position for decoder-side sites): features + error + bias
    fa.frame()            # a pandas DataFrame of every active (position, feature)
    ablate_features(tm, dictionary, src, tgt, 1, [[(3, 17), (3, 902)]])   # the metric with those features set to 0

The dashboard goes from a feature to the words it raises; this goes the other way, for one output token of one
sentence. The site's activation is rewritten as the dictionary's reconstruction plus its error,
x = Σ_f a_f W_dec[f] + b_dec + ε (`splice_hooks(..., error=True)`: the forward pass is the clean model's), and
the metric m (log p of the token by default) is attributed to each term by input × gradient at the clean point:

    attribution(position p, feature f) = a_f(p) · (W_dec[f] · ∂m/∂x_p)
    error(p) = ε_p · ∂m/∂x_p            bias(p) = b_dec · ∂m/∂x_p

so Σ_f attribution + error + bias = x_p · ∂m/∂x_p, the input × gradient of the whole site activation at p, and
summed over p the site's (for `hook_memory`, `analysis.gradients.run_with_grads` gives the same per-position
numbers; tested). This is the plain gradient of the real model (no frozen attention or norms), so it is a
first-order estimate: removing feature f changes m by about −attribution when the model is close to linear
along a_f W_dec[f] (checked by `ablate_features` in the tests: top-attributed features against random ones).

Encoder-side sites (`hook_memory`, `enc.*`) give one row per (source position, active feature); decoder-side
sites (a cross-attention block's output, an FFN transcoder, whose site is the FFN output) one row per (decoder
position ≤ the explained one, active feature): earlier positions reach the output token through decoder
self-attention. For a transcoder the gradient is taken at the FFN's output; its features are read from the
FFN's input. A skip transcoder's linear term x @ W_skip.T is no feature: it is counted with the error.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..core.batching import decoder_input
from ..core.model import Transformer, evaluating
from ..decoding.translator import TranslationModel
from .dictionary import SparseDictionary
from .sites import Site, site_of, splice_hooks

METRICS = ("logprob", "logit")
MetricName = str | int
""""logprob" (log p of the output token), "logit", or a foil: a token id or a one-piece target word, for
logit(token) − logit(foil) (equal to log p(token) − log p(foil)).

A name, not a `core.protocols.Metric` (the function logits -> (N,) that patching and `run_with_grads` take): the
name is what a `FeatureAttribution` records and what the command line and the app pass as text; `_metric` is the
function it names, at the explained position."""


@dataclass(frozen=True)
class FeatureAttribution:
    """Attribution of one output token's metric to a dictionary's features (see the module docstring)."""

    site: str
    side: str  # "src": rows are source positions; "tgt": decoder positions
    position: int  # the output position explained (an index into the output tokens, the last being EOS)
    token: int
    piece: str  # the output token's piece ("" without a tokenizer)
    metric: str  # "logprob", "logit" or "logit - logit(FOIL)"
    value: float  # the metric at the clean point
    pieces: list[str]  # the pieces of the site's positions (source, or decoder input "<s>" + output prefix)
    positions: torch.Tensor  # (N,) int64: the site position of each row
    features: torch.Tensor  # (N,) int64
    activations: torch.Tensor  # (N,) float64: a_f at that position (> 0)
    attributions: torch.Tensor  # (N,) float64: a_f · (W_dec[f] · ∂m/∂x); rows sorted largest first
    error: torch.Tensor  # (L,) float64: ε · ∂m/∂x per site position
    bias: torch.Tensor  # (L,) float64: b_dec · ∂m/∂x per site position
    total: torch.Tensor  # (L,) float64: x · ∂m/∂x per site position (input × gradient of the site)

    def by_position(self) -> torch.Tensor:
        """(L,) features + error + bias at each site position (equals `total` up to rounding)."""
        out = self.error + self.bias
        return out.index_add(0, self.positions, self.attributions)

    def top(self, k: int = 10, *, by: str = "attribution") -> list[dict[str, Any]]:
        """The k rows with the largest attribution (`by="abs"`: the largest in size, either sign)."""
        if by not in ("attribution", "abs"):
            raise ValueError(f"by must be 'attribution' or 'abs', got {by!r}")
        order = self.attributions.abs().argsort(descending=True) if by == "abs" else torch.arange(
            self.attributions.numel())
        return [self.row(int(i)) for i in order[:k]]

    def row(self, i: int) -> dict[str, Any]:
        p = int(self.positions[i])
        return {"position": p, "piece": self.pieces[p] if p < len(self.pieces) else "",
                "feature": int(self.features[i]), "activation": float(self.activations[i]),
                "attribution": float(self.attributions[i])}

    def frame(self):
        """Every active (position, feature) as a DataFrame, largest attribution first; attrs: error, bias, total."""
        import pandas as pd  # optional: only the table needs it

        df = pd.DataFrame([self.row(i) for i in range(self.attributions.numel())],
                          columns=["position", "piece", "feature", "activation", "attribution"])
        df.attrs.update({"error": self.error.tolist(), "bias": self.bias.tolist(), "total": self.total.tolist(),
                         "metric": self.metric, "value": self.value, "token": self.piece})
        return df


# ------------------------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class _Inputs:
    model: Transformer
    src: torch.Tensor  # (1, S)
    tgt_in: torch.Tensor  # (1, T): start + output tokens
    position: int
    token: int
    foil: int | None
    metric: str
    src_pieces: list[str]
    tgt_pieces: list[str]  # decoder input pieces
    out_piece: str


def _ids(x: Any, what: str) -> list[int]:
    if isinstance(x, torch.Tensor):
        if x.dim() == 2 and x.size(0) == 1:
            x = x[0]
        if x.dim() != 1:
            raise ValueError(f"{what}: one sentence of ids, (L,) or (1, L), got shape {tuple(x.shape)}")
        return [int(i) for i in x.tolist()]
    return [int(i) for i in x]


def _prepare(tm_or_model: TranslationModel | Transformer, src: Any, tgt: Any, position: int, metric: MetricName
             ) -> _Inputs:
    tm = tm_or_model if isinstance(tm_or_model, TranslationModel) else None
    model = tm.model if tm is not None else tm_or_model
    if not isinstance(model, Transformer):
        raise ValueError(f"need a TranslationModel or a Transformer, got {type(tm_or_model).__name__}")
    cfg = model.cfg
    if isinstance(src, str):
        if tm is None:
            raise ValueError("text needs a TranslationModel (its tokenizers); give a Transformer ids")
        src_ids, _ = tm.encode_source(src)
    else:
        src_ids = _ids(src, "src")
    if not src_ids:
        raise ValueError("the source sentence is empty")
    if tgt is None:
        if tm is None:
            raise ValueError("without a TranslationModel, give the output token ids")
        text = src if isinstance(src, str) else tm.src_tokenizer.decode([i for i in src_ids if i != cfg.eos_id])
        tgt = tm.translate([text])[0]
    if isinstance(tgt, str):
        if tm is None:
            raise ValueError("text needs a TranslationModel (its tokenizers); give a Transformer ids")
        tgt_ids = tm.tgt_tokenizer.encode(tgt)
    else:
        tgt_ids = _ids(tgt, "output")
    if tgt_ids and tgt_ids[-1] == cfg.eos_id:
        tgt_ids = tgt_ids[:-1]  # the output as decoded: its EOS is the last output position anyway
    out = [*tgt_ids, cfg.eos_id]
    try:
        position = operator.index(position)
    except TypeError:
        raise ValueError(f"the output position must be an integer, got {position!r}") from None
    if not 0 <= position < len(out):
        raise ValueError(f"output position {position} is out of range: the output has {len(out)} tokens "
                         f"(0..{len(out) - 1}, the last is the end of sentence)")
    foil, name = None, metric
    if isinstance(metric, bool) or not isinstance(metric, (str, int)):
        raise ValueError(f"metric must be 'logprob', 'logit' or a foil token (id or word), got {metric!r}")
    if isinstance(metric, int):
        foil = metric
    elif metric not in METRICS:
        if tm is None:
            raise ValueError(f"metric {metric!r}: a foil word needs a TranslationModel; give its token id")
        ids = tm.tgt_tokenizer.encode(metric)
        if len(ids) != 1:
            raise ValueError(f"foil {metric!r} is {len(ids)} target pieces, not one: give a token id")
        foil = ids[0]
    if foil is not None:
        if not 0 <= foil < cfg.tgt_vocab:
            raise ValueError(f"foil token {foil} is not in the target vocabulary (0..{cfg.tgt_vocab - 1})")
        name = f"logit - logit({tm.tgt_tokenizer.pieces([foil])[0] if tm else foil})"
    src_pieces = tm.src_tokenizer.pieces(src_ids) if tm else []
    tgt_pieces = ["<s>", *tm.tgt_tokenizer.pieces(tgt_ids)] if tm else []
    piece = tm.tgt_tokenizer.pieces([out[position]])[0] if tm else ""
    dev = model.device
    tgt_in = torch.tensor([decoder_input(out, cfg.start_id)], device=dev)
    return _Inputs(model, torch.tensor([src_ids], device=dev), tgt_in, position, out[position], foil, str(name),
                   src_pieces, tgt_pieces, piece)


def _site(model: Transformer, dictionary: SparseDictionary) -> Site:
    site = site_of(dictionary)
    missing = [h for h in site.hooks if h not in model.hook_names("*")]
    if missing:
        raise ValueError(f"this dictionary reads {missing[0]}, which the model does not have: a dictionary "
                         "trained on another model")
    return site


def _metric(logits: torch.Tensor, x: _Inputs) -> torch.Tensor:
    """(B,) the metric at the explained position."""
    row = logits[:, x.position].float()
    if x.foil is not None:
        return row[:, x.token] - row[:, x.foil]
    if x.metric == "logit":
        return row[:, x.token]
    return row.log_softmax(-1)[:, x.token]


def _width_check(site: Site, dictionary: SparseDictionary):
    """A hook that checks the site's width against the dictionary's before it runs (one-line error)."""
    cfg = dictionary.cfg

    def check(t: torch.Tensor, hook) -> None:
        want = cfg.d_in if hook.name == site.hook_in else cfg.out_dim
        if t.size(-1) != want:
            raise ValueError(f"the dictionary reads {hook.name} vectors of size {want}, but this model's have "
                             f"{t.size(-1)}: a dictionary trained on another model")
    return check


# ------------------------------------------------------------------------------------------ attribution


def feature_attribution(tm_or_model: TranslationModel | Transformer, dictionary: SparseDictionary, src: Any,
                        tgt_or_output: Any, position: int, *, metric: MetricName = "logprob") -> FeatureAttribution:
    """Attribution of output token `position` to the dictionary's active features (module docstring).

    `src`: text (with a TranslationModel) or ids (EOS included as the model expects); `tgt_or_output`: the
    output text or ids (the reference, or the model's own translation; None translates), without the start token;
    `position` indexes the output tokens, EOS last. One forward and one backward pass.
    """
    x = _prepare(tm_or_model, src, tgt_or_output, position, metric)
    site = _site(x.model, dictionary)
    d, model = dictionary, x.model
    grabbed: dict[str, torch.Tensor] = {}
    zero: dict[str, torch.Tensor] = {}

    def read(t: torch.Tensor, hook) -> None:  # the dictionary's input, before the splice
        grabbed["in"] = t.detach()

    def tap(t: torch.Tensor, hook) -> torch.Tensor:  # the spliced activation (= the clean one); its gradient
        grabbed["x"] = t.detach()
        z = torch.zeros_like(t, requires_grad=True)
        zero["z"] = z
        return t + z

    out_hook = site.hook_out or site.hook_in
    hooks = [(h, _width_check(site, d)) for h in site.hooks] + [(site.hook_in, read)]
    hooks += splice_hooks(site, d, error=True) + [(out_hook, tap)]
    with evaluating(model), torch.enable_grad(), model.hooks(hooks):
        value = _metric(model(x.src, x.tgt_in), x)[0]
        (grad,) = torch.autograd.grad(value, zero["z"])
    with torch.no_grad():
        feats = d.encode(grabbed["in"][0].float()).double()  # (L, F)
        act, g = grabbed["x"][0].double(), grad[0].double()  # (L, d_out)
        if site.side == "tgt":  # positions after the explained one cannot reach it (causal decoder)
            L = x.position + 1
            feats, act, g = feats[:L], act[:L], g[:L]
        w_dec, b_dec = d.W_dec.detach().double(), d.b_dec.detach().double()
        error = ((act - feats @ w_dec - b_dec) * g).sum(-1)
        bias = g @ b_dec
        total = (act * g).sum(-1)
        pos, feat = feats.nonzero(as_tuple=True)
        a = feats[pos, feat]
        attr = a * (w_dec[feat] * g[pos]).sum(-1)
        order = attr.argsort(descending=True)
    return FeatureAttribution(site.name, site.side, x.position, x.token, x.out_piece, x.metric, float(value.detach()),
                              x.src_pieces if site.side == "src" else x.tgt_pieces[: x.position + 1],
                              pos[order].cpu(), feat[order].cpu(), a[order].cpu(), attr[order].cpu(),
                              error.cpu(), bias.cpu(), total.cpu())


@torch.no_grad()
def ablate_features(tm_or_model: TranslationModel | Transformer, dictionary: SparseDictionary, src: Any,
                    tgt_or_output: Any, position: int, groups: Sequence[Sequence[tuple[int, int]]], *,
                    metric: MetricName = "logprob") -> torch.Tensor:
    """(len(groups),) float64: the metric with each group's (site position, feature) activations set to 0.

    The dictionary is spliced in with its clean reconstruction error kept (an empty group gives the clean
    metric), so only the named features change; every group is one row of one batch.
    """
    x = _prepare(tm_or_model, src, tgt_or_output, position, metric)
    site = _site(x.model, dictionary)
    d, model = dictionary, x.model
    n = len(groups)
    if n == 0:
        return torch.zeros(0, dtype=torch.float64)
    length = x.src.size(1) if site.side == "src" else x.tgt_in.size(1)
    rows, cols, fs = [], [], []
    for r, group in enumerate(groups):
        for p, f in group:
            if not (0 <= int(p) < length and 0 <= int(f) < d.cfg.d_sae):
                raise ValueError(f"({p}, {f}) is not a (site position, feature) of this sentence: positions "
                                 f"0..{length - 1}, features 0..{d.cfg.d_sae - 1}")
            rows.append(r)
            cols.append(int(p))
            fs.append(int(f))
    stash: dict[str, torch.Tensor] = {}

    def read(t: torch.Tensor, hook) -> None:
        stash["in"] = t

    def edit(t: torch.Tensor, hook) -> torch.Tensor:
        feats = d.encode(stash.pop("in").float())  # (n, L, F)
        error = t.float() - d.decode(feats)
        feats[rows, cols, fs] = 0.0
        return (d.decode(feats) + error).to(t.dtype)

    hooks = [(h, _width_check(site, d)) for h in site.hooks] + [(site.hook_in, read),
                                                                 (site.hook_out or site.hook_in, edit)]
    with evaluating(model), model.hooks(hooks):
        logits = model(x.src.expand(n, -1), x.tgt_in.expand(n, -1))
    return _metric(logits, x).double().cpu()
