"""Small random reference models for the importer parity tests (no downloads)."""

from __future__ import annotations

import torch

ODD = dict(d_model=16, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
           encoder_ffn_dim=24, decoder_ffn_dim=24, max_position_embeddings=64)
PER_STACK = dict(encoder_attention_heads=2, decoder_attention_heads=8, encoder_ffn_dim=40, decoder_ffn_dim=24)
"""Each stack its own head count and FFN width (MarianConfig/FSMTConfig allow it)."""


def fsmt_model(seed: int = 0, **changes):
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    torch.manual_seed(seed)
    cfg = FSMTConfig(**{"langs": ["en", "de"], "src_vocab_size": 53, "tgt_vocab_size": 47, **ODD, **changes})
    return FSMTForConditionalGeneration(cfg).eval()


def marian_model(seed: int = 0, **changes):
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    cfg = MarianConfig(**{"vocab_size": 53, "decoder_vocab_size": 47, "share_encoder_decoder_embeddings": False,
                          "tie_word_embeddings": False, "pad_token_id": 46, "eos_token_id": 0,
                          "decoder_start_token_id": 46, "scale_embedding": True, "activation_function": "swish",
                          **ODD, **changes})
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()  # zeros would hide a missing bias
    return model


def padded_batch(*, src_vocab: int, tgt_vocab: int, pad: int, eos: int, start: int, low: int, seed: int = 1,
                 batch: int = 3, src_len: int = 7, tgt_len: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """EOS-terminated sources and start-token targets with ids in [low, vocab) other than the specials;
    row 0 has a padded source, row 1 a padded target."""
    g = torch.Generator().manual_seed(seed)
    hi = min(src_vocab, tgt_vocab)
    src = torch.randint(low, hi, (batch, src_len), generator=g)
    tgt = torch.randint(low, hi, (batch, tgt_len), generator=g)
    for t in (src, tgt):
        t[(t == pad) | (t == eos) | (t == start)] = low
    src[:, -1] = eos
    src[0, src_len - 3] = eos
    src[0, src_len - 2:] = pad
    tgt[:, 0] = start
    tgt[1, tgt_len - 2:] = pad
    return src, tgt


def fsmt_to_fairseq(sd: dict[str, torch.Tensor], *, fused: bool, old_norms: bool) -> dict[str, torch.Tensor]:
    """FSMT's state dict in fairseq's own key layout (FSMT is transformers' port of fairseq's transformer).

    fused/old_norms produce the 2018 layout: one in_proj_weight/bias per attention block and
    layer_norms.{0,1}/{0,1,2}; otherwise the fairseq >= 0.7 layout with decoder.output_projection.
    """
    out: dict[str, torch.Tensor] = {}
    renames = {"self_attn_layer_norm": 0, "encoder_attn_layer_norm": 1, "final_layer_norm": 2}
    for key, value in sd.items():
        key = key.removeprefix("model.")
        if "embed_positions" in key:
            continue
        if key == "decoder.output_projection.weight" and old_norms:
            key = "decoder.embed_out"
        if old_norms:
            for name, n in renames.items():
                if f".{name}." in key:
                    n = 1 if key.startswith("encoder.") and n == 2 else n
                    key = key.replace(f".{name}.", f".layer_norms.{n}.")
        out[key] = value.clone()
    if fused:
        for key in [k for k in out if k.endswith(".q_proj.weight")]:
            base = key[: -len(".q_proj.weight")]
            for w in ("weight", "bias"):
                out[f"{base}.in_proj_{w}"] = torch.cat([out.pop(f"{base}.{p}_proj.{w}") for p in "qkv"])
    out["encoder.version"] = torch.tensor([3.0])
    out["decoder.version"] = torch.tensor([3.0])
    out["encoder.embed_positions._float_tensor"] = torch.zeros(1)
    out["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    return out


SENTENCES = [
    "the cat sat on the mat .", "a dog runs in the park", "we translate news every day",
    "attention is all you need", "the quick brown fox jumps over the lazy dog", "hello world , hello again",
    "models read sentences and write sentences", "small tests keep the build fast",
]


def train_spm(vocab_size: int = 40, seed_sentences: list[str] | None = None) -> bytes:
    """A tiny unigram sentencepiece model, trained in memory (about a tenth of a second)."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter((seed_sentences or SENTENCES) * 4), model_writer=buf, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
        minloglevel=2, hard_vocab_limit=False,
    )
    return buf.getvalue()


def marian_vocab(proto: bytes, lang_codes: tuple[str, ...] = (">>de<<", ">>fr<<"), *more: bytes) -> dict[str, int]:
    """opus-mt's vocab.json layout: </s> 0, <unk> 1, language codes, pieces (of every model given), <pad> last."""
    import sentencepiece as spm

    tokens = ["</s>", "<unk>", *lang_codes]
    for p in (proto, *more):
        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(p)
        tokens += [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.id_to_piece(i) not in tokens]
    tokens.append("<pad>")
    return {t: i for i, t in enumerate(tokens)}


TARGET_SENTENCES = [
    "die katze sitzt auf der matte .", "ein hund läuft im park", "wir übersetzen jeden tag nachrichten",
    "aufmerksamkeit ist alles was man braucht", "look here , look there", "kleine tests halten den bau schnell",
]


def write_marian_dir(directory, *, seed: int = 0, target_sentences: list[str] | None = None, **changes):
    """An opus-mt-style directory (config.json, model.safetensors, source/target.spm, vocab.json)
    for a random MarianMTModel whose vocabulary is the tiny sentencepiece model's. With `target_sentences`,
    target.spm is trained on those (a second language, as opus-mt's two models are) and the shared
    vocabulary holds both models' pieces."""
    import json

    proto = train_spm()
    tgt_proto = proto if target_sentences is None else train_spm(seed_sentences=target_sentences)
    vocab = marian_vocab(proto, (">>de<<", ">>fr<<"), *([tgt_proto] if target_sentences is not None else []))
    v = len(vocab)
    model = marian_model(seed, vocab_size=v, decoder_vocab_size=v, pad_token_id=v - 1, decoder_start_token_id=v - 1,
                         share_encoder_decoder_embeddings=True, tie_word_embeddings=True, **changes)
    model.save_pretrained(directory)
    (directory / "source.spm").write_bytes(proto)
    (directory / "target.spm").write_bytes(tgt_proto)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    return model


def eos_prone_fsmt(hf, boost: float):
    """Raise the EOS logit by about `boost` on every step: the last decoder layer's output norm gets
    a constant bias and the EOS output row leans towards it (FSMT has no logits bias)."""
    with torch.no_grad():
        last = hf.model.decoder.layers[-1].final_layer_norm
        last.bias.add_(0.5)
        row = hf.model.decoder.output_projection.weight[hf.config.eos_token_id]
        row.add_(boost / (0.5 * row.numel()))
    return hf


def bpe_files(directory, sentences=None, merges: int = 60):
    """FSMT-style merges.txt ("a b" lines) and vocab-src/tgt.json covering every piece the merges can
    produce, learned with subword-nmt from the tiny corpus."""
    import io
    import json

    from subword_nmt.learn_bpe import learn_bpe

    out = io.StringIO()
    learn_bpe(io.StringIO("\n".join((sentences or SENTENCES) * 2)), out, merges, min_frequency=1)
    pairs = [tuple(line.split()[:2]) for line in out.getvalue().splitlines() if line and not line.startswith("#")]
    pieces = set()
    for s in sentences or SENTENCES:
        for ch in s.replace(" ", ""):
            pieces.update({ch, ch + "</w>"})
    pieces.update(a + b for a, b in pairs)
    tokens = ["<s>", "<pad>", "</s>", "<unk>", *sorted(pieces)]
    vocab = {t: i for i, t in enumerate(tokens)}
    (directory / "merges.txt").write_text("\n".join(f"{a} {b} 1" for a, b in pairs) + "\n", encoding="utf-8")
    for name in ("vocab-src.json", "vocab-tgt.json"):
        (directory / name).write_text(json.dumps(vocab), encoding="utf-8")
    return vocab, pairs


def foreign_class(full_name: str, **attrs):
    """A class that pickles under another library's name ("fairseq.meters.AverageMeter") without
    that library installed; use inside `foreign_modules(...)`."""
    module, _, name = full_name.rpartition(".")
    cls = type(name, (), dict(attrs))
    cls.__module__, cls.__qualname__ = module, name
    return cls


class foreign_modules:
    """Register fake modules (and their parents) for the classes while pickling, then remove them,
    so loading shows that the real library is not needed."""

    def __init__(self, *classes):
        self.classes = classes
        self.added: list[str] = []

    def __enter__(self):
        import sys
        import types

        for cls in self.classes:
            parts = cls.__module__.split(".")
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                if name not in sys.modules:
                    sys.modules[name] = types.ModuleType(name)
                    self.added.append(name)
            setattr(sys.modules[cls.__module__], cls.__qualname__, cls)
        return self

    def __exit__(self, *exc):
        import sys

        for name in reversed(self.added):
            del sys.modules[name]
