"""Importers never run code from a downloaded file, and bad files fail with errors that name the problem."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from importer_helpers import fsmt_model, fsmt_to_fairseq, marian_model

from workbench.importers.errors import ConversionError, UnsafeCheckpointError
from workbench.importers.fairseq import import_fairseq
from workbench.importers.marian import convert_marian, import_marian
from workbench.importers.opennmt import import_opennmt
from workbench.importers.reading import read_state_dict, torch_load


class Exploit:
    """Unpickling this calls os.system: the classic malicious-checkpoint payload."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _state():
    return fsmt_to_fairseq(fsmt_model().state_dict(), fused=False, old_norms=False)


@pytest.mark.parametrize("container", ["zip", "raw_pickle"])
@pytest.mark.parametrize("importer", ["fairseq", "opennmt", "read_state_dict"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, container, importer):
    marker = tmp_path / "pwned"
    payload = {"model": _state(), "args": None, "extra_state": Exploit(marker)}
    path = tmp_path / "model.pt"
    if container == "zip":
        torch.save(payload, path)
    else:  # a pre-1.6 style plain pickle stream
        path.write_bytes(pickle.dumps(payload, protocol=2))
    # the payload really is live: plain pickle would run it (checked on a harmless copy of the call)
    assert pickle.loads(pickle.dumps(Exploit(tmp_path / "control"))) == 0 and (tmp_path / "control").exists()
    run = {"fairseq": import_fairseq, "opennmt": import_opennmt, "read_state_dict": read_state_dict}[importer]
    with pytest.raises(UnsafeCheckpointError, match=r"refused to load .*model\.pt.*nothing from it was executed"):
        run(path)
    assert not marker.exists(), "the pickled command ran"


def test_a_newer_protocol_pickle_is_refused_with_one_message_and_no_torch_warning(tmp_path):
    """Python's default pickle protocol (4+) is one torch's restricted unpickler does not read: refused with the
    reason, and torch's "Detected pickle protocol" warning, which only repeated it, is not printed beside it."""
    import warnings

    marker = tmp_path / "pwned"
    path = tmp_path / "model.pt"
    path.write_bytes(pickle.dumps({"model": {}, "x": Exploit(marker)}, protocol=4))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(UnsafeCheckpointError, match="nothing from it was executed"):
            torch_load(path)
    assert not [w for w in seen if "pickle protocol" in str(w.message)] and not marker.exists()


def test_the_refusal_names_the_offending_global(tmp_path):
    torch.save({"model": {}, "x": Exploit(tmp_path / "m")}, tmp_path / "model.pt")
    with pytest.raises(UnsafeCheckpointError, match=r"(posix|os|nt)\.system"):
        torch_load(tmp_path / "model.pt")


def test_marian_pytorch_model_bin_with_payload_is_refused(tmp_path):
    hf = marian_model()
    hf.config.to_json_file(tmp_path / "config.json")
    torch.save({**hf.state_dict(), "evil": Exploit(tmp_path / "pwned")}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError):
        import_marian(tmp_path)
    assert not (tmp_path / "pwned").exists()


def test_truncated_files_give_a_clear_error(tmp_path):
    torch.save({"model": _state()}, tmp_path / "model.pt")
    data = (tmp_path / "model.pt").read_bytes()
    (tmp_path / "model.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConversionError, match=r"model\.pt.*truncated or in another format"):
        import_fairseq(tmp_path / "model.pt")
    hf = marian_model()
    hf.save_pretrained(tmp_path / "opus")
    st = tmp_path / "opus" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:1000])
    with pytest.raises(ConversionError, match=r"model\.safetensors.*truncated"):
        import_marian(tmp_path / "opus")


def test_wrong_format_files_give_a_clear_error(tmp_path):
    (tmp_path / "model.pt").write_text("this is not a checkpoint\n")
    with pytest.raises(ConversionError, match=r"model\.pt.*truncated or in another format"):
        import_fairseq(tmp_path / "model.pt")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ConversionError, match=r"not a fairseq checkpoint"):
        import_fairseq(tmp_path / "list.pt")
    with pytest.raises(ConversionError, match=r"not an OpenNMT-py checkpoint"):
        import_opennmt(tmp_path / "list.pt")
    (tmp_path / "bart").mkdir()
    (tmp_path / "bart" / "config.json").write_text('{"model_type": "bart"}')
    with pytest.raises(ConversionError, match=r"describes a 'bart' model, not marian"):
        import_marian(tmp_path / "bart")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ConversionError, match=r"empty\.pt is empty"):
        import_fairseq(tmp_path / "empty.pt")


def test_missing_extra_and_misshaped_marian_keys_are_named():
    hf = marian_model()
    sd, cfg = hf.state_dict(), hf.config.to_dict()
    missing = {k: v for k, v in sd.items() if k != "model.decoder.layers.0.fc1.weight"}
    with pytest.raises(ConversionError, match=r"missing key 'model\.decoder\.layers\.0\.fc1\.weight'"):
        convert_marian(missing, cfg)
    with pytest.raises(ConversionError, match=r"unexpected key 'model\.encoder\.layers\.9\.fc1\.weight'"):
        convert_marian({**sd, "model.encoder.layers.9.fc1.weight": torch.zeros(24, 16)}, cfg)
    bad = {**sd, "model.encoder.layers.1.self_attn.k_proj.weight": torch.zeros(16, 15)}
    with pytest.raises(ConversionError, match=r"enc\.1\.self_attn\.k_proj\.weight.*\(16, 15\).*\(16, 16\)"):
        convert_marian(bad, cfg)
    tied = {**sd, "model.decoder.embed_positions.weight": torch.zeros_like(sd["model.decoder.embed_positions.weight"])}
    with pytest.raises(ConversionError, match=r"embed_positions.*positions would differ"):
        convert_marian(tied, cfg)
