"""An alignment layer on top of a frozen model, trained on the model's own symmetrized alignments (Garg et al.
2019, "Jointly Learning to Align and Translate with Transformer Models"; Chen et al. 2020's Shift-AET).

    layer = AlignmentLayer(model.cfg.d_model, source_layer=2)
    train_alignment_layer(layer, model, sources, targets, teacher_links, directory="runs/align_layer")
    maps = alignment_maps(model, src, tgt, method="layer", shift="awi", layer=layer)   # word_align, as any method
    save_alignment_layer(layer, "checkpoints/general-en-de")   # alignment_layer.safetensors + its JSON config

The model is not trained: it runs teacher-forced on [start, y_1 .. y_n] and the layer reads two of its
activations, the encoder output (`hook_memory`: keys) and the decoder stream after `source_layer` layers
(queries). Decoder position t has read y_1 .. y_t only; Garg et al. give the alignment layer the whole target,
so one bidirectional self-attention block (no causal mask) runs over the decoder positions first. Then ONE
attention head, softmax over the source pieces and EOS, gives (T + 1, S + 1) probabilities per sentence: row t
is read as decoder position t, so the "awi" shift (the row that reads y_t) picks the rows for y_1 .. y_n, and
`word_align.to_words` turns them into word maps exactly as it does attention (source pieces summed, target
pieces averaged).

Training target (Garg et al. eq. 5): for each target piece, the uniform distribution over the pieces of the
source words its word is linked to by the teacher (the model's own symmetrized attention alignments); a piece
whose word has no link does not count. Loss: cross-entropy of the layer's row against that distribution.
Training writes `state.safetensors` + `state.json` (weights, optimiser, step, data order) every
`save_every` steps into `directory` and resumes from them.

Extraction (`AlignmentLayer.extraction`, stored in the layer's JSON; none: the defaults below): "prior" [layer,
head, power] multiplies the layer's piece probabilities by that cross-attention head's value-weighted norms
(Kobayashi et al. 2020; each row scaled to sum to 1) to the given power, a product of two aligners' probabilities
before the argmax; "target_pieces" "mean" (default) or "max" turns a target word's pieces into its row;
"normalize_rows" false takes the argmax both ways on the word map as it is, where true (default) first scales each
target word's row to sum to 1 (`word_align.WordMaps.combined`).

Partners (`AlignmentLayer.partners`, stored in the same files): other trained layers read with this one as one
aligner, their probabilities combined by geometric mean (each piece's score the exp of the members' mean log
probability) before the prior; the extraction is the first layer's. A layer with partners is read, not trained.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ...core.batching import corpus_batches
from ...core.model import evaluating
from ..attention.norms import value_norms
from .alignment import Link

LAYER_FILE = "alignment_layer.safetensors"
LAYER_CONFIG = "alignment_layer.json"
EXTRACTION_KEYS = ("prior", "target_pieces", "normalize_rows")


def check_extraction(extraction: dict | None) -> dict:
    """A valid extraction dict (see the module docstring; {} = the defaults), or a ValueError naming the problem."""
    e = dict(extraction or {})
    unknown = set(e) - set(EXTRACTION_KEYS)
    if unknown:
        raise ValueError(f"unknown extraction keys {sorted(unknown)}; known: {EXTRACTION_KEYS}")
    if "prior" in e:
        prior = e["prior"]
        if prior is None:
            del e["prior"]
        elif not (isinstance(prior, (list, tuple)) and len(prior) == 3 and float(prior[2]) >= 0):
            raise ValueError(f"extraction prior is [layer, head, power >= 0], got {prior!r}")
        else:
            e["prior"] = [int(prior[0]), int(prior[1]), float(prior[2])]
    if e.get("target_pieces", "mean") not in ("mean", "max"):
        raise ValueError(f"extraction target_pieces is 'mean' or 'max', got {e['target_pieces']!r}")
    if not isinstance(e.get("normalize_rows", True), bool):
        raise ValueError(f"extraction normalize_rows is true or false, got {e['normalize_rows']!r}")
    return e


class AlignmentLayer(nn.Module):
    """Bidirectional self-attention over the frozen decoder stream, then one attention head onto the encoder
    output. `forward` returns probabilities (B, T, S): row t over the source positions (EOS included)."""

    def __init__(self, d_model: int, *, source_layer: int, n_heads: int = 4, d_ff: int | None = None,
                 dropout: float = 0.1, both_ways: bool = False, extraction: dict | None = None,
                 partners: Sequence[AlignmentLayer] = ()) -> None:
        super().__init__()
        self.extraction = check_extraction(extraction)  # how maps become links (module docstring); not trained
        self.d_model, self.source_layer, self.n_heads = d_model, source_layer, n_heads
        self.d_ff = d_ff or 2 * d_model
        self.dropout = dropout
        self.both_ways = both_ways
        self.context = nn.TransformerEncoderLayer(d_model, n_heads, self.d_ff, dropout, batch_first=True,
                                                  norm_first=True)
        self.norm_q = nn.LayerNorm(d_model)
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.partners = nn.ModuleList()  # read with this layer by geometric mean (module docstring)
        self.join(partners)

    def join(self, partners: Sequence[AlignmentLayer]) -> AlignmentLayer:
        """Read `partners` (trained single layers of this width) with this one from now on; returns self."""
        for partner in partners:
            if partner is self or partner.partners or partner.d_model != self.d_model:
                raise ValueError("a partner is another single layer of the same width")
            self.partners.append(partner)
        return self

    def check_fits(self, model) -> AlignmentLayer:
        """A one-line error unless this layer (and each partner) reads a stream this model has: its width, and a
        decoder stream after 0 .. len(model.dec) layers. Returns self."""
        for member in (self, *self.partners):
            if member.d_model != model.cfg.d_model:
                raise ValueError(f"the alignment layer is {member.d_model} wide, the model {model.cfg.d_model}: it "
                                 "was trained on another model")
            if not 0 <= member.source_layer <= len(model.dec):
                raise ValueError(f"the alignment layer reads the decoder stream after {member.source_layer} layers; "
                                 f"the model has {len(model.dec)}")
        return self

    def config(self) -> dict:
        cfg = {"d_model": self.d_model, "source_layer": self.source_layer, "n_heads": self.n_heads,
               "d_ff": self.d_ff, "dropout": self.dropout, "both_ways": self.both_ways}
        if self.partners:
            cfg["partners"] = [p.config() for p in self.partners]
        return {**cfg, "extraction": dict(self.extraction)} if self.extraction else cfg

    def logits(self, states: torch.Tensor, memory: torch.Tensor, tgt_pad: torch.Tensor) -> torch.Tensor:
        """(B, T, S) scores q·k/√d. `states` (B, T, D) the decoder stream, `memory` (B, S, D) the encoder output;
        `tgt_pad` (B, T) True at padding."""
        x = self.context(states, src_key_padding_mask=tgt_pad)
        return self.query(self.norm_q(x)) @ self.key(memory).transpose(1, 2) / math.sqrt(self.d_model)

    def scores(self, states, memory, tgt_pad, src_pad) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities both ways: rows (B, T, S) over the source positions (EOS included), columns (B, T, S)
        over the target positions that read a word (1 .. n: the start position 0 and padding excluded)."""
        z = self.logits(states, memory, tgt_pad)
        rows = z.masked_fill(src_pad[:, None, :], float("-inf")).log_softmax(-1)
        no_word = tgt_pad.clone()
        no_word[:, 0] = True
        cols = z.masked_fill(no_word[:, :, None], float("-inf")).log_softmax(-2)
        return rows, cols

    def forward(self, states, memory, tgt_pad, src_pad) -> torch.Tensor:
        """Alignment scores (B, T, S): the row probabilities, or with `both_ways` their product with the column
        probabilities (a link must be likely both from its target and from its source position)."""
        rows, cols = self.scores(states, memory, tgt_pad, src_pad)
        if not self.both_ways:
            return rows.exp()
        return (rows + cols).exp().masked_fill(~torch.isfinite(rows + cols), 0.0)


