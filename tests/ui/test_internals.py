"""The Internals tab tells the truth (issue 28 point 4): the schedule comes from the checkpoint's stored training
config and coincides with the learning rate its log recorded (every shipped checkpoint, and a test one trained
here with noam); validation curves are drawn from the `valid_*` rows the trainer writes; masks name pieces."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from app_fixtures import FACTOR, WARMUP, build_checkpoint  # noqa: E402

from workbench.charts import mask_view, training_curves_chart  # noqa: E402
from workbench.checkpoint.format import read_log  # noqa: E402
from workbench.training.schedule import noam  # noqa: E402
from workbench.ui.views import checkpoint_schedule  # noqa: E402

SHIPPED = sorted(p for p in (Path(__file__).resolve().parents[2] / "checkpoints").iterdir()
                 if (p / "meta.json").is_file())


def _gap(frame) -> float:
    logged = frame[frame.source == "logged (checkpoint)"].set_index("step").lr
    drawn = frame[frame.source != "logged (checkpoint)"].set_index("step").lr
    return float(((drawn - logged).abs() / logged.abs().max()).max())


@pytest.mark.parametrize("ckpt", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_checkpoints_schedule_coincides_with_its_logged_lr(ckpt):
    meta = json.loads((ckpt / "meta.json").read_text())
    log = read_log(ckpt / "train_log.jsonl")
    frame, words = checkpoint_schedule(meta["train_config"], log)
    assert words.startswith(meta["train_config"]["schedule"])  # e.g. warmup_cosine, not a noam default
    assert f"warm-up {meta['train_config']['warmup']} steps" in words
    assert _gap(frame) < 1e-3  # the time-budget cosine is read at the log's run time, which is rounded


def test_a_noam_checkpoint_by_hand(tmp_path):
    ckpt = build_checkpoint(tmp_path / "noam", steps=40)
    meta = json.loads((ckpt / "meta.json").read_text())
    frame, words = checkpoint_schedule(meta["train_config"], read_log(ckpt / "train_log.jsonl"))
    drawn = frame[frame.source != "logged (checkpoint)"]
    d_model = meta["train_config"]["model"]["d_model"]
    assert list(drawn.lr) == pytest.approx([noam(s, d_model=d_model, warmup=WARMUP, factor=FACTOR) for s in drawn.step])
    assert _gap(frame) == 0.0 and "noam" in words
    with pytest.raises(ValueError, match="no training config"):
        checkpoint_schedule(None, [])


def test_validation_curves_come_from_the_trainers_valid_rows():
    log = [{"step": s, "loss": 5 - s / 10, "lr": 1e-3} for s in range(1, 41)]
    log += [{"step": s, "kind": "valid", "valid_loss": 4.0 - s / 40, "valid_bleu": s / 4, "valid_chrf": s}
            for s in (20, 40)]
    spec = training_curves_chart(log).to_dict()
    metrics = {row["metric"] for row in next(iter(spec["datasets"].values()))}
    assert {"valid_loss", "valid_bleu", "valid_chrf", "loss", "lr"} <= metrics


def test_masks_are_labelled_with_pieces():
    src = torch.tensor([[5, 6, 2], [5, 2, 0]])
    tgt = torch.tensor([[1, 7, 8], [1, 7, 0]])
    layout = mask_view(src, tgt, pad_id=0, src_pieces=["▁Ein", "▁Hund", "</s>"], tgt_pieces=["<s>", "▁A", "▁dog"])
    causal, cross = layout.children[0].children[1], layout.children[0].children[2]
    assert list(causal.yaxis[0].major_label_overrides.values()) == ["0: <s>", "1: ▁A", "2: ▁dog"]
    assert list(cross.xaxis[0].major_label_overrides.values()) == ["0: ▁Ein", "1: ▁Hund", "2: </s>"]
    assert cross.xaxis[0].axis_label == "key: source token"


def test_the_confidence_is_measured_once_per_checkpoint_for_every_page(tmp_path, monkeypatch):
    # one cache keyed by checkpoint (issue 37 pt 6): the tab had kept its own per page, keyed by the label
    from workbench.ui import loader, views, work
    from workbench.ui.session import Session

    build_checkpoint(tmp_path / "alpha", seed=0, steps=0)
    entries, _ = loader.discover([tmp_path], default=None)
    calls = []

    def measured(tm, *, limit):
        calls.append(limit)
        raise FileNotFoundError("no validation text beside this checkpoint")

    monkeypatch.setattr(work, "checkpoint_confidence", measured)
    pages = [Session(entries, checkpoint="alpha", sentence="Ein Hund läuft.") for _ in range(2)]
    answers = [work.confidence(p.result.model, views.InternalsView.CONFIDENCE_SENTENCES) for p in pages]
    assert calls == [views.InternalsView.CONFIDENCE_SENTENCES]  # measured once, the failure kept (not retried)
    assert answers[0] is answers[1] and isinstance(answers[0], FileNotFoundError)
    tab = views.InternalsView(session=pages[1])
    tab.show()
    assert "could not be measured: no validation text" in _text(tab.content)


def _text(objects) -> str:
    return " ".join(_text(o.objects) if hasattr(o, "objects") else str(getattr(o, "object", "")) for o in objects)


def test_the_confidence_is_measured_by_a_heavy_job_off_the_pages_thread(tmp_path, monkeypatch):
    """Model work of the tab (issue 37 point 6): not in `compute` (the page's interactive thread) but a heavy job
    through `work.measured_confidence` (a worker process when served), shown when it lands and then kept for every
    page of the process."""
    from workbench.analysis.training_dynamics.confidence import Confidence
    from workbench.ui import loader, views, work
    from workbench.ui.session import Session

    build_checkpoint(tmp_path / "alpha", seed=0, steps=0)
    entries, _ = loader.discover([tmp_path], default=None)
    loader.CACHE.clear()
    jobs = []
    fake = Confidence(gold=np.array([0.5, 0.25]), top=np.array([0.5, 0.75]), smoothing=0.1, vocab=40, sentences=2)

    def measured(snapshot, sentences):
        jobs.append((type(snapshot).__name__, sentences))
        return fake, "test text"

    monkeypatch.setattr(views, "measured_confidence", measured)
    monkeypatch.setattr(work, "checkpoint_confidence", lambda *a, **k: pytest.fail("measured on the page's thread"))
    page = Session(entries, checkpoint="alpha", sentence="Ein Hund läuft.")
    tab = views.InternalsView(session=page)
    tab.show()
    assert jobs == [("Snapshot", views.InternalsView.CONFIDENCE_SENTENCES)]
    shown = _text(tab.content)
    assert "Measuring" not in shown and "Measured on test text" in shown
    again = views.InternalsView(session=Session(entries, checkpoint="alpha", sentence="Ein Hund läuft."))
    again.show()
    assert len(jobs) == 1 and "Measured on test text" in _text(again.content)  # kept for the next page


def test_the_sentences_embeddings_are_the_encoders_input_by_hand(tmp_path):
    """Internals' embedding view (the tour's first stop): token embedding × √d, positional encoding and their sum,
    read at the model's hook points, equal the model's own modules applied by hand; the tab draws all three for the
    page's sentence, one row per source piece, and the two vectors' lengths."""
    from bokeh.models import Plot

    from workbench.ui import loader, views
    from workbench.ui.session import Session
    from workbench.ui.work import encoder_input

    build_checkpoint(tmp_path / "alpha", seed=0, steps=0)
    entries, _ = loader.discover([tmp_path], default=None)
    page = Session(entries, checkpoint="alpha", sentence="Ein Hund läuft.")
    r, model = page.result, page.result.model.model
    e = encoder_input(page.result.model, r.src_ids)
    ids = torch.tensor([list(r.src_ids)])
    with torch.no_grad():
        tok = (model.src_embed(ids) * model.embed_scale)[0].numpy()
        pos = model.positions(ids.size(1))[-ids.size(1):].reshape(ids.size(1), -1).numpy()
    np.testing.assert_allclose(e["tok"], tok, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(e["pos"], pos, rtol=1e-6, atol=1e-6)
    assert not e["normed"]
    np.testing.assert_allclose(e["embed"], tok + pos, rtol=1e-6, atol=1e-5)
    assert e["tok"].shape[0] == len(r.src_pieces)

    tab = views.InternalsView(session=page)
    tab.show()
    assert "Embeddings of this sentence" in _text(tab.content)
    plots = [p for o in tab.content for p in getattr(o, "objects", []) if isinstance(getattr(p, "object", None), Plot)]
    titles = [p.object.title.text for p in plots]
    assert any(t.startswith("token embedding × ") for t in titles) and "positional encoding" in titles
    assert "length of each vector" in titles
    rows = [p.object for p in plots if p.object.title.text == "length of each vector"][0].x_range.factors
    assert len(rows) == len(r.src_pieces) and rows[0] == f"0:{r.src_pieces[0]}"


def test_a_stopped_confidence_measurement_says_so_and_runs_again_when_the_tab_is_reopened(tmp_path, monkeypatch):
    from workbench.ui import loader, views
    from workbench.ui.session import Session

    build_checkpoint(tmp_path / "alpha", seed=0, steps=0)
    entries, _ = loader.discover([tmp_path], default=None)
    loader.CACHE.clear()
    page = Session(entries, checkpoint="alpha", sentence="Ein Hund läuft.")
    tab = views.InternalsView(session=page)
    calls = []
    real_submit = tab.session.lane

    def lane(name, heavy=False):  # the confidence lane's job is stopped by another heavy job of the page
        made = real_submit(name, heavy=heavy)
        if name.startswith("InternalsConfidence"):
            made.submit = lambda *a, stopped=None, **k: calls.append(a) or stopped()
        return made

    monkeypatch.setattr(tab.session, "lane", lane)
    tab.show()
    assert len(calls) == 1 and "measurement stopped" in _text(tab.content)
    tab.active = False
    tab.show()  # reopened: measured again
    assert len(calls) == 2
