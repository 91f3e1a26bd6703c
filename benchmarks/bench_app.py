"""Benchmark of the served app (not a test): latency, payload and throughput, measured in a real Chromium.

    .venv/bin/python benchmarks/bench_app.py [--checkpoint DIR] [--sessions 10] [--seconds 40]

1. In-process: model work (`work.compute`: translation + whole-generation trace) and figure building
   for a 30- and a 200-token source sentence, median of 3.
2. Browser, one session: time from pressing Enter in the sentence box to the page showing the new
   result AND the heatmap holding the new sentence's tokens (all visible views updated), median of 3
   distinct sentences per length; bytes the server sent over the websocket for that update.
3. Server side, N sessions in-process (views attached to Bokeh documents, no browsers): requests/s.
4. Browser, N sessions at once (separate contexts), each submitting distinct ~30-token sentences in a
   loop for `--seconds`: completed requests per second and their median latency.

Without `--checkpoint` it uses the default under checkpoints/; if there is none, it builds a stand-in:
the multi30k_small architecture (3+3 layers, d=256), randomly initialised, with generation limited to
|source| + 5 tokens so outputs are as long as a real translation of the same sentence. It says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "ui"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))

FIGURE_KEYS = """() => {
    const v = [...Bokeh.index.all_views()].filter(v => v.model.name === 'attn_fig' && v.el.isConnected);
    return v.length === 1 ? v[0].model.x_range.end + 0.5 : -1; }"""
VERSION = """() => {
    const deep = (root) => {  // Panel renders in nested open shadow roots
        for (const el of root.querySelectorAll('*')) {
            if (el.classList && el.classList.contains('status')) {
                const m = (el.shadowRoot || el).textContent.match(/version=(\\d+)/);
                if (m) return +m[1];
            }
            if (el.shadowRoot) { const v = deep(el.shadowRoot); if (v >= 0) return v; }
        }
        return -1;
    };
    return deep(document);
}"""


def sentences(tm, n_tokens: int, count: int) -> list[str]:
    """`count` distinct Multi30k-based sentences of exactly `n_tokens` source tokens (EOS included)."""
    lines = (ROOT.parent / "shared" / "data" / "multi30k" / "val.de").read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while len(out) < count:
        text = ""
        while len(tm.encode_source(text)[0]) < n_tokens:
            text = (text + " " + lines[i % len(lines)]).strip()
            i += 1
        words = text.split()
        while len(tm.encode_source(" ".join(words))[0]) > n_tokens and len(words) > 1:
            words.pop()
        out.append(" ".join(words))
    return out


STANDIN = Path(tempfile.gettempdir()) / "workbench-bench-standin"


def pick_checkpoint(arg: str | None) -> tuple[Path, str]:
    from workbench.ui import loader

    if arg:
        return Path(arg), f"checkpoint {arg}"
    entries, _ = loader.discover()
    default = loader.default_entry(entries)
    if default is not None:
        return default.path, f"shipped default checkpoint {default.label}"
    from app_fixtures import build_checkpoint

    path = STANDIN
    if not (path / "config.json").is_file():
        build_checkpoint(path, steps=0, vocab=8000, lines=5000, preset="multi30k_small",
                         generation={"beam": 1, "max_len_a": 1.0, "max_len_b": 5})
    return path, ("STAND-IN (no checkpoint under checkpoints/): multi30k_small architecture, random weights, "
                  "outputs |src|+5 tokens")


def in_process(path: Path, texts: dict[int, list[str]]) -> dict:
    from workbench.charts import attention_heatmap, head_view, model_view
    from workbench.ui.work import Request, compute

    out = {}
    for n, group in texts.items():
        model_s, fig_s, out_len = [], [], []
        for text in group:
            t = time.perf_counter()
            res = compute(Request(str(path), text)).result
            model_s.append(time.perf_counter() - t)
            out_len.append(res.n_tokens)
            t = time.perf_counter()
            attention_heatmap(res.trace, "cross", 0, select={"tgt_tokens": list(res.out_pieces)})
            head_view(res.trace, "cross", 0)
            model_view(res.trace, "cross")
            fig_s.append(time.perf_counter() - t)
        out[n] = {"model_s": statistics.median(model_s), "figures_s": statistics.median(fig_s),
                  "output_tokens": statistics.median(out_len),
                  "trace_kb": res.trace.nbytes() / 1024}
    return out


def serve(path: Path) -> tuple[subprocess.Popen, str]:
    from conftest import _free_port

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "panel", "serve", str(ROOT / "apps" / "attention.py"), "--setup",
                             str(ROOT / "apps" / "serve_setup.py"), "--port",
                             str(port), "--address", "127.0.0.1", f"--allow-websocket-origin=127.0.0.1:{port}",
                             "--args", "--checkpoints", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/attention?ckpt={path.name}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=30).read()
            return proc, url
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("panel serve did not start")


def submit_and_wait(page, text: str, n_src: int) -> float:
    v = page.evaluate(VERSION)
    box = page.locator(".sentence-input textarea")
    box.fill(text)
    t = time.perf_counter()
    page.locator(".translate-btn button").click()
    page.wait_for_function(f"() => ({VERSION})() > {v} && ({FIGURE_KEYS})() === {n_src}", timeout=120_000,
                           polling="raf")
    return time.perf_counter() - t


def browser(url: str, tm, texts: dict[int, list[str]], sessions: int, seconds: float) -> dict:
    from playwright.sync_api import sync_playwright

    out: dict = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium")
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        received = [0]

        def on_ws(ws):
            ws.on("framereceived", lambda payload: received.__setitem__(0, received[0] + len(payload)))

        page.on("websocket", on_ws)
        page.goto(url)
        page.wait_for_function(f"({FIGURE_KEYS})() > 0", timeout=120_000)
        out["first_load_ws_kb"] = received[0] / 1024
        for n, group in texts.items():
            times, sizes = [], []
            for text in group:
                n_src = len(tm.encode_source(text)[0])
                received[0] = 0
                times.append(submit_and_wait(page, text, n_src))
                page.wait_for_timeout(300)  # late frames (widget options) count toward the payload
                sizes.append(received[0] / 1024)
            out[n] = {"submit_to_views_s": statistics.median(times), "all_s": [round(x, 3) for x in times],
                      "ws_kb": statistics.median(sizes)}
        page.close()
        out["concurrent"] = concurrent(b, url, tm, sessions, seconds)
        b.close()
    return out


def concurrent(b, url: str, tm, sessions: int, seconds: float) -> dict:
    pool = sentences(tm, 30, 40)
    pages = []
    for _ in range(sessions):
        page = b.new_context(viewport={"width": 1200, "height": 900}).new_page()
        page.goto(url)
        pages.append(page)
    for page in pages:
        page.wait_for_function(f"({FIGURE_KEYS})() > 0", timeout=300_000)
    # Playwright's sync API is single-threaded: drive the sessions round-robin, each press returning at once,
    # and collect completions by polling, so all sessions have a request in flight together.
    lat: list[float] = []
    pending: dict[int, tuple[float, int, int]] = {}
    start = time.perf_counter()
    k = 0
    lock = threading.Lock()
    while time.perf_counter() - start < seconds or pending:
        for i, page in enumerate(pages):
            if i in pending:
                t0, v, n_src = pending[i]
                if page.evaluate(f"() => ({VERSION})() > {v} && ({FIGURE_KEYS})() === {n_src}"):
                    with lock:
                        lat.append(time.perf_counter() - t0)
                    del pending[i]
            elif time.perf_counter() - start < seconds:
                text = pool[k % len(pool)] + f" {k}"
                k += 1
                v = page.evaluate(VERSION)
                box = page.locator(".sentence-input textarea")
                box.fill(text)
                page.locator(".translate-btn button").click()
                pending[i] = (time.perf_counter(), v, len(tm.encode_source(text)[0]))
    elapsed = time.perf_counter() - start
    return {"sessions": sessions, "completed": len(lat), "seconds": round(elapsed, 1),
            "requests_per_s": len(lat) / elapsed, "median_latency_s": statistics.median(lat) if lat else None,
            "p90_latency_s": sorted(lat)[int(0.9 * (len(lat) - 1))] if lat else None}


def server_side(path: Path, tm, sessions: int, seconds: float) -> dict:
    """N sessions in this process, each with its views attached to a Bokeh document, submitting in a loop:
    the server's own capacity (model work in the worker threads + figure building on the loop), no browsers."""
    import asyncio

    from bokeh.document import Document

    from workbench.ui import Workbench

    pool = sentences(tm, 30, 40)

    async def run() -> dict:
        benches = []
        for _ in range(sessions):
            wb = Workbench(path, default_dir=None, sync_url=False, background=True)
            doc = Document()
            doc.add_root(wb.__panel__().get_root(doc))
            benches.append(wb)
        lat: list[float] = []
        counter = [0]
        start = time.perf_counter()

        async def user(wb) -> None:
            while time.perf_counter() - start < seconds:
                v, t = wb.session.version, time.perf_counter()
                wb.session.sentence = pool[counter[0] % len(pool)] + f" {counter[0]}"
                counter[0] += 1
                while wb.session.version == v:
                    await asyncio.sleep(0.005)
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(user(wb) for wb in benches))
        elapsed = time.perf_counter() - start
        return {"sessions": sessions, "completed": len(lat), "seconds": round(elapsed, 1),
                "requests_per_s": len(lat) / elapsed, "median_latency_s": statistics.median(lat),
                "p90_latency_s": sorted(lat)[int(0.9 * (len(lat) - 1))]}

    return asyncio.run(run())


