"""Scores equal sacrebleu called directly on the written hypotheses; several references; bad sizes refused."""

from __future__ import annotations

import json

import pytest
import sacrebleu
from test_translator import build_translation_model

from workbench.cli import main
from workbench.decoding.evaluate import evaluate, repetition_share, score


@pytest.fixture(scope="module")
def data():
    from model_helpers import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; set WORKBENCH_DATA")
    src = (SHARED_DATA / "multi30k" / "val.de").read_text(encoding="utf-8").splitlines()[:12]
    ref = (SHARED_DATA / "multi30k" / "val.en").read_text(encoding="utf-8").splitlines()[:12]
    return build_translation_model(SHARED_DATA, max_positions=160), src, ref


def test_score_equals_sacrebleu():
    hyps = ["A dog runs on the grass.", "Two men are talking.", ""]
    refs = [["A dog is running on grass.", "Two men talk.", "A cat."],
            ["The dog runs across the lawn.", "Two guys are talking.", "Nothing."]]
    s = score(hyps, refs)
    assert s.bleu == sacrebleu.corpus_bleu(hyps, refs).score
    assert s.chrf == sacrebleu.corpus_chrf(hyps, refs).score
    assert s.bleu != score(hyps, refs[:1]).bleu  # the second reference set is used
    assert s.bleu_signature.startswith("nrefs:2|") and "tok:13a" in s.bleu_signature
    with pytest.raises(ValueError, match="reference set 2 has 2 lines"):
        score(hyps, [refs[0], refs[1][:2]])


def test_cli_evaluate_agrees_with_sacrebleu_and_the_api(data, tmp_path, capsys):
    from workbench.checkpoint.format import save_checkpoint

    tm, src, ref = data
    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer)
    (tmp_path / "src").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "ref1").write_text("\n".join(ref) + "\n", encoding="utf-8")
    (tmp_path / "ref2").write_text("\n".join(src) + "\n", encoding="utf-8")  # a second (odd) reference set
    hyp_file = tmp_path / "hyp"
    rc = main(["evaluate", "--checkpoint", str(tmp_path / "ck"), "--src", str(tmp_path / "src"),
               "--ref", str(tmp_path / "ref1"), "--ref", str(tmp_path / "ref2"), "--beam", "2",
               "--max-len-a", "1", "--max-len-b", "3", "--hyp-out", str(hyp_file), "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    hyps = hyp_file.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == len(src)
    direct_bleu = sacrebleu.corpus_bleu(hyps, [ref, src])
    assert printed["bleu"] == pytest.approx(direct_bleu.score, abs=1e-9)
    assert printed["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [ref, src]).score, abs=1e-9)
    assert printed["references"] == 2 and printed["sentences"] == len(src)
    api = evaluate(tm, src, [ref, src], beam=2, max_len_a=1.0, max_len_b=3)
    assert api.hypotheses == hyps and api.bleu == printed["bleu"] and api.chrf == printed["chrf"]

    rc = main(["evaluate", "--checkpoint", str(tmp_path / "ck"), "--src", str(tmp_path / "src"),
               "--ref", str(tmp_path / "ref1"), "--beam", "1", "--max-len-b", "2"])
    text = capsys.readouterr().out
    assert rc == 0 and text.startswith("BLEU = ") and "nrefs:1|" in text and "chrF = " in text


def test_cli_evaluate_refuses_mismatched_references(data, tmp_path, capsys):
    from workbench.checkpoint.format import save_checkpoint

    tm, src, ref = data
    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer)
    (tmp_path / "src").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(ref[:-1]) + "\n", encoding="utf-8")
    rc = main(["evaluate", "--checkpoint", str(tmp_path / "ck"), "--src", str(tmp_path / "src"),
               "--ref", str(tmp_path / "ref")])
    assert rc == 2 and f"has {len(src) - 1} lines but" in capsys.readouterr().err


def test_nothing_to_score_is_one_clear_error(data, tmp_path, capsys):
    from workbench.checkpoint.format import save_checkpoint

    with pytest.raises(ValueError, match="nothing to score: 0 hypotheses and 0 reference lines"):
        score([], [[]])
    tm, _, _ = data
    with pytest.raises(ValueError, match="nothing to score"):
        evaluate(tm, [], [[]])
    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer)
    (tmp_path / "src").write_bytes(b"")
    (tmp_path / "ref").write_bytes(b"")
    rc = main(["evaluate", "--checkpoint", str(tmp_path / "ck"), "--src", str(tmp_path / "src"),
               "--ref", str(tmp_path / "ref")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("workbench evaluate: error: nothing to score")


def test_alpha_nan_is_refused_on_the_command_line(data, tmp_path, capsys):
    from workbench.checkpoint.format import save_checkpoint

    tm, src, _ = data
    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer)
    (tmp_path / "src").write_text(src[0] + "\n", encoding="utf-8")
    rc = main(["translate", "--checkpoint", str(tmp_path / "ck"), "--input", str(tmp_path / "src"), "--alpha", "nan"])
    err = capsys.readouterr().err
    assert rc == 2 and "alpha (nan) must be a finite number >= 0" in err and "Traceback" not in err


def test_old_cli_spelling_is_refused(data, tmp_path, capsys):
    from workbench.checkpoint.format import save_checkpoint

    tm, src, _ = data
    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer)
    (tmp_path / "src").write_text("\n".join(src[:4]) + "\n", encoding="utf-8")
    common = ["translate", "--checkpoint", str(tmp_path / "ck"), "--input", str(tmp_path / "src"), "--beam", "1",
              "--max-len-b", "3"]
    assert main([*common, "--max-tokens", "20"]) == 0
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        main([*common, "--batch-tokens", "20"])
    assert "unrecognized arguments: --batch-tokens" in capsys.readouterr().err


def test_repetition_share_counts_outputs_that_loop():
    hyps = [
        "die Ergebnisse der Forschung der Forschung der Forschung der Forschung .",  # a 4-gram three times
        "der Mann und der Hund und der Mann und der Hund .",  # 4-grams twice only
        "the the the the the the",  # one 4-gram, three times
        "",
        "kurz",
    ]
    assert repetition_share(hyps) == pytest.approx(2 / 5)
    assert repetition_share(hyps, min_count=2) == pytest.approx(3 / 5)
    assert repetition_share([]) == 0.0
    assert score(hyps, [hyps]).looping == pytest.approx(40.0)
