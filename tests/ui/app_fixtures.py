"""A small real workbench checkpoint for the app's tests: sentencepiece on Multi30k lines + a tiny model.

The model is randomly initialised (seeded), so translations are nonsense, but every code path the
app has (tokenizers, decoding, traces, ablation, training log) is the real one. Decoding is capped
at 24 tokens through the checkpoint's generation defaults, which keeps each request in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench import presets
from workbench.checkpoint.format import save_checkpoint
from workbench.checkpoint.tokenizer import SentencePieceTokenizer
from workbench.core.model import Transformer

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


def build_checkpoint(directory: Path, *, seed: int = 0, lines: int = 400, vocab: int = 600, steps: int = 150,
                     preset: str = "tiny", generation: dict | None = None, langs: tuple[str, str] = ("de", "en"),
                     run: str | None = None, step: int | None = None) -> Path:
    """Write a checkpoint: a joint de+en tokenizer, a model of `preset` (tiny: 2+2 layers) trained `steps` Adam
    steps on Multi30k with the noam schedule, and the real log of that run (loss and LR per step).
    `langs` is the (source, target) pair meta.json names; `run`/`step` name the training run (its out_dir) and
    the step this is a snapshot of, as checkpoints written by `workbench train` do."""
    de = (DATA / "train.de").read_text(encoding="utf-8").splitlines()[:lines]
    en = (DATA / "train.en").read_text(encoding="utf-8").splitlines()[:lines]
    tok = SentencePieceTokenizer.train(sentences=de + en, vocab_size=vocab, num_threads=1)
    cfg = (presets.tiny(vocab=tok.vocab_size, max_positions=128) if preset == "tiny"
           else presets.preset(preset, src_vocab=tok.vocab_size, tgt_vocab=tok.vocab_size))
    torch.manual_seed(seed)
    model = Transformer(cfg)
    log = _train(model, tok, de, en, steps) if steps else []
    model.eval()
    return save_checkpoint(directory, model, src_tokenizer=tok, tgt_tokenizer=tok,
                           meta={"src_lang": langs[0], "tgt_lang": langs[1],
                                 "generation": generation or {"beam": 1, "max_len": 16},
                                 **({"step": step} if step is not None else {}),
                                 # as `workbench train` stores it (the keys this run used; the rest default)
                                 "train_config": {"schedule": "noam", "warmup": WARMUP, "noam_factor": FACTOR,
                                                  "model": {"d_model": cfg.d_model}, "max_steps": max(steps, 1),
                                                  **({"out_dir": run} if run is not None else {})}},
                           train_log=log)


WARMUP, FACTOR = 30, 0.7


def _train(model: Transformer, tok, de: list[str], en: list[str], steps: int, batch: int = 32) -> list[dict]:
    from workbench.training.schedule import noam

    cfg = model.cfg
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(0)
    log = []
    model.train()
    for step in range(1, steps + 1):
        rows = torch.randint(0, len(de), (batch,), generator=g).tolist()
        src = _pad([tok.encode(de[i])[:40] + [cfg.eos_id] for i in rows], cfg.pad_id)
        tgt = _pad([[cfg.start_id] + tok.encode(en[i])[:40] + [cfg.eos_id] for i in rows], cfg.pad_id)
        lr = noam(step, d_model=cfg.d_model, warmup=WARMUP, factor=FACTOR)
        for group in opt.param_groups:
            group["lr"] = lr
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1),
                                                 ignore_index=cfg.pad_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.append({"step": step, "lr": lr, "loss": float(loss)})
    return log


def _pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


def corrupt_checkpoint(directory: Path) -> Path:
    """A directory that looks like a checkpoint (config.json) but whose weights are garbage."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(presets.tiny().to_json())
    (directory / "model.safetensors").write_bytes(b"not a safetensors file")
    return directory
