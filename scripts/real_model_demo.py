"""Import three published WMT en-de models and score them on newstest2014 against their published BLEU.

    python scripts/real_model_demo.py [--limit N] [--device cuda] [--data ../shared/data/wmt-news]

Needs internet access (huggingface.co, dl.fbaipublicfiles.com, s3.amazonaws.com). Without it the
script says so and exits 0 without doing anything else: on the project's build machines there is
no model hub, so this is a demonstration for online users, not a test.

Each model goes through exactly the commands a user would type:
    workbench import {marian,fairseq,opennmt} SOURCE --out runs/imported/NAME
    workbench evaluate --checkpoint runs/imported/NAME --src newstest2014.en --ref newstest2014.de ...
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODELS = [
    # name, format, source, decoding options, published sacreBLEU on newstest2014 (as the issue lists them)
    ("opus-mt-en-de", "marian", "hf:Helsinki-NLP/opus-mt-en-de", ["--beam", "4"], 27.9),
    ("fairseq-wmt16-en-de", "fairseq",
     "https://dl.fbaipublicfiles.com/fairseq/models/wmt16.en-de.joined-dict.transformer.tar.bz2",
     ["--beam", "4", "--length-penalty", "average", "--alpha", "0.6"], 28.6),
    ("opennmt-wmt-en-de", "opennmt", "https://s3.amazonaws.com/opennmt-models/transformer-ende-wmt-pyOnmt.tar.gz",
     ["--beam", "4", "--length-penalty", "average", "--alpha", "1.0"], 26.8),
]
HOSTS = ["https://huggingface.co", "https://dl.fbaipublicfiles.com", "https://s3.amazonaws.com"]


def reachable(url: str) -> str | None:
    """None when `url` answers (any HTTP status counts), else the reason."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10)
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        return str(getattr(exc, "reason", exc))
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "wmt-news"))
    p.add_argument("--out", default=str(ROOT / "runs" / "imported"))
    p.add_argument("--limit", type=int, default=None, help="score only the first N sentences (quick look)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)

    down = {h: r for h in HOSTS if (r := reachable(h)) is not None}
    if down:
        for host, reason in down.items():
            print(f"cannot reach {host}: {reason}")
        print("real_model_demo: skipped, the network is unreachable (this demonstration needs the model hubs; "
              "the parity tests in tests/importers/ prove the importers offline)")
        return 0
    data = Path(args.data)
    src, ref = data / "newstest2014.en", data / "newstest2014.de"
    if not src.is_file() or not ref.is_file():
        print(f"real_model_demo: {src} / {ref} not found; pass --data DIR holding newstest2014.{{en,de}}")
        return 2
    if args.limit:
        cut = Path(args.out) / "test"
        cut.mkdir(parents=True, exist_ok=True)
        for f in (src, ref):
            lines = f.read_text(encoding="utf-8").splitlines()[: args.limit]
            (cut / f.name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        src, ref = cut / src.name, cut / ref.name

    from workbench.cli import main as workbench

    rows = []
    for name, fmt, source, options, published in MODELS:
        out = Path(args.out) / name
        print(f"== {name}: workbench import {fmt} {source} --out {out}", flush=True)
        if workbench(["import", fmt, source, "--out", str(out)]) != 0:
            rows.append((name, published, None))
            continue
        result = Path(args.out) / f"{name}.json"
        cmd = ["evaluate", "--checkpoint", str(out), "--src", str(src), "--ref", str(ref), "--device", args.device,
               *options, "--json", "--hyp-out", str(Path(args.out) / f"{name}.hyp")]
        print("== workbench " + " ".join(cmd), flush=True)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = workbench(cmd)
        result.write_text(buf.getvalue(), encoding="utf-8")
        bleu = _bleu(buf.getvalue()) if code == 0 else None
        rows.append((name, published, bleu))
    print(f"\n{'model':<24} {'published':>9} {'workbench':>9}  (sacreBLEU, newstest2014"
          f"{f', first {args.limit} lines' if args.limit else ''})")
    for name, published, bleu in rows:
        shown = "failed" if bleu is None else f"{bleu:.1f}"
        print(f"{name:<24} {published:>9.1f} {shown:>9}")
    return 0 if all(b is not None for _, _, b in rows) else 1


def _bleu(text: str) -> float | None:
    """The BLEU score from `workbench evaluate --json` output (one JSON object, possibly indented)."""
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        return None
    value = data.get("bleu")
    value = value.get("score") if isinstance(value, dict) else value
    return float(value) if isinstance(value, (int, float)) else None


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