def hooks_for_layer(model, layer: AlignmentLayer) -> list[str]:
    """The trace entries the layer reads: the encoder output and the decoder stream it takes queries from (and
    the prior head's block, probabilities and values, when its extraction has a prior)."""
    names = [model.hook_memory.name, *dict.fromkeys(model.stream("dec").resid(x.source_layer).name
                                                    for x in (layer, *layer.partners))]
    if "prior" in layer.extraction:
        attn = model.dec[layer.extraction["prior"][0]].cross_attn
        names += [attn.hook_probs.name, attn.hook_v.name]
    return names


def layer_maps(model, layer: AlignmentLayer, trace) -> torch.Tensor:
    """(1, B, T, S) probabilities from a teacher-forced trace holding `hooks_for_layer` (a 'layer' of one)."""
    memory = trace[model.hook_memory.name]
    src_pad = (trace.src == model.cfg.pad_id).to(memory.device)
    tgt_pad = _tgt_pad(trace.tgt, model.cfg).to(memory.device)
    members = (layer, *layer.partners)
    with evaluating(layer), torch.no_grad():
        probs = [x(trace[model.stream("dec").resid(x.source_layer).name].to(memory.dtype), memory, tgt_pad,
                   src_pad).float() for x in members]
    p = probs[0] if len(probs) == 1 else torch.stack(probs).log().mean(0).exp()
    if "prior" in layer.extraction:
        block, head, power = layer.extraction["prior"]
        prior = value_norms(model, trace, "cross", block).per_head[:, head].float().to(p.device)  # (B, T, S)
        p = p * (prior / prior.sum(-1, keepdim=True).clamp_min(1e-30)) ** power
    return p[None]