LONG_EN = ("The old fisherman who had lived in the small village by the sea for more than forty years told the "
           "children that the storm which destroyed the harbour last winter was not the worst he had seen, because "
           "when he was young a much stronger wind had carried away every boat, the church roof and half of the "
           "houses along the narrow street near the market.")


def contention(path: Path, tm, seconds: float, interactive: int = 8, heavy: int = 2) -> dict:
    """Issue 28's and 37's speed goals: `interactive` sessions translating ~10-word sentences and changing the
    selection (layer, head, highlighted token) in a loop, with and without `heavy` more sessions running the Why
    tab's exact patching sweep on a 60-word sentence over and over (edit the changed source: its estimate; run the
    sweep for up to 12 s, or to its end; edit again); and the heavy sessions alone, for their progress. Every
    session has its views attached to a Bokeh document, in this process, on one event loop (as under `panel
    serve`, without browsers); heavy work goes where the server would put it (`workers.placement()`: worker
    processes unless WORKBENCH_APP_HEAVY_PROCESSES=0). Latency: from the change to the applied answer
    (translation: `version` bumped; selection: the attention view redrawn). Goals: interactive p95 with the heavy
    pages at most 1.5x idle; sites patched beside the interactive users at least 50 % of alone."""
    import asyncio

    from bokeh.document import Document

    from workbench.ui import Workbench, workers
    from workbench.ui.why_view import WhyView

    load_before = os.getloadavg()[0]
    placed = workers.placement()
    for f in workers.warm(str(path)):  # the workers load the model before anything is timed, as a served page's
        f.result(timeout=600)            # first result would have them do

    short = [s for s in sentences(tm, 14, 30)]
    long_src = LONG_EN if (tm.meta.get("src_lang") or "en") == "en" else pool_long(tm)

    async def run(with_heavy: bool, interactive: int = interactive) -> dict:
        pages = []
        for _ in range(interactive + (heavy if with_heavy else 0)):
            wb = Workbench(path, default_dir=None, sync_url=False, background=True)
            doc = Document()
            doc.add_root(wb.__panel__().get_root(doc))
            pages.append(wb)
        for wb in pages:
            while wb.session.result is None or wb.session.busy:
                await asyncio.sleep(0.01)
        stop = [False]
        sweeps, patched = [0], [0]

        async def sweeper(wb) -> None:
            why = WhyView(session=wb.session)
            wb.session.sentence = long_src
            while wb.session.busy or wb.session.result is None or wb.session.result.request.sentence != long_src:
                await asyncio.sleep(0.01)
            why.show()
            k = 0
            while not stop[0]:
                why.corrupted = long_src.replace("fisherman", ["sailor", "farmer", "teacher", "baker"][k % 4])
                k += 1
                while why._patch_box.loading and not stop[0]:
                    await asyncio.sleep(0.05)
                why.refresh_patching(exact=True)  # the exact sweep, superseded by the next edit after 12 s
                sweeps[0] += 1
                began = time.perf_counter()
                while time.perf_counter() - began < 12.0 and why._stop.visible and not stop[0]:
                    await asyncio.sleep(0.1)
                patched[0] += why._bar.value if why._bar.visible else (why._shown.sites if why._shown is not None
                                                                      and why._shown.exact else 0)
            why.stop()

        lat: dict[str, list[float]] = {"translate": [], "select": []}
        counter = [0]
        start = time.perf_counter()

        async def user(wb) -> None:
            s = wb.session
            while time.perf_counter() - start < seconds:
                v, t = s.version, time.perf_counter()
                s.sentence = short[counter[0] % len(short)] + f" {counter[0]}"
                counter[0] += 1
                while s.version == v:
                    await asyncio.sleep(0.002)
                lat["translate"].append(time.perf_counter() - t)
                for change in ({"layer": 1 % max(1, len(s.param.layer.objects))}, {"head": 0}, {"token": 2},
                               {"layer": 0, "head": -1, "token": -1}):
                    t = time.perf_counter()
                    s.param.update(**change)  # the attention view redraws on the loop, inline
                    lat["select"].append(time.perf_counter() - t)
                    await asyncio.sleep(0)

        heavy_tasks = [asyncio.ensure_future(sweeper(wb)) for wb in pages[interactive:]]
        await asyncio.gather(*(user(wb) for wb in pages[:interactive]), asyncio.sleep(seconds))
        stop[0] = True
        await asyncio.gather(*heavy_tasks)
        for wb in pages:
            wb.session.close()
        every = lat["translate"] + lat["select"]
        if not every:
            return {"heavy_sessions": heavy, "sweeps_started": sweeps[0], "sites_patched": patched[0]}
        q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
        return {"interactive_sessions": interactive, "heavy_sessions": heavy if with_heavy else 0,
                "sweeps_started": sweeps[0], "sites_patched": patched[0],
                "translations": len(lat["translate"]),
                "translate_p50_s": statistics.median(lat["translate"]), "translate_p95_s": q(lat["translate"], 0.95),
                "select_p50_s": statistics.median(lat["select"]), "select_p95_s": q(lat["select"], 0.95),
                "all_p50_s": statistics.median(every), "all_p95_s": q(every, 0.95)}

    idle = asyncio.run(run(False))
    alone = asyncio.run(run(True, interactive=0))
    busy = asyncio.run(run(True))
    return {"placement": placed.kind if placed is not None else "threads", "load_before": load_before,
            "idle": idle, "heavy_alone": alone, "with_heavy": busy, "p95_ratio": busy["all_p95_s"] / idle["all_p95_s"],
            "translate_p95_ratio": busy["translate_p95_s"] / idle["translate_p95_s"],
            "heavy_progress_ratio": busy["sites_patched"] / max(1, alone["sites_patched"])}


def pool_long(tm) -> str:
    return sentences(tm, 80, 1)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint")
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--no-browser", action="store_true", help="only the in-process and server-side parts")
    ap.add_argument("--contention", action="store_true",
                    help="only issue 28's goal: 8 interactive sessions with and without 2 running Why sweeps")
    ap.add_argument("--out", help="write the JSON report here too")
    args = ap.parse_args()
    from workbench.ui import loader

    loader.configure_torch_threads()  # as the served app does
    path, what = pick_checkpoint(args.checkpoint)

    tm = loader.load_model(str(path))
    if args.contention:
        report = {"checkpoint": what, "seconds": args.seconds, "contention": contention(path, tm, args.seconds)}
        print(json.dumps(report, indent=1), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        return 0
    texts = {n: sentences(tm, n, 3) for n in (30, 200)}
    report = {"checkpoint": what, "in_process": in_process(path, texts)}
    report["server_side_concurrent"] = server_side(path, tm, args.sessions, args.seconds)
    print(json.dumps(report, indent=1), flush=True)
    if args.no_browser:
        return 0
    proc, url = serve(path)
    try:
        report["browser"] = browser(url, tm, texts, args.sessions, args.seconds)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
