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

`--contention`: issue 28's and 37's fairness goal without browsers (sessions in this process). `--contention
--browser`: the same in Chromium with 8 pages (6 clicking, one running exact Why sweeps, one building graphs; a
browser each), written to benchmarks/results/app_contention_browser_cpu.json with what other processes used of the
CPUs (a loaded machine makes the ratios not judgeable, and the file says so). Run it without `nice`: the server
and Chromium are its children and inherit its niceness, so under `nice -n 10` they ran at the heavy workers' own
priority (the file records both). `--think S`: the clickers pause S seconds on average before each action.

Without `--checkpoint` it uses the default under checkpoints/; if there is none, it builds a stand-in:
the multi30k_small architecture (3+3 layers, d=256), randomly initialised, with generation limited to
|source| + 5 tokens so outputs are as long as a real translation of the same sentence. It says so.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
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


def serve(path: Path, log=subprocess.DEVNULL, cpus: set[int] | None = None, stall_log: str | None = None
          ) -> tuple[subprocess.Popen, str]:
    """`panel serve` the app on a free port; with `cpus`, the server and every process it starts run on those CPUs;
    with `stall_log`, the server writes its threads' stacks there whenever its event loop stalls (ui.stall_watch)."""
    from conftest import _free_port

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "panel", "serve", str(ROOT / "apps" / "attention.py"), "--setup",
                             str(ROOT / "apps" / "serve_setup.py"), "--port",
                             str(port), "--address", "127.0.0.1", f"--allow-websocket-origin=127.0.0.1:{port}",
                             "--args", "--checkpoints", str(path)],
                            stdout=log, stderr=subprocess.STDOUT if log is not subprocess.DEVNULL else log, cwd=ROOT,
                            env={**os.environ, "WORKBENCH_STALL_LOG": stall_log} if stall_log else None,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
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


# -- issue 37: the same contention in Chromium, 8 pages ------------------------------------------------------------

SHORT_EN = "The children are playing in the park with a red ball today."
COLOURS = ["blue", "green", "yellow", "black", "white", "brown", "grey", "orange"]
ROUNDS = itertools.count(1)  # the clickers' rounds, over every page and phase (each translation a new sentence)
GRAPH_POSITIONS = (4, 5, 6, 7, 8, 9)  # output tokens whose graphs the graph page cycles through: more than the
# server's cache keeps graphs (`loader.LIMITS["graph"]`), so each one is a new build


def _q(xs: list[float], p: float) -> float | None:
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] if xs else None


async def _text(page, css: str) -> str:
    from playwright.async_api import TimeoutError as PlaywrightTimeout
    from test_app import TEXT_JS

    loc = page.locator(css).first
    try:  # gone between the count and the read (a progress line the answer replaced): no text
        return await loc.evaluate(TEXT_JS, timeout=2_000) if await loc.count() else ""
    except PlaywrightTimeout:
        return ""


async def _until_text(page, css: str, part: str, every: float = 0.1) -> None:
    """Poll until the text of `css` (pierced through Panel's shadow roots) holds `part` (5 minutes at most)."""
    for _ in range(int(300 / every)):
        if part in await _text(page, css):
            return
        await asyncio.sleep(every)
    raise TimeoutError(f"{css} never said {part!r}")


async def _version(page) -> int:
    return int(await page.evaluate(VERSION))


async def _clicker(page, k: int, lat: dict, stop, think: float = 0.0) -> None:
    """One interactive page: pick a head (the attention figure redraws), then the mean of all heads, and every third
    round translate a short sentence; each latency from the action to the page showing its answer. `think`: the
    mean pause before each action (uniform in [0.5, 1.5] x think, seeded by the page), a user reading the figure;
    0 clicks as fast as the answers come (a saturating load, not a user)."""
    import random

    from test_app import FIGURE_JS

    pause = random.Random(k)
    i = next(ROUNDS)  # never 0 again in a later phase: a sentence equal to the page's own would change nothing
    while not stop():
        for label, expect in (("head 1", "head 1"), ("all (mean)", "mean of all heads"), ("head 0", "head 0")):
            if think:
                await asyncio.sleep(think * pause.uniform(0.5, 1.5))
            t = time.perf_counter()
            await page.locator(".head-picker select").select_option(label=label)
            await page.wait_for_function(f"() => {{ const f = ({FIGURE_JS})(); return f !== null && "
                                         f"f.title.includes({expect!r}); }}", timeout=300_000, polling="raf")
            lat["select"].append(time.perf_counter() - t)
        if i % 3 == 0:
            v = await _version(page)
            await page.locator(".sentence-input textarea").fill(SHORT_EN.replace("red", COLOURS[(k + i) % 8]) + f" {i}")
            t = time.perf_counter()
            await page.locator(".translate-btn button").click()
            await page.wait_for_function(f"() => ({VERSION})() > {v}", timeout=300_000, polling="raf")
            lat["translate"].append(time.perf_counter() - t)
        i = next(ROUNDS)


