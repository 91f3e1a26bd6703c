"""How good a dictionary is, on held-out text: reconstruction, sparsity, and what splicing it in does to translation.

    result = evaluate_dictionary(tm, dictionary, split="valid", bleu_split="test2016")
    result["fvu"], result["l0"], result["dead_frac"], result["ce_recovered"], result["bleu_spliced"]

- FVU: Σ‖y - ŷ‖² / Σ‖y - ȳ‖² over every real token of the split (y: the site's activation, or the FFN output
  a transcoder predicts), the mean taken over the whole split.
- L0: mean number of active features per token; dead: share of features that never fire on the split.
- CE recovered: with teacher forcing on the split's references, the mean token cross-entropy of the clean
  model, with the site replaced by the reconstruction, and with the site zero-ablated:
  (CE_zero - CE_spliced) / (CE_zero - CE_clean) (SAELens's "CE loss score").
- BLEU: the split translated with the checkpoint's own decoding settings (meta.json: beam, length penalty),
  clean and with the reconstruction spliced in, scored by sacrebleu.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..corpus.data import ParallelData, load_dataset
from ..decoding.evaluate import score
from ..decoding.translator import TranslationModel
from .dictionary import SparseDictionary
from .sites import site_of, site_rows, splice_hooks


def _ce(model, batch) -> tuple[float, int]:
    logits = model(batch.src, batch.tgt_in)
    mask = batch.tgt_out != model.cfg.pad_id
    nll = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), reduction="none")
    return float(nll[mask.flatten()].sum()), int(mask.sum())


@torch.no_grad()
def evaluate_dictionary(tm: TranslationModel, dictionary: SparseDictionary, *, dataset: str = "multi30k",
                        split: str = "valid", bleu_split: str | None = "test2016", data_root: str | None = None,
                        limit: int = 0, max_tokens: int = 4096, progress: Callable[[str], Any] | None = None
                        ) -> dict[str, Any]:
    model, d = tm.model.eval(), dictionary.eval()
    site = site_of(d)
    src_lang, tgt_lang = tm.meta.get("src_lang", "de"), tm.meta.get("tgt_lang", "en")
    src, tgt = load_dataset(dataset, split, src_lang, tgt_lang, data_root, limit=limit)
    data = ParallelData.encode(src, tgt, tm.src_tokenizer, tm.tgt_tokenizer, max_len=model.cfg.max_positions - 1)
    n_rows = 0
    err2 = 0.0
    s1 = torch.zeros(d.cfg.out_dim, dtype=torch.float64)
    s2 = 0.0
    active = 0
    fired = torch.zeros(d.cfg.d_sae, dtype=torch.long)
    ce = {"clean": [0.0, 0], "spliced": [0.0, 0], "zero": [0.0, 0]}
    t0 = time.time()
    for idx in data.batches(max_tokens, shuffle=False):
        batch = data.collate(idx, model.cfg).to(model.device)
        x, y = site_rows(model, batch, site)
        target = x if y is None else y
        feats = d.encode(x)
        recon = d.decode(feats) + d.skip(x)
        n_rows += x.size(0)
        err2 += float((target - recon).double().pow(2).sum())
        s1 += target.double().sum(0)
        s2 += float(target.double().pow(2).sum())
        nz = feats > 0
        active += int(nz.sum())
        fired += nz.sum(0)
        for name, hooks in (("clean", []), ("spliced", splice_hooks(site, d)), ("zero", splice_hooks(site, None))):
            with model.hooks(hooks):
                total, n = _ce(model, batch)
            ce[name][0] += total
            ce[name][1] += n
    variance = s2 - float((s1 * s1).sum()) / n_rows
    ce_mean = {k: v[0] / v[1] for k, v in ce.items()}
    result: dict[str, Any] = {
        "site": site.name, "hook_in": site.hook_in, "hook_out": site.hook_out, "split": f"{dataset}:{split}",
        "sentences": len(data), "tokens": n_rows, "fvu": err2 / variance, "l0": active / n_rows,
        "dead_frac": float((fired == 0).float().mean()), "dead": int((fired == 0).sum()), "d_sae": d.cfg.d_sae,
        "ce_clean": ce_mean["clean"], "ce_spliced": ce_mean["spliced"], "ce_zero_ablated": ce_mean["zero"],
        "ce_recovered": (ce_mean["zero"] - ce_mean["spliced"]) / (ce_mean["zero"] - ce_mean["clean"]),
        "seconds": round(time.time() - t0, 1),
    }
    if progress:
        progress(f"{site.name}: FVU {result['fvu']:.4f}, L0 {result['l0']:.1f}, dead {result['dead_frac']:.1%}, "
                 f"CE recovered {result['ce_recovered']:.3f}")
    if bleu_split:
        src, tgt = load_dataset(dataset, bleu_split, src_lang, tgt_lang, data_root, limit=limit)
        cfg = tm.decode_config
        t1 = time.time()
        clean = score(tm.translate(src), [tgt])
        with model.hooks(splice_hooks(site, d)):
            spliced = score(tm.translate(src), [tgt])
        result |= {"bleu_split": f"{dataset}:{bleu_split}", "bleu_sentences": len(src), "beam": cfg.beam,
                   "length_penalty": cfg.length_penalty, "alpha": cfg.alpha, "bleu_clean": clean.bleu,
                   "bleu_spliced": spliced.bleu, "bleu_delta": round(spliced.bleu - clean.bleu, 2),
                   "bleu_signature": clean.bleu_signature, "bleu_seconds": round(time.time() - t1, 1)}
        if progress:
            progress(f"{site.name}: {bleu_split} BLEU {clean.bleu:.2f} clean, {spliced.bleu:.2f} spliced")
    return result


GOALS = {"fvu": ("<=", 0.2), "l0": ("<=", 64), "dead_frac": ("<=", 0.10), "ce_recovered": (">=", 0.90)}
BLEU_GOAL = 0.5
"""BLEU points the spliced model may lose against the clean one."""


def write_card(directory: str | Path, result: dict[str, Any]) -> Path:
    """eval.json and a README.md whose numbers are `result`'s and training.json's, never typed by hand."""
    directory = Path(directory)
    (directory / "eval.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    cfg = json.loads((directory / "cfg.json").read_text(encoding="utf-8"))
    train_file = directory / "training.json"
    training = json.loads(train_file.read_text(encoding="utf-8")) if train_file.is_file() else {}
    tc = training.get("config", {})
    arch = cfg["metadata"]["workbench"]["architecture"]
    kind = ("skip transcoder" if "skip" in cfg["architecture"] else "transcoder") if cfg.get("d_out") \
        else "sparse autoencoder"
    k = f", k = {cfg['k']}" if "k" in cfg else ""
    lines = [f"# {result['site']}", "",
             f"{arch.upper() if arch == 'topk' else 'ReLU'} {kind} on `{result['hook_in']}`"
             + (f" predicting `{result['hook_out']}`" if result.get("hook_out") else "")
             + f" of `{cfg['metadata'].get('model_name', '')}`: {cfg['d_in']} -> {cfg['d_sae']} features{k}. "
             "SAELens layout (`cfg.json`, `sae_weights.safetensors`): `sae_lens.SAE.load_from_disk(this directory)`"
             + (" loads it after `workbench.features.sae_lens_classes.register()` (SAELens has no TopK "
                "transcoder class)." if cfg["architecture"].startswith("topk_") else " loads it."),
             "", f"## Held-out evaluation ({result['split']}, {result['sentences']} sentences, "
             f"{result['tokens']} tokens)",
             "", "| metric | value | goal |", "|---|---|---|"]
    for key, label in (("fvu", "fraction of variance unexplained"), ("l0", "L0 (features active per token)"),
                       ("dead_frac", "dead features (never fire on the split)"),
                       ("ce_recovered", "CE recovered vs zero-ablation")):
        op, goal = GOALS[key]
        v = result[key]
        shown = f"{v:.1%}" if key == "dead_frac" else f"{v:.4f}" if key != "l0" else f"{v:.1f}"
        ok = v <= goal if op == "<=" else v >= goal
        lines.append(f"| {label} | {shown} | {op} {f'{goal:.0%}' if key == 'dead_frac' else goal} "
                     f"{'(met)' if ok else '(missed)'} |")
    lines += ["", f"Cross-entropy per target token: clean {result['ce_clean']:.4f}, spliced "
              f"{result['ce_spliced']:.4f}, site zero-ablated {result['ce_zero_ablated']:.4f}."]
    if "bleu_clean" in result:
        lines += ["", f"BLEU on {result['bleu_split']} ({result['bleu_sentences']} sentences, beam {result['beam']}, "
                  f"length penalty {result['length_penalty']} {result['alpha']}, the checkpoint's settings): "
                  f"{result['bleu_clean']:.2f} clean, {result['bleu_spliced']:.2f} with the dictionary spliced in "
                  f"({result['bleu_delta']:+.2f}; goal: at most {BLEU_GOAL} below clean, "
                  f"{'met' if result['bleu_spliced'] >= result['bleu_clean'] - BLEU_GOAL else 'missed'}); "
                  f"`{result['bleu_signature']}`."]
    if training:
        lines += ["", "## Training", "",
                  f"- {training['activations']:,} activations ({training['steps']} steps of {tc.get('batch')}) "
                  f"streamed from `{tc.get('dataset')}:{tc.get('split')}` with teacher forcing, "
                  f"{training['epochs']} epochs of its tokens; shuffle buffer {tc.get('buffer'):,} rows.",
                  f"- Adam, peak lr {tc.get('lr')}, warm-up {tc.get('warmup')}, cosine decay; "
                  + (f"AuxK coefficient {tc.get('aux_coef'):.4g}, dead after {tc.get('dead_after'):,} activations."
                     if arch == "topk" else f"L1 target L0 {tc.get('target_l0')}, final L1 coefficient "
                     f"{training.get('final', {}).get('l1_coef', float('nan')):.3g}."),
                  *([f"- End-to-end term in the last {tc['kl_steps']} steps: {tc['kl_coef']:g} x KL(clean || spliced) "
                     "per target token of whole teacher-forced sentences, beside the reconstruction loss."]
                    if tc.get("kl_coef") and tc.get("kl_steps") else []),
                  f"- Training time: {training['train_seconds'] / 60:.1f} min wall clock on {training['world']} "
                  f"process(es) (the log's elapsed_s; the machine was shared, see the project's CHANGELOG).",
                  f"- Command: `{tc.get('extra', {}).get('command', '')}`"]
    lines += ["", "Re-measure: `workbench features eval DIR --checkpoint CHECKPOINT --card` (rewrites this file).", ""]
    (directory / "README.md").write_text("\n".join(lines), encoding="utf-8")
    return directory