def _tgt_pad(tgt: torch.Tensor, cfg) -> torch.Tensor:
    """Padding of teacher-forced decoder inputs [start, y ...]: position 0 is always real (a decoder start may
    be the padding id), later padding ids are padding."""
    pad = tgt == cfg.pad_id
    pad[:, 0] = False
    return pad


# ------------------------------------------------------------------------------------------------ storage


def save_alignment_layer(layer: AlignmentLayer, directory: str | Path, provenance: dict | None = None) -> Path:
    """Write `alignment_layer.safetensors` and `alignment_layer.json` (its shape and provenance) into a
    checkpoint directory; the checkpoint's other files are untouched."""
    d = Path(directory)
    tensors = {k: v.detach().cpu().contiguous() for k, v in layer.state_dict().items()}
    save_file(tensors, str(d / LAYER_FILE))
    (d / LAYER_CONFIG).write_text(json.dumps({**layer.config(), "provenance": provenance or {}}, indent=2) + "\n",
                                  encoding="utf-8")
    return d / LAYER_FILE


def layer_from_config(cfg: dict) -> AlignmentLayer:
    """A fresh layer of the shape (and extraction) a stored `config()` gives."""
    partners = cfg.get("partners", [])
    if not isinstance(partners, list) or not all(isinstance(x, dict) and "partners" not in x for x in partners):
        raise ValueError("an alignment layer's partners are a list of single layers' configs")
    return AlignmentLayer(int(cfg["d_model"]), source_layer=int(cfg["source_layer"]), n_heads=int(cfg["n_heads"]),
                          d_ff=int(cfg["d_ff"]), dropout=float(cfg.get("dropout", 0.1)),
                          both_ways=bool(cfg.get("both_ways", False)), extraction=cfg.get("extraction"),
                          partners=[layer_from_config(p) for p in partners])