async def _sweeper(page, long_src: str, done: list, stop) -> None:
    """The Why page: exact sweeps over and over (a new changed word when one completes); `done[0]` counts the sites
    patched while this runs (read from the page's progress line)."""
    import re

    words = iter(["girl", "horse", "sailor", "farmer", "teacher", "baker", "doctor", "driver"] * 100)
    while not stop():
        if not await page.locator(".why-exact button").is_visible():
            box = page.locator(".why-corrupted input")
            await box.fill(long_src.replace("old man", "old " + next(words)))
            await box.press("Enter")
            await page.locator(".why-exact button").wait_for(timeout=300_000)
        await page.locator(".why-exact button").click()
        last, total, seen = 0, 0, False
        while True:
            line = await _text(page, ".why-progress") if await page.locator(".why-progress").is_visible() else ""
            found = re.search(r"patched ([\d,]+) of ([\d,]+)", line)
            if found:
                n, total = (int(g.replace(",", "")) for g in found.groups())
                done[0] += max(0, n - last)
                last, seen = n, True
            elif seen:  # the sweep completed: its last batch counts
                done[0] += max(0, total - last)
                break
            if stop():
                if await page.locator(".why-stop button").is_visible():
                    await page.locator(".why-stop button").click()
                    await page.get_by_text("Stopped the exact sweep").wait_for(timeout=300_000)
                return
            await asyncio.sleep(0.25)


async def _grapher(page, done: list, layers: list, stop) -> None:
    """The Graph page: the graphs of `GRAPH_POSITIONS` in turn (each a new build), over and over; `done[0]`
    counts the graphs drawn while this runs, `layers[0]` the sub-layers built (read from its progress line)."""
    import re

    k = 0
    while not stop():
        position = GRAPH_POSITIONS[k % len(GRAPH_POSITIONS)]
        k += 1
        await page.locator(".graph-token-list select").select_option(index=position)
        last, total = 0, 0
        for _ in range(3000):  # 5 minutes at most
            if f"output position {position}:" in await _text(page, ".graph-note"):
                break
            found = re.search(r"sub-layer (\d+) of (\d+)", await _text(page, ".graph-progress"))
            if found:
                n, total = int(found[1]), int(found[2])
                layers[0] += max(0, n - last)
                last = n
            await asyncio.sleep(0.1)
        else:
            raise TimeoutError(f"the graph of output token {position} was never drawn")
        layers[0] += max(0, total - last)
        done[0] += 1


