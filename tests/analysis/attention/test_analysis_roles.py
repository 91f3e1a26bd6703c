"""Head roles: each test fires on a constructed head that has the property and on no other; thresholds print."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from workbench.analysis.attention.head_stats import head_stats
from workbench.analysis.attention.roles import HeadRoles, RoleRules, head_roles
from workbench.core.trace import Trace

L = 6


def _stats():
    src = torch.tensor([[5, 6, 7, 8, 9, 2]])  # 9 is the rarest token, 7 punctuation, EOS last
    tgt = torch.tensor([[1, 5, 6, 7, 8, 9]])
    prev = torch.zeros(L, L)
    prev[0, 0] = 1
    for i in range(1, L):
        prev[i, i - 1] = 1
    nxt = torch.zeros(L, L)
    for i in range(L - 2):
        nxt[i, i + 1] = 1
    nxt[L - 2, L - 2] = nxt[L - 1, L - 1] = 1
    eos = torch.zeros(L, L)
    eos[:, -1] = 1
    rare = torch.zeros(L, L)
    rare[:, 4] = 1
    uniform = torch.full((L, L), 1 / L)
    causal = torch.tril(torch.ones(L, L))
    causal = causal / causal.sum(-1, keepdim=True)
    cross = torch.stack([torch.eye(L), uniform])[None]  # two cross heads
    trace = Trace({"enc.0.self_attn.hook_probs": torch.stack([prev, nxt, eos, rare])[None],
                   "dec.0.self_attn.hook_probs": torch.stack([causal, causal])[None],
                   "dec.0.cross_attn.hook_probs": cross}, src=src, tgt=tgt)
    counts = torch.full((12,), 50)
    counts[9] = 1
    return head_stats(trace, pad_id=0, eos_id=2, src_punct=[7], src_counts=counts, tgt_counts=counts)


def test_roles_follow_the_thresholds():
    aer = pd.DataFrame({"layer": [0, 0, 0], "head_index": [0, 1, "mean"], "aer": [0.30, 0.80, 0.5]})
    roles = head_roles(_stats(), aer=aer, diagonal_aer=0.6, rules=RoleRules(positional=0.75))
    assert roles.of("enc_self", 0, 0) == ["previous"]
    assert roles.of("enc_self", 0, 1) == ["next"]
    assert roles.of("enc_self", 0, 2) == ["eos"]
    assert roles.of("enc_self", 0, 3) == ["rare"]
    assert roles.of("cross", 0, 0) == ["alignment"] and roles.of("cross", 0, 1) == []
    assert roles.of("dec_self", 0, 0) == []
    assert roles.counts()["enc_self"] == {"previous": 1, "next": 1, "alignment": 0, "eos": 1, "punct": 0, "rare": 1,
                                         "none": 0}
    text = str(roles)
    assert ">= 75% of rows" in text and "AER below the diagonal aligner's 60.0 %" in text
    assert "cross:0:0  alignment" in text
    # the next-token head's last row stays on itself (rows 0-3 of the 5 with a next key point ahead: 80 %)
    assert roles.table.loc[1, "next_top"] == pytest.approx(0.8)
    assert head_roles(_stats(), rules=RoleRules(positional=0.85)).of("enc_self", 0, 1) == []


def test_bad_role_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="give both aer"):
        head_roles(_stats(), diagonal_aer=0.5)
    with pytest.raises(ValueError, match="must be in"):
        RoleRules(eos=0)
    with pytest.raises(KeyError, match="no head"):
        HeadRoles(head_roles(_stats()).table).of("cross", 3, 0)


def test_heads_command_prints_roles_with_thresholds(tmp_path, capsys):
    from model_helpers import ROOT, SHARED_DATA

    from workbench.cli import main

    rwth = SHARED_DATA / "alignments" / "rwth-deen"
    if not (rwth / "test.talp").is_file():
        pytest.skip("needs ../shared/data/alignments")
    files = {}
    for name, lines in {"src": ["Ein Hund läuft .", "Zwei Männer spielen ."], "ref": ["A dog runs .", "Two men play ."],
                        "gde": (rwth / "test.de").read_text().splitlines()[:6],
                        "gen": (rwth / "test.en").read_text().splitlines()[:6],
                        "gold": (rwth / "test.talp").read_text().splitlines()[:6]}.items():
        files[name] = tmp_path / name
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    ckpt = str(ROOT / "checkpoints" / "multi30k-de-en")
    args = ["heads", ckpt, "--src", str(files["src"]), "--ref", str(files["ref"]), "--out", str(tmp_path / "o")]
    assert main([*args, "--gold-src", str(files["gde"])]) == 2
    assert "give all three of --gold-src, --gold-tgt and --gold" in capsys.readouterr().err
    assert main([*args, "--gold-src", str(files["gde"]), "--gold-tgt", str(files["gen"]), "--gold",
                 str(files["gold"])]) == 0
    out = capsys.readouterr().out
    assert "alignment (awi, 6 gold pairs): best head cross:" in out and ">= 90% of rows" in out
    table = pd.read_csv(tmp_path / "o" / "roles.csv")
    aer = pd.read_csv(tmp_path / "o" / "aer.csv")
    assert len(table) == 48 and len(aer) == 16 and table["aer"].notna().sum() == 16
