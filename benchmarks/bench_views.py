"""Build + serialise time and HTML size of each attention view at 32 / 128 / 512 tokens (base-size trace).

    .venv/bin/python benchmarks/bench_views.py [--lengths 32 128 512] [--repeats 3]

Base size = the paper's base model (6+6 layers, d=512, 8 heads) with a 64-piece vocabulary (the views
only see the attention tensors, whose size does not depend on the vocabulary). "build" is the view
function from the trace to a Bokeh model; "serialise" is `to_html` (bokeh.embed.file_html with INLINE
resources: the whole offline page). Median and best of `--repeats` runs, CPU only; on a shared machine the
best run is the better estimate of the view's own cost. BertViz's figure for
comparison: ~500 MB of HTML for a 300-token base-size page, which needs a CDN to render.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from workbench import Transformer, presets
from workbench.charts import attention_heatmap, head_view, model_view, to_html

VIEWS = {
    "heatmap cross (1 layer, head mean)": lambda t: attention_heatmap(t, "cross", 5),
    "heatmap enc_self (1 head, words)": lambda t: attention_heatmap(t, "enc_self", 0, heads=3, words=True),
    "head view cross (1 layer)": lambda t: head_view(t, "cross", 5),
    "head view cross (6 layers, picker)": lambda t: head_view(t, "cross"),
    "head view combined (6 layers)": lambda t: head_view(t, "combined"),
    "model view cross (6 x 8 tiles)": lambda t: model_view(t, "cross"),
    "model view (3 kinds x 6 x 8 tiles)": lambda t: model_view(t),
}


def peaked(trace):
    """Replace every attention row by softmax(4 * N(0, 1)) over the keys it may see: trained models'
    attention is peaked, a random model's is near uniform, and the head view's line count (hence its
    page size) depends on that. Masked keys (zeros in the trace) stay zero."""
    from workbench.core.trace import Trace

    g = torch.Generator().manual_seed(2)
    out = {}
    for name, probs in trace.items():
        logits = 4 * torch.randn(probs.shape, generator=g)
        out[name] = torch.softmax(logits.masked_fill(probs == 0, float("-inf")), dim=-1)
    return Trace(out, src=trace.src, tgt=trace.tgt, meta=trace.meta)


def base_trace(length: int):
    cfg = presets.base(vocab=64, max_positions=max(512, length))
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 64, (1, length), generator=g)
    tgt = torch.randint(4, 64, (1, length), generator=g)
    src[0, -1], tgt[0, 0] = cfg.eos_id, cfg.start_id
    with torch.no_grad():
        _, trace = model.run_with_cache(src, tgt)
    trace.meta["src_tokens"] = [("▁" if i % 3 == 0 else "") + f"s{i}" for i in range(length)]
    trace.meta["tgt_tokens"] = ["<s>"] + [("▁" if i % 2 else "") + f"t{i}" for i in range(1, length)]
    return trace


def browser_ready_s(html_path, driver) -> float:
    """Seconds from navigation start until every Bokeh view in the page reports finished (headless Chromium)."""
    driver.get(html_path.as_uri())
    driver.set_script_timeout(60)
    return driver.execute_async_script("""
        const done = arguments[0];
        const poll = () => {
            const views = (window.Bokeh && Bokeh.index) ? [...Bokeh.index.all_views()] : [];
            const plots = views.filter(v => v.model && v.model.type === "Figure");
            if (plots.length && plots.every(v => v.has_finished())) done(performance.now() / 1000);
            else setTimeout(poll, 5);
        };
        poll();""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="run only the views whose name contains this text")
    parser.add_argument("--browser", action="store_true",
                        help="also time loading each saved page in headless Chromium (needs chromium-driver)")
    parser.add_argument("--attention", choices=["model", "peaked"], default="model",
                        help="model: the random base model's own (near-uniform) attention; peaked: see peaked()")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"torch threads: {torch.get_num_threads()}; attention: {args.attention}")
    driver = None
    if args.browser:
        from workbench.charts.export import _chromium_driver

        driver = _chromium_driver()
    extra = " browser ready s |" if driver else ""
    print("| view | tokens | build s | serialise s | total s (median) | total s (best) | HTML MB |" + extra)
    print("|---|---|---|---|---|---|---|" + ("---|" if driver else ""))
    for length in args.lengths:
        trace = base_trace(length)
        trace = peaked(trace) if args.attention == "peaked" else trace
        for name, build in VIEWS.items():
            if args.only not in name:
                continue
            builds, sers, size = [], [], 0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                view = build(trace)
                t1 = time.perf_counter()
                html = to_html(view)
                t2 = time.perf_counter()
                builds.append(t1 - t0)
                sers.append(t2 - t1)
                size = len(html.encode("utf-8"))
            b, s = statistics.median(builds), statistics.median(sers)
            best = min(x + y for x, y in zip(builds, sers))
            cell = ""
            if driver is not None:
                import tempfile
                from pathlib import Path

                with tempfile.TemporaryDirectory() as tmp:
                    page = Path(tmp) / "view.html"
                    page.write_text(html, encoding="utf-8")
                    cell = f" {statistics.median(browser_ready_s(page, driver) for _ in range(args.repeats)):.2f} |"
            print(f"| {name} | {length} | {b:.3f} | {s:.3f} | {b + s:.3f} | {best:.3f} | {size / 1e6:.2f} |{cell}",
                  flush=True)
    if driver is not None:
        driver.quit()


if __name__ == "__main__":
    main()
