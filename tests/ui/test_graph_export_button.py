"""The Graph tab's circuit-tracer download, without a browser, on a real (tiny) checkpoint: disabled until a graph
is shown, then the shown graph as a circuit-tracer graph file that validates, with the token's probability as the
model gives it and the shown sentence's pieces as its prompt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from workbench.analysis.attribution.graph_export import validate_circuit_tracer  # noqa: E402
from workbench.ui.graph_view import GraphView, sentence_tensors  # noqa: E402
from workbench.ui.session import Session  # noqa: E402


def test_the_circuit_tracer_download_is_the_shown_graph(entries):
    session = Session(entries, checkpoint="alpha", sentence="Ein Hund läuft durch den Park.")
    view = GraphView(session=session)
    assert view._export_ct.disabled and json.loads(view.export_circuit_tracer().getvalue()) == {}
    view.position = 1
    view.show()
    assert not view._export_ct.disabled and view._export_ct.filename == "alpha_graph_tok1-thr0.8-cap100.json"
    data = json.loads(view.export_circuit_tracer().getvalue())
    validate_circuit_tracer(data)
    r = session.result
    assert data["metadata"]["prompt_tokens"] == [*r.src_pieces, "<s>", r.out_pieces[0]]
    logit = next(n for n in data["nodes"] if n["feature_type"] == "logit")
    model = r.model.model
    src, tgt = sentence_tensors(r.model, r.src_ids, r.out_ids, 1)
    with torch.no_grad():
        p = float(model(src, tgt)[0, 1].float().softmax(-1)[r.out_ids[1]])
    assert logit["token_prob"] == pytest.approx(p, rel=1e-5) and logit["feature"] == r.out_ids[1]