def _busy_ticks() -> int:
    """Clock ticks every CPU spent busy since boot (/proc/stat: user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6, 7))


def _tree_ticks(root: int) -> int:
    """Clock ticks spent by process `root` and its descendants (their reaped children included)."""
    parent, ticks = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... utime stime cu cs
            parent[int(d.name)], ticks[int(d.name)] = int(rest[1]), sum(int(x) for x in rest[11:15])
    mine, grew = {root}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in mine} - mine
        mine |= more
        grew = bool(more)
    return sum(ticks.get(p, 0) for p in mine)


def other_cpu(before: tuple[int, int], after: tuple[int, int], seconds: float) -> float:
    """CPUs' worth of work done by processes outside this benchmark (its server, workers and Chromium are its
    descendants) between two (`_busy_ticks`, `_tree_ticks`) readings: the quietness a verdict needs."""
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / hz / seconds)


async def _phase(name: str, seconds: float, clickers: list, heavy: list, long_src: str, think: float = 0.0) -> dict:
    """Run the given interactive pages and heavy pages together for `seconds`; their latencies and progress."""
    ticks = (_busy_ticks(), _tree_ticks(os.getpid()))
    lat: dict[str, list[float]] = {"select": [], "translate": []}
    patched, graphs, layers = [0], [0], [0]
    start = time.perf_counter()
    stop = lambda: time.perf_counter() - start >= seconds  # noqa: E731
    load = os.getloadavg()[0]
    tasks = [_clicker(p, k, lat, stop, think) for k, p in enumerate(clickers)]
    if heavy:
        tasks += [_sweeper(heavy[0], long_src, patched, stop), _grapher(heavy[1], graphs, layers, stop)]
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    every = lat["select"] + lat["translate"]
    now = (_busy_ticks(), _tree_ticks(os.getpid()))
    others = other_cpu(ticks, now, elapsed)
    own = (now[1] - ticks[1]) / os.sysconf("SC_CLK_TCK") / elapsed
    return {"phase": name, "seconds": round(elapsed, 1), "other_processes_cpus": round(others, 3),
            "benchmark_cpus": round(own, 3),
            "loadavg_1min_before": round(load, 2),
            "loadavg_1min_after": round(os.getloadavg()[0], 2),
            "interactive_pages": len(clickers), "heavy_pages": len(heavy),
            "actions": len(every), "select_p50_s": _q(lat["select"], 0.5), "select_p95_s": _q(lat["select"], 0.95),
            "translate_p50_s": _q(lat["translate"], 0.5), "translate_p95_s": _q(lat["translate"], 0.95),
            "all_p50_s": _q(every, 0.5), "all_p95_s": _q(every, 0.95),
            "sites_patched": patched[0], "sites_per_s": patched[0] / elapsed,
            "graphs_drawn": graphs[0], "graphs_per_s": graphs[0] / elapsed,
            "graph_sublayers_built": layers[0], "graph_sublayers_per_s": layers[0] / elapsed}


def browser_contention(url: str, long_src: str, seconds: float, interactive: int = 6, think: float = 0.0) -> dict:
    """Issue 37 point 4 in Chromium: 8 pages open (separate browser contexts, one served app); `interactive` of them
    pick heads and translate short sentences in a loop, 2 run heavy work (one the Why tab's exact sweeps on a 60-word
    sentence, one the Graph tab's graphs of its tokens, alternating). Phases of `seconds` each: the interactive pages
    alone ("idle": the heavy pages open but doing nothing), the heavy pages alone, both together, and the
    interactive pages alone again (how far the machine's own load drifted). Goals: interactive p95 beside the heavy
    pages at most 1.5x idle; each heavy page's progress (sites patched, graphs drawn per second) at least 50 % of
    alone. `think`: the clickers' mean pause before each action (`_clicker`). With think 0 the six clickers keep
    both CPUs busy on their own (load ~6 on 2 cores in the idle phase): whatever the heavy pages then get, the
    clickers lose, so both goals cannot hold together on 2 cores by CPU conservation; with users' pauses the heavy
    work has idle CPU to take, and the goals say whether it takes it without delaying the users."""
    from playwright.async_api import async_playwright

    async def run() -> dict:
        async with async_playwright() as p:
            # one browser per page, as each user has their own: pages of one browser share its GPU process (software
            # GL here), so one page drawing a large graph held the others' frames back
            browsers = [await p.chromium.launch(executable_path=os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
                        for _ in range(interactive + 2)]
            pages = [await (await b.new_context(viewport={"width": 1200, "height": 900})).new_page() for b in browsers]
            clickers, (why, graph) = pages[:interactive], pages[interactive:]
            src = urllib.parse.quote(long_src)
            for page, address in zip(pages, [url] * interactive + [f"{url}&src={src}&tab=why",
                                                                   f"{url}&src={src}&tab=graph&gctx=false"]):
                page.set_default_timeout(300_000)  # a bound, not a measurement: a loaded machine is slow
                await page.goto(address)  # one after another: 8 loads at once took over 30 s each here
            for p in clickers:
                await p.locator(".head-picker select").wait_for(timeout=300_000)
            await why.locator(".why-patching-note").first.wait_for(timeout=300_000)
            await graph.locator(".graph-token-list select").wait_for(timeout=300_000)
            await _until_text(graph, ".graph-note", "output position", every=0.5)
            phases = [await _phase("idle", seconds, clickers, [], long_src, think),
                      await _phase("heavy_alone", seconds, [], [why, graph], long_src, think),
                      await _phase("with_heavy", seconds, clickers, [why, graph], long_src, think)]
            for heavy_page in (why, graph):  # their running jobs would go on into the next phase: closing cancels
                await heavy_page.close()
            await asyncio.sleep(3)
            phases.append(await _phase("idle_again", seconds, clickers, [], long_src, think))
            for b in browsers:
                await b.close()
            return {p["phase"]: p for p in phases}

    return asyncio.run(run())


OTHER_CPUS_AT_MOST = 0.1  # CPUs' worth of other processes' work in any phase for a verdict to stand


def contention_verdict(result: dict, cpus: int) -> dict:
    """The goals' ratios, and whether the machine was quiet enough for them to mean anything."""
    idle, busy, alone, again = (result[k] for k in ("idle", "with_heavy", "heavy_alone", "idle_again"))
    loads = [result[k][w] for k in result for w in ("loadavg_1min_before", "loadavg_1min_after")]
    # The benchmark's own processes (server, workers, Chromium) are its descendants; what else ran is measured.
    others = [o for k in result if (o := result[k].get("other_processes_cpus")) is not None]
    loaded = (max(others) > OTHER_CPUS_AT_MOST if len(others) == len(result)
              else max(loads) > 1.5 * cpus or idle["loadavg_1min_before"] > 0.5 * cpus)
    drift = (again["all_p95_s"] / idle["all_p95_s"]) if idle["all_p95_s"] and again["all_p95_s"] else None
    used = {k: result[k].get("benchmark_cpus") for k in ("idle", "heavy_alone")}
    # CPU conservation: what the interactive pages use alone (server + their Chromium) the heavy work cannot have;
    # the heavy pages alone used `heavy_alone`'s CPUs, so beside the clickers they can reach at most this share
    bound = (min(1.0, max(0.0, cpus - used["idle"]) / used["heavy_alone"])
             if None not in used.values() and used["heavy_alone"] else None)
    return {"cpus": cpus, "loadavg_1min_max": max(loads), "other_processes_cpus_max": max(others, default=None),
            "cpus_used_idle": used["idle"], "cpus_used_heavy_alone": used["heavy_alone"],
            "heavy_progress_bound": bound,
            "p95_ratio": busy["all_p95_s"] / idle["all_p95_s"] if idle["all_p95_s"] else None,
            "p95_ratio_vs_idle_again": busy["all_p95_s"] / again["all_p95_s"] if again["all_p95_s"] else None,
            "idle_drift": drift,
            "sweep_progress_ratio": busy["sites_per_s"] / alone["sites_per_s"] if alone["sites_per_s"] else None,
            "graph_progress_ratio": (busy["graph_sublayers_per_s"] / alone["graph_sublayers_per_s"]
                                     if alone["graph_sublayers_per_s"] else None),
            "goals": {"p95_ratio_at_most": 1.5, "progress_ratio_at_least": 0.5},
            "judgeable": not loaded,
            "note": ("NOT JUDGEABLE: the machine was loaded by other work (other processes used up to "
                     f"{max(others, default=-1):.2f} of {cpus} CPUs in a phase; 1-min load average up to "
                     f"{max(loads):.1f}); the ratios are recorded, not a verdict on the goals."
                     if loaded else "The machine was quiet enough: the ratios stand against the goals.")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint")
    ap.add_argument("--sessions", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--no-browser", action="store_true", help="only the in-process and server-side parts")
    ap.add_argument("--contention", action="store_true",
                    help="only issue 28's goal: 8 interactive sessions with and without 2 running Why sweeps")
    ap.add_argument("--browser", action="store_true",
                    help="with --contention: the same in Chromium, 8 pages (6 clicking, a Why sweep, a graph); writes "
                         "benchmarks/results/app_contention_browser_cpu.json unless --out says otherwise")
    ap.add_argument("--think", type=float, default=0.0,
                    help="with --contention --browser: the clickers' mean pause before each action, seconds (0: "
                         "click as fast as answers come, a saturating load)")
    ap.add_argument("--split-cpus", action="store_true",
                    help="with --contention --browser: the server (and its workers) on half the CPUs, Chromium on "
                         "the other half, so the pages' own drawing does not compete with the server it measures")
    ap.add_argument("--stall-log", metavar="PATH",
                    help="with --contention --browser: the server writes every thread's stack to PATH whenever its "
                         "event loop is silent over 0.5 s (WORKBENCH_STALL_LOG); the report counts the stalls")
    ap.add_argument("--out", help="write the JSON report here too")
    args = ap.parse_args()
    from workbench.ui import loader

    loader.configure_torch_threads()  # as the served app does
    path, what = pick_checkpoint(args.checkpoint)

    tm = loader.load_model(str(path))
    if args.contention and args.browser:
        return contention_in_browser(path, what, tm, args)
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


def stalls_in(log: Path) -> dict:
    """The stalls a server's watchdog wrote (ui.stall_watch): their count and lengths, and where the log is."""
    text = log.read_text() if log.exists() else ""
    lengths = [float(line.split("the loop was silent ")[1].split(" s")[0])
               for line in text.splitlines() if " ended: the loop was silent " in line]
    return {"log": str(log), "watching": text.startswith("watching the event loop"), "count": len(lengths),
            "seconds": sorted(lengths, reverse=True)}


def contention_in_browser(path: Path, what: str, tm, args) -> int:
    if (tm.meta.get("src_lang") or "en") != "en":
        raise SystemExit("--contention --browser drives English sentences: give an en->x checkpoint (the shipped "
                         "default general-en-de)")
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / "app_contention_browser_cpu.json"
    cpus = os.cpu_count() or 1
    load_before = os.getloadavg()
    log_path = Path(tempfile.gettempdir()) / f"bench_app_browser_{os.getpid()}.log"
    placement = {"server": sorted(os.sched_getaffinity(0)), "driver_and_chromium": sorted(os.sched_getaffinity(0))}
    if args.split_cpus:  # the server on its own CPU(s), as behind a real deployment where the browsers are elsewhere
        every = sorted(os.sched_getaffinity(0))
        if len(every) < 2:
            raise SystemExit("--split-cpus needs at least 2 CPUs")
        half = len(every) // 2
        placement = {"server": every[half:], "driver_and_chromium": every[:half]}
        os.sched_setaffinity(0, set(placement["driver_and_chromium"]))  # Chromium and its driver inherit it
    with log_path.open("w") as log:
        proc, url = serve(path, log, set(placement["server"]) if args.split_cpus else None, args.stall_log)
        niceness = {"server": os.getpriority(os.PRIO_PROCESS, proc.pid), "driver_and_chromium": os.nice(0)}
        try:
            result = browser_contention(url, LONG_EN.replace("fisherman", "man"), args.seconds, think=args.think)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            print(f"server log: {log_path}", flush=True)
    report = {"benchmark": "bench_app.py --contention --browser", "checkpoint": what, "chromium": "/usr/bin/chromium",
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds_per_phase": args.seconds,
              "clicker_think_s": args.think,
              "loadavg_before": [round(x, 2) for x in load_before], "heavy_placement": _placement_said(),
              "niceness": niceness,
              "cpus": placement, "phases": result, "verdict": contention_verdict(result, cpus)}
    if args.stall_log:
        report["event_loop_stalls"] = stalls_in(Path(args.stall_log))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=1), flush=True)
    return 0


def _placement_said() -> str:
    processes = os.environ.get("WORKBENCH_APP_HEAVY_PROCESSES", "2")
    if os.environ.get("WORKBENCH_DASK_SCHEDULER"):
        return f"Dask cluster at {os.environ['WORKBENCH_DASK_SCHEDULER']}"
    if processes == "0":
        return "the server's heavy threads (WORKBENCH_APP_HEAVY_PROCESSES=0)"
    graphs = ("graphs in the server's heavy threads" if os.environ.get("WORKBENCH_APP_GRAPHS_IN_WORKERS") == "0"
              else "graphs too")
    return f"{processes} worker processes at nice {os.environ.get('WORKBENCH_APP_HEAVY_NICE', '10')} ({graphs})"


if __name__ == "__main__":
    raise SystemExit(main())
