"""Text API and `workbench translate`: line count and order survive odd input; batched == one by one;
checkpoint defaults are honoured; traces match a teacher-forced forward."""

from __future__ import annotations

import warnings

import pytest
import torch

import workbench
from workbench import Transformer, presets
from workbench.checkpoint.tokenizer import SentencePieceTokenizer
from workbench.cli import main
from workbench.core.config import DecodeConfig
from workbench.decoding.translator import TranslationModel

ODD = [
    "Ein Hund läuft über die Wiese.",
    "",
    "   ",
    "\t",
    "Steuer\x00zeichen\x07 und \x1b[31mEscapes",
    "Emoji 😀🎉👩‍👩‍👧",
    "مرحبا بالعالم",
    "שלום עולם",
    "你好，世界。日本語のテキスト",
    "Zwei  Leerzeichen   und\u00a0NBSP",
    "x",
]



def build_translation_model(data_dir, *, max_positions: int = 48, seed: int = 0) -> TranslationModel:
    """A sentencepiece model on 300 Multi30k sentence pairs and an untrained tiny Transformer."""
    de = (data_dir / "multi30k" / "train.de").read_text(encoding="utf-8").splitlines()[:300]
    en = (data_dir / "multi30k" / "train.en").read_text(encoding="utf-8").splitlines()[:300]
    tok = SentencePieceTokenizer.train(sentences=de + en, vocab_size=400, num_threads=1)
    torch.manual_seed(seed)
    model = Transformer(presets.tiny(vocab=tok.vocab_size, max_positions=max_positions)).eval()
    return TranslationModel(model, tok, decode=DecodeConfig(beam=3, max_len_a=1.0, max_len_b=4))


@pytest.fixture(scope="module")
def tm():
    from model_helpers import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data not found at {SHARED_DATA}; set WORKBENCH_DATA")
    return build_translation_model(SHARED_DATA)


def test_line_count_and_order_survive_odd_input(tm):
    out = tm.translate(ODD)
    assert len(out) == len(ODD)
    for src, hyp in zip(ODD, out):
        assert "\n" not in hyp and "\r" not in hyp
        if not src.strip():
            assert hyp == ""
    # each line alone gives the same text: batching and sorting do not mix sentences up
    assert out == [tm.translate([s])[0] for s in ODD]


def test_rich_results(tm):
    res = tm.translate(ODD[:3], return_scores=True, n_best=2)
    assert [r.source for r in res] == ODD[:3]
    full = res[0]
    assert full.tokens[-1] == tm.model.cfg.eos_id and len(full.pieces) == len(full.tokens)
    assert full.source_tokens[-1] == tm.model.cfg.eos_id
    assert len(full.n_best) == 2 and full.n_best[0] == (full.text, full.score)
    assert res[1].score is None and res[1].tokens == [] and res[1].text == ""


def test_options_override_defaults_and_unknown_ones_are_refused(tm):
    greedy = tm.translate(ODD[:1], beam=1, return_scores=True)[0]
    beam = tm.translate(ODD[:1], beam=5, return_scores=True)[0]
    assert beam.score >= greedy.score - 1e-6
    with pytest.raises(ValueError, match="unknown decoding options"):
        tm.translate(ODD[:1], beams=4)


def test_long_input_is_truncated_with_a_warning(tm):
    long = "Hund " * 2000  # ~10,000 characters
    with pytest.warns(UserWarning, match="sentence 1 has .* truncated to 47"):
        res = tm.translate(["kurz", long], return_tokens=True)
    assert res[1].truncated and len(res[1].source_tokens) == tm.model.cfg.max_positions
    assert len(res[1].tokens) <= tm.model.cfg.max_positions


def test_trace_matches_teacher_forced_forward(tm):
    r = tm.trace(ODD[0])
    trace = r.trace
    assert trace.meta["translation"] == r.text
    assert trace.meta["src_pieces"] == tm.src_tokenizer.pieces(r.source_tokens)
    assert len(trace.meta["tgt_pieces"]) == trace.tgt.size(1) == len(r.tokens)
    _, ref = tm.model.run_with_cache(trace.src, trace.tgt)
    for name in ref:
        torch.testing.assert_close(trace[name], ref[name], atol=1e-6, rtol=0)