def load_alignment_layer(directory: str | Path, device: str | torch.device = "cpu") -> AlignmentLayer:
    """The alignment layer stored beside a checkpoint (`save_alignment_layer`); safetensors only, no pickle."""
    d = Path(directory)
    if not (d / LAYER_FILE).exists() or not (d / LAYER_CONFIG).exists():
        raise FileNotFoundError(f"{d} has no trained alignment layer ({LAYER_FILE} + {LAYER_CONFIG}); train one "
                                f"with scripts/train_alignment_layer.py")
    try:
        cfg = json.loads((d / LAYER_CONFIG).read_text(encoding="utf-8"))
        layer = layer_from_config(cfg)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{d / LAYER_CONFIG} is not a stored alignment layer's config: "
                         f"{exc if isinstance(exc, ValueError) else repr(exc)}") from None
    try:
        state = load_file(str(d / LAYER_FILE))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{d / LAYER_FILE} is not a readable safetensors file ({exc})") from None
    missing, extra = set(layer.state_dict()) - set(state), set(state) - set(layer.state_dict())
    if missing or extra:
        raise ValueError(f"{d / LAYER_FILE}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    try:
        layer.load_state_dict(state)
    except RuntimeError as exc:  # a tensor of another shape than its config says
        raise ValueError(f"{d / LAYER_FILE} does not match {LAYER_CONFIG}: {str(exc).splitlines()[-1].strip()}") \
            from None
    return layer.to(device).eval()


def load_run_layer(directory: str | Path, device: str | torch.device = "cpu") -> AlignmentLayer:
    """The layer saved by `train_alignment_layer` in a run directory (state.json + state.safetensors)."""
    d = Path(directory)
    cfg = json.loads((d / "state.json").read_text(encoding="utf-8"))["config"]
    layer = layer_from_config(cfg)
    state = load_file(str(d / "state.safetensors"))
    layer.load_state_dict({k[len("layer."):]: v for k, v in state.items() if k.startswith("layer.")})
    return layer.to(device).eval()


def load_any_layer(directory: str | Path, device: str | torch.device = "cpu") -> AlignmentLayer:
    """A layer from a training run directory (state.json + state.safetensors, `load_run_layer`) or from a
    checkpoint directory (alignment_layer.*, `load_alignment_layer`): a teacher or a starting point for training."""
    d = Path(directory)
    return load_run_layer(d, device) if (d / "state.json").exists() else load_alignment_layer(d, device)


# ------------------------------------------------------------------------------------------------ training


def piece_targets(src, tgt, links: set[Link]) -> np.ndarray:
    """(n target pieces, n source pieces + 1) training distribution: each target piece's row spreads evenly over
    the pieces of the source words its word is linked to; rows of unlinked words are all zero (not trained).
    `src`, `tgt`: `word_align.Words`; links (source word, target word)."""
    out = np.zeros((len(tgt.ids), len(src.ids) + 1), dtype=np.float32)
    src_pieces: dict[int, list[int]] = {}
    for p, w in enumerate(src.word_of):
        src_pieces.setdefault(w, []).append(p)
    by_tgt: dict[int, list[int]] = {}
    for s, t in links:
        by_tgt.setdefault(t, []).extend(src_pieces.get(s, []))
    for p, w in enumerate(tgt.word_of):
        cols = by_tgt.get(w)
        if cols:
            out[p, cols] = 1.0 / len(cols)
    return out


def cache_inputs(model, layer: AlignmentLayer, sources: Sequence, targets: Sequence, *, batch_size: int = 64,
                 log=print) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The frozen model's (decoder stream (n + 1, D), encoder output (m + 1, D)) per pair, float16 on the CPU:
    run once, so training steps cost the layer alone."""
    cfg = model.cfg
    names = hooks_for_layer(model, layer)
    out: list = [None] * len(sources)
    batches = corpus_batches([s.ids for s in sources], [t.ids for t in targets], pad_id=cfg.pad_id,
                             start_id=cfg.start_id, batch_size=batch_size, source_end=cfg.eos_id, prefix=True,
                             device=model.device)
    done = 0
    with evaluating(model), torch.no_grad():
        for n_batch, (idx, b) in enumerate(batches):
            _, trace = model.run_with_cache(b.src, b.tgt_in, names=names)
            for i, k in enumerate(idx):
                n, m = len(targets[k].ids) + 1, len(sources[k].ids) + 1
                out[k] = (trace[names[1]][i, :n].half().cpu(), trace[names[0]][i, :m].half().cpu())
            done += len(idx)
            if n_batch % 20 == 0:
                log(f"cached {done}/{len(sources)} pairs")
    return out


def _batch(cached, labels, idx, device):
    """Padded (states, memory, tgt_pad, src_pad, goal) for pairs `idx`; goal row t + 1 is y_t's (awi)."""
    n = max(cached[k][0].size(0) for k in idx)
    m = max(cached[k][1].size(0) for k in idx)
    d = cached[idx[0]][0].size(1)
    states = torch.zeros(len(idx), n, d)
    memory = torch.zeros(len(idx), m, d)
    tgt_pad = torch.ones(len(idx), n, dtype=torch.bool)
    src_pad = torch.ones(len(idx), m, dtype=torch.bool)
    goal = torch.zeros(len(idx), n, m)
    for b, k in enumerate(idx):
        st, mem = cached[k]
        states[b, : st.size(0)] = st.float()
        memory[b, : mem.size(0)] = mem.float()
        tgt_pad[b, : st.size(0)] = False
        src_pad[b, : mem.size(0)] = False
        g = torch.from_numpy(labels[k])
        goal[b, 1 : 1 + g.size(0), : g.size(1)] = g
    return tuple(x.to(device) for x in (states, memory, tgt_pad, src_pad, goal))


def _resume(d: Path, layer: AlignmentLayer, opt: torch.optim.Optimizer, device) -> tuple[int, list[int]] | None:
    """Load `d`'s saved layer weights and Adam state into `layer` and `opt`; (step, order), or None when `d`
    holds no state yet."""
    if not (d / "state.json").exists():
        return None
    meta = json.loads((d / "state.json").read_text(encoding="utf-8"))
    state = load_file(str(d / "state.safetensors"))
    layer.load_state_dict({k[len("layer."):]: v for k, v in state.items() if k.startswith("layer.")})
    opt_state: dict = {}
    for key, v in state.items():
        if key.startswith("opt."):
            _, i, name = key.split(".", 2)
            opt_state.setdefault(int(i), {})[name] = v.to(device) if name != "step" else v
    opt.load_state_dict({"state": opt_state, "param_groups": opt.state_dict()["param_groups"]})
    return int(meta["step"]), list(meta["order"])


def _save(d: Path, layer: AlignmentLayer, opt: torch.optim.Optimizer, step: int, order: list[int],
          losses: list[float]) -> None:
    """Write the layer, Adam's state, the step, the epoch's order and the recent loss to `d` (tensors atomically)."""
    tensors = {f"layer.{k}": v.detach().cpu().contiguous() for k, v in layer.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        for name, v in st.items():
            tensors[f"opt.{i}.{name}"] = torch.as_tensor(v).detach().cpu().contiguous()
    save_file(tensors, str(d / "state.safetensors.tmp"))
    (d / "state.safetensors.tmp").replace(d / "state.safetensors")
    (d / "state.json").write_text(json.dumps({"step": step, "order": order, "config": layer.config(),
                                              "loss": float(np.mean(losses[-50:])) if losses else None}),
                                  encoding="utf-8")


def _loss(layer: AlignmentLayer, states, memory, tgt_pad, src_pad, goal) -> torch.Tensor:
    """Cross-entropy of the layer's rows against `goal` over target rows with a link; `both_ways` adds the
    columns' (each linked source piece: uniform over its linked target pieces)."""
    logp, logq = layer.scores(states, memory, tgt_pad, src_pad)
    rows = goal.sum(-1) > 0
    loss = -(goal * logp.masked_fill(~torch.isfinite(logp), 0.0)).sum(-1)[rows].mean()
    if layer.both_ways:
        linked = (goal > 0).float()
        cols = linked.sum(-2) > 0
        back = linked / linked.sum(-2, keepdim=True).clamp_min(1.0)
        loss = loss - (back * logq.masked_fill(~torch.isfinite(logq), 0.0)).sum(-2)[cols].mean()
    return loss


def train_alignment_layer(layer: AlignmentLayer, model, sources: Sequence, targets: Sequence,
                          labels: Sequence[np.ndarray], *, directory: str | Path, steps: int = 1000,
                          batch_size: int = 32, lr: float = 1e-3, seed: int = 0, save_every: int = 100,
                          max_minutes: float | None = None, decay: int | None = None, log=print) -> dict:
    """Train `layer` (in place) on `labels[k]` = `piece_targets` of pair k; the model stays frozen. Resumes from
    `directory`'s state when there is one; returns {"step", "loss", "seconds"}. `decay` = N: the learning rate falls
    linearly from `lr` to `lr` / 10 over steps 0 .. N (a function of the step, so a run stopped and resumed
    follows the same schedule); the layer's starting weights are whatever `layer` holds (a fresh one, or one
    trained before)."""
    if layer.partners:
        raise ValueError("a layer with partners is read, not trained: train each layer alone, then join them")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    device = model.device
    layer.to(device)
    opt = torch.optim.Adam(layer.parameters(), lr=lr)
    step, order = 0, np.random.default_rng(seed).permutation(len(sources)).tolist()
    losses: list[float] = []
    resumed = _resume(d, layer, opt, device)
    if resumed is not None:
        step, order = resumed
        log(f"resumed at step {step}")
    start = time.perf_counter()
    cached = cache_inputs(model, layer, sources, targets, log=log) if step < steps else []
    layer.train()
    per_epoch = max(1, len(order) // batch_size)
    while step < steps:
        if max_minutes is not None and time.perf_counter() - start > 60 * max_minutes:
            log(f"stopping at step {step}: {max_minutes} minutes")
            break
        e, i = divmod(step, per_epoch)
        if i == 0 and e > 0:
            order = np.random.default_rng(seed + e).permutation(len(sources)).tolist()
        if decay:
            for group in opt.param_groups:
                group["lr"] = lr * (1.0 - 0.9 * min(step / decay, 1.0))
        loss = _loss(layer, *_batch(cached, labels, order[i * batch_size : (i + 1) * batch_size], device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if step % 50 == 0:
            log(f"step {step} loss {np.mean(losses[-50:]):.4f} ({time.perf_counter() - start:.0f} s)")
        if step % save_every == 0:
            _save(d, layer, opt, step, order, losses)
    _save(d, layer, opt, step, order, losses)
    layer.eval()
    return {"step": step, "loss": float(np.mean(losses[-50:])) if losses else None,
            "seconds": time.perf_counter() - start}
