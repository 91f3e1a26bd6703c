"""The encoder-decoder Transformer of "Attention Is All You Need", with named hook points.

    logits = model(src, tgt_in)                               # fused attention, no overhead
    logits, trace = model.run_with_cache(src, tgt_in, names="*.hook_probs")
    with model.hooks({"dec.1.cross_attn.hook_context": zero_heads(3)}):
        edited = model(src, tgt_in)

`src` is (B, S) source ids ending in EOS, `tgt_in` is (B, T) decoder input ids starting with
the decoder start token; both right-padded with `pad_id`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .attention import KVArena, KVCache, RowOrder
from .config import ModelConfig
from .embedding import Positions, init_embedding
from .heads import Head
from .hooks import HookFn, HookPoint, NameFilter, hooks, name_hook_points, reads_heads, select_names
from .layers import DecoderLayer, Dropout, EncoderLayer, LayerNorm, Sublayer
from .masks import padding_mask
from .trace import Trace


@dataclass
class Encoded:
    """What the decoder needs from the encoder: memory and which source positions are real."""

    memory: torch.Tensor  # (B, S, D)
    src_mask: torch.Tensor | None  # (B, 1, 1, S) True on real tokens; None: no padding

    def index_select(self, index: torch.Tensor) -> Encoded:
        mask = None if self.src_mask is None else self.src_mask.index_select(0, index)
        return Encoded(self.memory.index_select(0, index), mask)


@dataclass
class DecoderCache:
    """Incremental-decoding state: per layer, self-attention K/V so far and cross-attention K/V."""

    self_kv: list[KVCache | None]
    cross_kv: list[KVCache]
    arenas: list[tuple[KVArena, KVArena]] | None = None  # per layer, where beam reorders are written (for_beams)

    @property
    def length(self) -> int:
        first = self.self_kv[0] if self.self_kv else None
        return 0 if first is None else first.length

    def index_select(self, index: torch.Tensor) -> DecoderCache:
        """Reorder or expand along the batch dimension; see `reorder` for the self-attention K/V. Not for a beam
        cache (`for_beams`), whose cross-attention rows are sentences, not query rows: there `reorder` moves the
        beams and `keep_sentences` drops whole sentences."""
        if any(kv.group > 1 for kv in self.cross_kv):
            raise ValueError("index_select picks query rows, but this cache's cross-attention K/V are shared by "
                             "beams (for_beams): use reorder (beams) and keep_sentences (sentences)")
        return DecoderCache(self.reorder(index).self_kv, [kv.index_select(index) for kv in self.cross_kv], self.arenas)

    def keep_sentences(self, sentences: torch.Tensor) -> DecoderCache:
        """A beam cache (`for_beams`) whose shared cross-attention K/V keep the sentences `sentences` only; the
        self-attention K/V are left to the caller's next `reorder`, which names the kept beams' parents (beam
        search drops finished sentences and follows the parents in one reorder)."""
        return DecoderCache(self.self_kv, [kv.index_select(sentences) for kv in self.cross_kv], self.arenas)

    def for_beams(self, beam: int, steps: int) -> DecoderCache:
        """A fresh cache (`start_cache`) for `beam` beams per sentence over up to `steps` decoder steps: the
        cross-attention K/V stay one row per sentence, shared by its beams' rows (`KVCache.shared_by`; the mask
        passed with it stays per sentence), and the self-attention K/V's reorders are written into two reused
        buffers per layer (`KVArena`): a cache it returns is valid until the step after next, so the caller
        keeps only its newest (as beam search does)."""
        if self.length:
            raise ValueError("for_beams expects a fresh cache (start_cache), not one that decoded already")
        arenas = [(KVArena(steps), KVArena(steps)) for _ in self.self_kv]
        return DecoderCache(list(self.self_kv), [kv.shared_by(beam) for kv in self.cross_kv], arenas)

    def reorder(self, index: torch.Tensor) -> DecoderCache:
        """Self-attention K/V follow rows `index` (beams their parents); cross-attention K/V stay as they are.

        The reorder is owed, not copied: each layer's next append gathers and appends in one pass
        (`KVCache.append`), and the layers share one `RowOrder`, so its index is built once.
        """
        orders: dict[int, RowOrder] = {}  # layers owing the same reorder keep sharing one
        self_kv: list[KVCache | None] = []
        for i, kv in enumerate(self.self_kv):
            if kv is None:
                self_kv.append(None)
                continue
            key = id(kv.order)
            if key not in orders:
                orders[key] = RowOrder(index) if kv.order is None else kv.order.then(index)
            self_kv.append(kv.read_through(orders[key], None if self.arenas is None else self.arenas[i]))
        return DecoderCache(self_kv, self.cross_kv, self.arenas)


@dataclass(frozen=True, eq=False)
class Stream:
    """One stack's residual stream, described once: the embedding that starts it, the layers whose sub-layers
    write into it (`Sublayer`), the final norm and the hook point where it ends. Analyses walk this instead of
    spelling hook names (`model.stream("dec").layers[1].cross_attn.hook_k.name`)."""

    stack: str  # "enc" or "dec"
    side: str  # "src" or "tgt": which ids it reads
    hook_tok: HookPoint
    hook_pos: HookPoint
    emb_norm: LayerNorm | None
    hook_embed: HookPoint
    layers: nn.ModuleList
    final_norm: LayerNorm | None
    hook_out: HookPoint  # hook_memory / hook_dec_out: after the final norm

    def sublayers(self, layers: int | None = None) -> list[tuple[int, Sublayer]]:
        """(layer index, sub-layer) in the order they write, through the first `layers` layers (all: None)."""
        n = len(self.layers) if layers is None else layers
        return [(i, sub) for i in range(n) for sub in self.layers[i].sublayers()]

    def resid(self, layers: int) -> HookPoint:
        """The stream after the first `layers` layers: the embedding for 0; the stack's output (after its final
        norm) for all of them; else that layer's `hook_resid_ffn`."""
        if layers == len(self.layers):
            return self.hook_out
        return self.layers[layers - 1].hook_resid_ffn if layers else self.hook_embed


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab, d, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.tie_embeddings == "all" else nn.Embedding(
            cfg.tgt_vocab, d, padding_idx=cfg.pad_id
        )
        self.output_proj = nn.Linear(d, cfg.tgt_vocab, bias=cfg.output_bias)
        self.positions = Positions(cfg)
        self.embed_scale = math.sqrt(d) if cfg.scale_embedding else 1.0
        self.src_emb_norm = LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.emb_norm else None
        self.tgt_emb_norm = LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.emb_norm else None
        self.emb_dropout = Dropout(cfg.embedding_dropout)
        self.enc = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.enc_layers)])
        self.dec = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.dec_layers)])
        self.enc_norm = LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.has_enc_final_norm else None
        self.dec_norm = LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.has_dec_final_norm else None

        self.hook_src_tok = HookPoint()  # (B, S, D): token embeddings, scaled
        self.hook_src_pos = HookPoint()  # (1, S, D): positional encodings
        self.hook_src_embed = HookPoint()  # (B, S, D): their sum (and embedding norm): encoder input
        self.hook_memory = HookPoint()  # (B, S, D): encoder output after its final norm
        self.hook_tgt_tok = HookPoint()  # (B, T, D)
        self.hook_tgt_pos = HookPoint()  # (1, T, D)
        self.hook_tgt_embed = HookPoint()  # (B, T, D): decoder input
        self.hook_dec_out = HookPoint()  # (B, T, D): decoder output after its final norm
        self.hook_logits = HookPoint()  # (B, T, V)

        self.reset_parameters()
        if cfg.tie_embeddings != "none":
            # https://arxiv.org/abs/1608.05859: the output projection shares the target embedding
            self.output_proj.weight = self.tgt_embed.weight
        self._hook_points = name_hook_points(self)
        # validate id ranges on every full call: one host sync, so the trainer may turn it off
        self.check_inputs = True

    def reset_parameters(self) -> None:
        """Xavier-uniform matrices (the paper's reference code and fairseq), N(0, d^-1/2) embeddings.

        Query/key/value projections get gain 1/√2: what Xavier gives one fused (3d, d) in-projection
        (torch.nn.MultiheadAttention, tensor2tensor) and what fairseq uses because it "converges much
        better". Plain Xavier on three separate (d, d) matrices is √2 larger; on Multi30k it trailed the
        reference trainer by ~0.3 nats after 7 epochs."""
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name and "positions" not in name:
                qkv = name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))
                nn.init.xavier_uniform_(p, gain=2**-0.5 if qkv else 1.0)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        init_embedding(self.src_embed, self.cfg.d_model, self.cfg.pad_id)
        if self.tgt_embed is not self.src_embed:
            init_embedding(self.tgt_embed, self.cfg.d_model, self.cfg.pad_id)

    def stream(self, stack: str) -> Stream:
        """The encoder ("enc") or decoder ("dec") residual stream: see `Stream`."""
        if stack == "enc":
            return Stream("enc", "src", self.hook_src_tok, self.hook_src_pos, self.src_emb_norm, self.hook_src_embed,
                          self.enc, self.enc_norm, self.hook_memory)
        if stack == "dec":
            return Stream("dec", "tgt", self.hook_tgt_tok, self.hook_tgt_pos, self.tgt_emb_norm, self.hook_tgt_embed,
                          self.dec, self.dec_norm, self.hook_dec_out)
        raise ValueError(f"stack must be 'enc' or 'dec', got {stack!r}")

    # -- hook-point discovery ---------------------------------------------------------------
    @property
    def hook_points(self) -> dict[str, HookPoint]:
        return dict(self._hook_points)

    def refresh_hook_points(self) -> None:
        """Re-read the hook points from the module tree, after a splice (`core.splice`) added or removed some."""
        self._hook_points = name_hook_points(self)

    def hook_names(self, spec: NameFilter = None) -> list[str]:
        """Hook-point names in module order; `spec` filters by name, glob, list or predicate."""
        return select_names(self._hook_points, spec)

    def hooks(self, spec) -> contextlib.AbstractContextManager[None]:
        """Activate {name or glob: fn} hooks for this thread/task until the block ends."""
        return hooks(self._hook_points, spec)

    # -- the forward pass -------------------------------------------------------------------
    def embed_source(self, src: torch.Tensor) -> torch.Tensor:
        tok = self.hook_src_tok(self.src_embed(src) * self.embed_scale)
        pos = self.hook_src_pos(self.positions(src.size(1)).to(tok.dtype))
        x = tok + pos
        if self.src_emb_norm is not None:
            x = self.src_emb_norm(x)
        return self.emb_dropout(self.hook_src_embed(x))

    def embed_target(self, tgt: torch.Tensor, start: int = 0) -> torch.Tensor:
        tok = self.hook_tgt_tok(self.tgt_embed(tgt) * self.embed_scale)
        pos = self.hook_tgt_pos(self.positions(tgt.size(1), start).to(tok.dtype))
        x = tok + pos
        if self.tgt_emb_norm is not None:
            x = self.tgt_emb_norm(x)
        return self.emb_dropout(self.hook_tgt_embed(x))

    def encode(self, src: torch.Tensor) -> Encoded:
        if self.check_inputs:
            _check_ids(src, self.cfg.src_vocab, "source")
        mask = padding_mask(src, self.cfg.pad_id)
        x = self.embed_source(src)
        for layer in self.enc:
            x = layer(x, mask)
        if self.enc_norm is not None:
            x = self.enc_norm(x)
        return Encoded(self.hook_memory(x), mask)

    def start_cache(self, encoded: Encoded) -> DecoderCache:
        """Cross-attention keys/values for every decoder layer, computed once per source."""
        cross = [layer.cross_attn.project_kv(encoded.memory) for layer in self.dec]
        return DecoderCache([None] * len(self.dec), cross)

    def decode(
        self, tgt: torch.Tensor, encoded: Encoded, cache: DecoderCache | None = None, *, project: bool = True
    ) -> tuple[torch.Tensor, DecoderCache]:
        """Logits (B, T, V) for decoder input `tgt`.

        Without `cache`, `tgt` is the whole prefix. With one (from `start_cache` or a previous
        call), `tgt` holds only the new tokens, placed after the cached ones; the returned cache
        includes them. Both give the same logits (tested token by token). `project=False` stops
        before the output layer: the decoder output (B, T, D), as `hook_dec_out` sees it.
        """
        if self.check_inputs and cache is None:
            _check_ids(tgt, self.cfg.tgt_vocab, "target")
        if cache is None:
            cache = self.start_cache(encoded)
        x = self.embed_target(tgt, start=cache.length)
        new_self: list[KVCache | None] = []
        for layer, self_kv, cross_kv in zip(self.dec, cache.self_kv, cache.cross_kv):
            x, kv = layer(x, cross_kv=cross_kv, src_mask=encoded.src_mask, cache=self_kv)
            new_self.append(kv)
        if self.dec_norm is not None:
            x = self.dec_norm(x)
        x = self.hook_dec_out(x)
        if not project:
            return x, DecoderCache(new_self, cache.cross_kv, cache.arenas)
        logits = self.hook_logits(self.output_proj(x))
        return logits, DecoderCache(new_self, cache.cross_kv, cache.arenas)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, *, project: bool = True) -> torch.Tensor:
        """Teacher-forced logits (B, T, V); `project=False`: the decoder output (B, T, D) instead.

        The trainer takes the decoder output and applies `loss.output_loss` (the output layer fused with
        the loss, never writing the (B, T, V) logits), so `hook_logits` does not run in training.
        """
        return self.decode(tgt, self.encode(src), project=project)[0]

    # -- observation and intervention -------------------------------------------------------
    def run_with_cache(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        names: NameFilter = "*.hook_probs",
        *,
        heads: Iterable[Head | str | tuple] | None = None,
        device: torch.device | str | None = None,
        detach: bool = True,
    ) -> tuple[torch.Tensor, Trace]:
        """Forward pass that also returns the chosen activations as a `Trace`.

        By default every attention-probability tensor is captured; `names=None` captures every hook point. `heads`
        ("cross:1:0", Head or (kind, layer, head) each) captures the probabilities of those heads only, at the
        cost of those heads: their blocks compute no other head's softmax, the rest of the model runs fused.
        The trace then holds (B, k, Lq, Lk) per block, k heads in ascending order, listed in
        `trace.meta["heads"]`; `trace.attention(kind, layer, head)` finds a head either way; they are detached
        (the outputs come from the fused kernel, not from them). `device="cpu"`
        moves activations off the accelerator as they are produced; `detach=False` keeps them in the
        autograd graph.
        """
        if heads is not None:
            heads = [heads] if isinstance(heads, (str, Head)) else list(heads)  # read twice: capture and meta
        with self.capture(names, heads=heads, device=device, detach=detach) as store:
            logits = self(src, tgt)
        meta = {"heads": self._heads_by_name(heads)} if heads is not None else None
        return logits, Trace({name: calls[-1] for name, calls in store.items()}, src=src, tgt=tgt, meta=meta)

    @contextlib.contextmanager
    def capture(
        self, names: NameFilter = "*.hook_probs", *, heads: Iterable[Head | str | tuple] | None = None, device=None,
        detach: bool = True,
    ) -> Iterator[dict[str, list[torch.Tensor]]]:
        """Record the chosen activations during the block: {name: [tensor per call]}.

        One forward gives one tensor per name; incremental decoding gives one per step (the
        decoding module assembles those into a whole-generation trace). `heads`: as in `run_with_cache`;
        it replaces `names`, which must then be left at its default.
        """
        store: dict[str, list[torch.Tensor]] = {}

        def keep(x: torch.Tensor, hook: HookPoint) -> None:
            y = x.detach() if detach else x
            if device is not None:
                y = y.to(device)
            store.setdefault(hook.name, []).append(y)

        if heads is None:
            spec = [(n, keep) for n in self.hook_names(names)]
        elif names != "*.hook_probs":
            raise ValueError("give names or heads, not both: heads captures those heads' hook_probs only")
        elif not detach:
            raise ValueError("heads captures read-only probabilities (the blocks' outputs come from the fused "
                             "kernel), so detach=False has no graph to keep; capture every head for gradients")
        else:
            spec = [(n, reads_heads(keep, h)) for n, h in self._heads_by_name(heads).items()]
        with self.hooks(spec):
            yield store

    def _heads_by_name(self, heads: Iterable[Head | str | tuple]) -> dict[str, list[int]]:
        """{block's hook_probs name: sorted head indices}, in module order; unknown heads raise ValueError."""
        if isinstance(heads, (str, Head)):
            heads = [heads]
        chosen: dict[str, set[int]] = {}
        for spec in heads:
            head = Head.parse(spec).check(self.cfg)
            chosen.setdefault(head.hook_name("hook_probs"), set()).add(head.head)
        if not chosen:
            raise ValueError("heads is empty: name at least one head, or pass heads=None for every head")
        return {name: sorted(chosen[name]) for name in self.hook_names(list(chosen))}

    def intervene(self, spec: dict[str, HookFn]) -> contextlib.AbstractContextManager[None]:
        """Alias of `hooks` that reads better for edits: `with model.intervene({...}):`."""
        return self.hooks(spec)

    @property
    def device(self) -> torch.device:
        return self.output_proj.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode for the block, the model's mode restored after; no toggle when it is in eval mode already
    (eval()/train() visit every module: slower than a small model's backward pass). The one eval-mode context:
    analyses, the replacement model and the app use it."""
    was = model.training
    if was:
        model.eval()
    try:
        yield
    finally:
        if was:
            model.train()


def _check_ids(ids: torch.Tensor, vocab: int, side: str) -> None:
    if ids.dim() != 2:
        raise ValueError(f"{side} ids must be (batch, length), got shape {tuple(ids.shape)}")
    if ids.size(1) == 0:
        raise ValueError(f"{side} ids are empty: every sequence needs at least one token")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{side} ids must be int64 or int32, got {ids.dtype}")
    if torch.compiler.is_compiling():
        return  # reading the range back would break the graph (Tensor.item); an id out of range fails in the embedding
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{side} ids must lie in [0, {vocab}), found values in [{lo}, {hi}]")