def test_score_teacher_forces_what_greedy_produced(tm):
    """Two paths agree: greedy's own log-probability and attention vs `score` on its output (ids or text)."""
    r = tm.trace(ODD[0], beam=1)
    forced = tm.score(ODD[0], r.tokens, trace=True)
    assert forced.log_prob == pytest.approx(r.log_prob, abs=1e-4) and forced.tokens == r.tokens
    assert forced.source_tokens == r.source_tokens and forced.text == r.text
    for name in r.trace:
        torch.testing.assert_close(forced.trace[name], r.trace[name], atol=1e-5, rtol=0)
    by_text = tm.score(r.source_tokens, "ein Hund")
    assert by_text.tokens == [*tm.tgt_tokenizer.encode("ein Hund"), tm.model.cfg.eos_id] and by_text.trace is None
    assert by_text.log_prob < 0
    with pytest.warns(UserWarning, match="truncated to 47"):
        assert len(tm.score(ODD[0], "Hund " * 200).tokens) == tm.model.cfg.max_positions
    with pytest.raises(ValueError, match="non-empty"):
        tm.score("", "x")


def test_line_breaks_in_output_become_spaces(tm):
    newline_piece = tm.tgt_tokenizer.sp.piece_to_id("<0x0A>")
    assert tm.tgt_tokenizer.decode([newline_piece]) == "\n"  # the byte piece exists
    assert tm.detokenize([newline_piece, tm.model.cfg.eos_id]) == " "


def test_checkpoint_load_honours_generation_defaults(tm, tmp_path):
    from workbench.checkpoint.format import save_checkpoint

    meta = {"generation": {"beam": 1, "length_penalty": {"kind": "gnmt", "alpha": 0.6}, "max_len_b": 4,
                           "append_eos": False}}
    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer, tgt_tokenizer=tm.tgt_tokenizer,
                    meta=meta)
    loaded = workbench.load(tmp_path / "ck")
    assert isinstance(loaded, workbench.TranslationModel)
    cfg = loaded.decode_config
    assert (cfg.beam, cfg.length_penalty, cfg.alpha, cfg.max_len_b) == (1, "gnmt", 0.6, 4)
    assert loaded.append_eos is False
    r = loaded.translate(ODD[:1], return_tokens=True)[0]
    assert r.source_tokens[-1] != loaded.model.cfg.eos_id
    # the same weights and settings in memory give the same text
    same = TranslationModel(tm.model, tm.src_tokenizer, decode=cfg, append_eos=False)
    assert same.translate(ODD) == loaded.translate(ODD)
    assert workbench.load(tmp_path / "ck", beam=2).decode_config.beam == 2


def test_cli_translate_preserves_lines(tm, tmp_path):
    from workbench.checkpoint.format import save_checkpoint

    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer)
    src = tmp_path / "in.txt"
    src.write_bytes(("\n".join(ODD) + "\n").replace("\n", "\r\n", 1).encode("utf-8"))
    out = tmp_path / "out.txt"
    rc = main(["translate", "--checkpoint", str(tmp_path / "ck"), "--input", str(src), "--output", str(out),
               "--beam", "3", "--max-len-a", "1", "--max-len-b", "4", "--max-tokens", "16", "--chunk", "4"])
    assert rc == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and lines[:-1] == tm.translate(ODD)


def test_cli_translate_invalid_utf8(tm, tmp_path, capsys):
    from workbench.checkpoint.format import save_checkpoint

    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer)
    src = tmp_path / "bad.txt"
    src.write_bytes(b"gut\n\nschlecht \xff\xfe hier\nwieder gut\n")
    out = tmp_path / "out.txt"
    args = ["translate", "--checkpoint", str(tmp_path / "ck"), "--input", str(src), "--output", str(out)]
    assert main(args) == 2
    assert "line 3 is not valid UTF-8 (byte 0xff at offset 9)" in capsys.readouterr().err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(args + ["--errors", "replace"]) == 0
    assert any("line 3" in str(w.message) for w in caught)
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 4 and lines[1] == ""


def test_cli_translate_warns_on_lines_without_words(tm, tmp_path):
    """Emoji or punctuation alone: one warning each (one stderr line under the CLI), output kept line for line;
    numbers alone are no warning (a test file's "2 : 1" translates by copying), nor are words or an empty line."""
    from workbench.checkpoint.format import save_checkpoint

    save_checkpoint(tmp_path / "ck", tm.model, src_tokenizer=tm.src_tokenizer)
    src = tmp_path / "in.txt"
    src.write_text("gut\n😀😀😀\n123 456\n\n!!! ?\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["translate", "--checkpoint", str(tmp_path / "ck"), "--input", str(src), "--output",
                     str(out)]) == 0
    assert [str(w.message) for w in caught if "no words" in str(w.message)] == [
        f"line {n} has no words (no letters or digits): its translation means nothing" for n in (2, 5)]
    assert len(out.read_text(encoding="utf-8").split("\n")[:-1]) == 5


def test_stream_holds_chunks(tm):
    consumed = []

    def lines():
        for i, s in enumerate(ODD * 3):
            consumed.append(i)
            yield s

    stream = tm.translate_lines(lines(), chunk=5)
    first = next(stream)
    assert len(consumed) == 5  # only the first chunk was read
    assert [first, *stream] == tm.translate(ODD * 3)
