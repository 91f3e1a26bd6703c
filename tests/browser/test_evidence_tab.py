"""The Evidence tab in a real browser: the alignment lines, the source-share bars and the role grids draw for
every method, with no console error, failed or external request, and no error message on the page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_app import TIMEOUT, open_app, submit

ROOT = Path(__file__).resolve().parents[2]


def test_evidence_tab_draws_for_every_method(page, app_server, tmp_path):
    page.set_viewport_size({"width": 1400, "height": 1200})
    watch = open_app(page, app_server + "?ckpt=demo")
    submit(page, "Ein Hund läuft im Schnee.")
    page.locator(".main-tabs").get_by_text("Evidence", exact=True).click()
    methods = page.locator(".evidence-method button")
    methods.first.wait_for(timeout=TIMEOUT)
    shots = Path(os.environ.get("EVIDENCE_SHOTS", tmp_path))
    page.get_by_text("Word alignment: fairseq's default aligner").wait_for(timeout=TIMEOUT)  # it stores none
    for i, (label, method) in enumerate([("attention weights", "weights"), ("value-weighted norms", "norms"),
                                         ("ALTI+ contributions", "alti")]):
        page.locator(".evidence-method").get_by_text(label, exact=True).click()
        page.get_by_text(f"Word alignment: {method} AWO").wait_for(timeout=TIMEOUT)  # this method's answer
        page.get_by_text("Head roles").first.wait_for(timeout=TIMEOUT)
        page.locator(".bk-Canvas, canvas").last.wait_for(timeout=TIMEOUT)
        page.wait_for_timeout(800)
        assert page.get_by_text("could not be drawn").count() == 0, label
        page.screenshot(path=str(shots / f"evidence_{i}.png"), full_page=True)
    assert watch.errors == [] and watch.external == []


# The drawn alignment, read back from the page's Bokeh documents: the words (labels on top and below) and the
# dashed links as (source word, output word) indices, found by their x positions.
DRAWN_LINKS_JS = """() => {
    for (const doc of Bokeh.documents) {
        const links = doc.get_model_by_name("alignment_links");
        if (!links) continue;
        const words = [...doc.all_models].find(m => m.type === "ColumnDataSource" && m.data.baseline);
        const d = words.data, src = [], out = [];
        for (let i = 0; i < d.text.length; i++) (d.baseline[i] === "bottom" ? src : out).push([d.x[i], d.text[i]]);
        const near = (xs, x) => xs.reduce((b, w, i) => Math.abs(w[0] - x) < Math.abs(xs[b][0] - x) ? i : b, 0);
        const l = links.data_source.data;
        const pairs = [...l.x0].map((x, i) => [near(src, x), near(out, l.x1[i])]);
        return {src: src.map(w => w[1]), out: out.map(w => w[1]), links: pairs};
    }
    return null; }"""


def test_evidence_tab_opens_on_the_checkpoints_own_aligner_and_draws_what_workbench_align_writes(
        page, app_server, tmp_path):
    """general-en-de's aligner is three trained alignment layers read as one (alignment.json): a link to its
    Evidence tab draws exactly the links `workbench align` writes for the page's sentence and output, labelled as
    that aligner with its held-out AER."""
    page.set_viewport_size({"width": 1400, "height": 1200})
    # general-en-de: the shipped default, which the server lists beside the test models
    watch = open_app(page, app_server + "?ckpt=general-en-de&tab=evidence"
                     "&src=The+committee+approved+the+report+yesterday+.")
    page.get_by_text("Word alignment: the checkpoint's aligner, 3 trained alignment layers read as one").wait_for(
        timeout=TIMEOUT)
    held_out = json.loads((ROOT / "checkpoints" / "general-en-de" / "alignment.json").read_text())["provenance"]
    page.get_by_text(f"AER {100 * held_out['held_out_aer']:.1f} % on gold lines it was not chosen on").wait_for(
        timeout=TIMEOUT)
    page.get_by_text("no link between a punctuation mark and a word").wait_for(timeout=TIMEOUT)
    page.wait_for_timeout(500)
    page.screenshot(path=str(Path(os.environ.get("EVIDENCE_SHOTS", tmp_path)) / "evidence_own_aligner.png"),
                    full_page=True)
    assert page.get_by_text("could not be used").count() == 0  # the link opened the checkpoint it names
    drawn = page.evaluate(DRAWN_LINKS_JS)
    assert drawn is not None and drawn["src"] == "The committee approved the report yesterday .".split()
    (tmp_path / "src.txt").write_text(" ".join(drawn["src"]) + "\n", encoding="utf-8")
    (tmp_path / "out.txt").write_text(" ".join(drawn["out"]) + "\n", encoding="utf-8")
    written = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "align", "--checkpoint", str(ROOT / "checkpoints" / "general-en-de"),
         str(tmp_path / "src.txt"), str(tmp_path / "out.txt")],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    assert len(written) >= 4
    assert sorted(tuple(map(int, link.split("-"))) for link in written) == sorted(map(tuple, drawn["links"]))
    assert watch.errors == [] and watch.external == []
