"""Every notebook, run in real JupyterLab in headless Chromium: every output renders, nothing leaves the machine.

One `jupyter lab --no-browser` on a free localhost port with a token, rooted in a temporary directory holding
copies of notebooks/*.ipynb (so saving never touches the committed ones) beside links to the project's
checkpoints/ and configs/ (the notebooks' `../` paths). Each test opens one notebook, runs Run > Run All Cells,
waits for every cell to finish, saves, and checks:
- the saved notebook: every code cell ran, no error output;
- the page: every rich output has a visible size (an Altair chart whose script failed is an empty output),
  every Vega chart drew its canvas or SVG, no page error, no console error;
- every request the page made went to 127.0.0.1 (data:/blob: URLs stay in the page).
Quick mode (WORKBENCH_QUICK=1 in the kernel's environment) unless JUPYTERLAB_NORMAL=1. Screenshots of each
notebook go to tmp_path, or to $JUPYTERLAB_SHOTS when set (docs/notebooks.md says how to look at them).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra: pip install -e '.[notebooks]'")
pytest.importorskip("jupyterlab", reason="the notebooks extra: pip install -e '.[notebooks]'")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
NORMAL = os.environ.get("JUPYTERLAB_NORMAL") == "1"
RUN_TIMEOUT_S = 3 * 3600 if NORMAL else 900  # the whole notebook; quick mode takes well under a minute each
# Outputs that draw nothing by design: Bokeh/Panel's JS loaders and comm bookkeeping.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on show
INVISIBLE = {"application/javascript", "application/vnd.bokehjs_load.v0+json", "application/vnd.holoviews_load.v0+json"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, url: str, token: str, root: Path, log: Path):
        self.url, self.token, self.root, self.log = url, token, root, log


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "root"
    (root / "notebooks").mkdir(parents=True)
    for name in NOTEBOOKS:
        shutil.copy(ROOT / "notebooks" / name, root / "notebooks" / name)
    for linked in ("checkpoints", "configs"):
        (root / linked).symlink_to(ROOT / linked, target_is_directory=True)
    # windowing off: every cell and output stays in the DOM, so all of them can be checked
    settings = base / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(base / "config"), "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
        "IPYTHONDIR": str(base / "ipython"), "TMPDIR": str(base),  # the notebooks' temporary runs go away
        "WORKBENCH_CACHE": str(base / "cache"), "PYTHONUNBUFFERED": "1",
    }
    if not NORMAL:
        env["WORKBENCH_QUICK"] = "1"
    token = secrets.token_hex(16)
    port = _free_port()
    log_path = base / "lab.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
         "--allow-root", "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # a bound for a busy machine, not a goal
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=10) as r:
                if r.status == 200:
                    break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("jupyter lab did not start:\n" + log_path.read_text())
            time.sleep(0.5)
    yield Lab(url, token, root, log_path)
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _shot_dir(tmp_path: Path) -> Path:
    out = Path(os.environ["JUPYTERLAB_SHOTS"]) if os.environ.get("JUPYTERLAB_SHOTS") else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


def _run_all(page, lab: Lab, name: str) -> None:
    # a workspace of its own: JupyterLab would otherwise reopen the notebooks of the earlier tests beside it
    page.goto(f"{lab.url}/lab/workspaces/{Path(name).stem}/tree/notebooks/{name}?token={lab.token}")
    # the notebook's cells are in and the kernel has started ("Python 3 (ipykernel) | Idle" in the status bar)
    page.wait_for_function(
        """() => document.querySelectorAll('.jp-NotebookPanel .jp-Cell').length > 1
                 && /\\| Idle/.test(document.querySelector('#jp-main-statusbar').textContent)""",
        timeout=180_000, polling=500,
    )
    page.click('.lm-MenuBar-itemLabel:text-is("Run")')
    page.click('.lm-Menu-itemLabel:text-is("Run All Cells")')
    # Run All queues every cell ([*]); done when none is queued or running and the kernel is idle. A cell that
    # raises cancels the ones after it (their prompt goes blank): the saved notebook then says which did not run.
    prompts = f"[...document.querySelectorAll('{PANEL} .jp-CodeCell .jp-InputPrompt')].map(p => p.textContent)"
    page.wait_for_function(f"() => {prompts}.some(t => /\\[(\\*|\\d+)\\]/.test(t))", timeout=120_000)
    page.wait_for_function(
        f"""() => !{prompts}.some(t => t.includes('*'))
                  && /\\| Idle/.test(document.querySelector('#jp-main-statusbar').textContent)""",
        timeout=RUN_TIMEOUT_S * 1000, polling=1000,
    )
    page.wait_for_timeout(3000)  # charts draw after the kernel is idle (Vega, Bokeh documents)
    page.click('.lm-MenuBar-itemLabel:text-is("File")')
    page.click('.lm-Menu-itemLabel:text-is("Save Notebook")')
    page.wait_for_function("() => !document.querySelector('.lm-TabBar-tab.jp-mod-dirty')", timeout=60_000)


def _saved_problems(path: Path) -> list[str]:
    book = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(book.cells):
        if cell.cell_type != "code":
            continue
        if cell.execution_count is None:
            found.append(f"cell {i} did not run")
        for out in cell.outputs:
            if out.output_type == "error":
                found.append(f"cell {i}: {out.ename}: {out.evalue}")
    return found


def _loader_cells(path: Path) -> list[int]:
    """Cells that load JS (pn.extension, output_notebook): their outputs draw nothing by design."""
    book = nbformat.read(path, as_version=4)
    loaders = {"application/vnd.bokehjs_load.v0+json", "application/vnd.holoviews_load.v0+json"}
    return [i for i, cell in enumerate(book.cells) if cell.cell_type == "code"
            and any(loaders & set(o.get("data", {})) for o in cell.outputs)]


def _blank_outputs(page, skip: list[int]) -> list[str]:
    """Rich outputs the page shows with no size, and Vega charts without a canvas/SVG, by cell index."""
    return page.evaluate(
        """([invisible, skip]) => {
            const found = [];
            const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')];
            cells.forEach((cell, i) => {
                if (skip.includes(i)) return;
                cell.querySelectorAll('.jp-OutputArea-output').forEach(out => {
                    const mime = out.getAttribute('data-mime-type') || '';
                    if (invisible.includes(mime) || mime.startsWith('application/vnd.jupyter.std')) return;
                    const box = out.getBoundingClientRect();
                    if (box.height < 5 || box.width < 5)
                        found.push(`cell ${i}: ${mime || 'output'} is blank (${box.width}x${box.height})`);
                    // a Vega output, or an HTML one holding a Vega/Altair chart, must have drawn its marks
                    const vega = mime.startsWith('application/vnd.vega')
                        || out.querySelector('.vega-embed, [id^="altair-viz"]');
                    if (vega && !out.querySelector('canvas, svg.marks'))
                        found.push(`cell ${i}: Vega chart not drawn`);
                });
            });
            return found;
        }""",
        [sorted(INVISIBLE), skip],
    )


def _screenshots(page, prefix: Path) -> None:
    """The whole notebook, one screenshot per screenful (the notebook scrolls inside its own panel)."""
    scroller = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"
    total, step = page.evaluate(f"() => {{ const s = document.querySelector('{scroller}'); "
                                f"return [s.scrollHeight, s.clientHeight]; }}")
    last = max(total - step, 0)
    for i, top in enumerate([*range(0, last, max(step - 50, 100)), last]):
        page.evaluate(f"() => {{ document.querySelector('{scroller}').scrollTop = {top}; }}")
        page.wait_for_timeout(300)
        page.screenshot(path=f"{prefix}_{i:02d}.png")


def _glossary_problems(page) -> list[str]:
    """The dashboard in a notebook: a click on a term of art opens the glossary at its entry, as served (the
    glossary's own listener, `workbench.ui.learn.Glossary`; nothing reaches the kernel but the cards' state)."""
    link = page.locator(f'{PANEL} .wb-header a.term[href="#glossary-head"]').first
    link.scroll_into_view_if_needed(timeout=60_000)
    link.click()
    lit = page.locator(f"{PANEL} dl.glossary dt#glossary-head.glossary-hit")
    try:
        lit.wait_for(timeout=60_000)
        page.wait_for_function("e => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.bottom <= "
                               "innerHeight; }", arg=lit.element_handle(), timeout=60_000)
    except Exception as e:  # noqa: BLE001 - said as a problem with the others
        return [f"glossary: a click on a term did not show its entry ({type(e).__name__})"]
    return []


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_renders_in_jupyterlab(lab, page, name, tmp_path):
    requests, page_errors, console_errors = [], [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.set_viewport_size({"width": 1400, "height": 1000})

    _run_all(page, lab, name)

    problems = [f"saved notebook: {p}" for p in _saved_problems(lab.root / "notebooks" / name)]
    problems += [f"page: {p}" for p in _blank_outputs(page, _loader_cells(lab.root / "notebooks" / name))]
    if name == "01_tour.ipynb":  # the notebook that shows the whole dashboard
        problems += _glossary_problems(page)
    _screenshots(page, _shot_dir(tmp_path) / Path(name).stem)
    problems += [f"page error: {e}" for e in page_errors] + [f"console error: {e}" for e in console_errors]
    problems += [f"request left the machine: {u}" for u in requests
                 if not u.startswith((lab.url + "/", "data:", "blob:"))]
    assert problems == [], "\n".join(problems)
