"""Downloads from a local HTTP server (127.0.0.1, a thread): cache keyed by the whole URL, refreshed when
the server's file changes, unsafe or oversized archives refused in one line, no process-wide opener."""

from __future__ import annotations

import http.server
import io
import socket
import tarfile
import threading
import urllib.request
from pathlib import Path

import pytest
import torch

from workbench.corpus.download import (
    NetworkUnreachable,
    UnsafeArchiveError,
    download,
    fetch,
    from_url,
    unpack_limit,
    url_folder,
)

PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy",
              "NO_PROXY")


class Server:
    """http.server over a folder on 127.0.0.1 in a thread; records (method, path) of every request."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str]] = []
        log = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(root), **kwargs)

            def send_head(self):
                log.append((self.command, self.path))
                return super().send_head()

            def log_message(self, *args):  # keep pytest output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def put(self, path: str, data: bytes) -> str:
        file = self.root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(data)
        return f"{self.url}/{path}"

    def gets(self) -> int:
        return sum(method == "GET" for method, _ in self.requests)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join()
            self.httpd.server_close()


@pytest.fixture
def server(tmp_path, monkeypatch):
    # the tests decide about proxies themselves; the machine's own settings must not route 127.0.0.1
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("WORKBENCH_MAX_UNPACK", raising=False)
    srv = Server(tmp_path / "www")
    yield srv
    srv.stop()


def archive(files: dict[str, bytes], *, special: list[tarfile.TarInfo] = ()) -> bytes:
    """A .tar.gz holding `files` (name -> bytes) and any extra members (links, devices) as given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in special:
            tar.addfile(info)
    return buf.getvalue()


def member(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def test_archives_with_the_same_first_name_part_or_file_name_get_their_own_cache_entries(server):
    urls = {
        "en-de": server.put("models/wmt19.en-de.joined-dict.ensemble.tar.gz",
                            archive({"wmt19.en-de/which.txt": b"en-de"})),
        "de-en": server.put("models/wmt19.de-en.joined-dict.ensemble.tar.gz",
                            archive({"wmt19.de-en/which.txt": b"de-en"})),
        "a": server.put("a/model.tar.gz", archive({"model/which.txt": b"path a"})),
        "b": server.put("b/model.tar.gz", archive({"model/which.txt": b"path b"})),
    }
    got = {key: from_url(url) for key, url in urls.items()}
    assert {key: (path / "which.txt").read_text() for key, path in got.items()} == {
        "en-de": "en-de", "de-en": "de-en", "a": "path a", "b": "path b"}
    assert len({url_folder(url) for url in urls.values()}) == 4
    # a second import of the first URL still gives the first model
    assert (from_url(urls["en-de"]) / "which.txt").read_text() == "en-de"


def test_cached_copy_is_reused_until_the_server_reports_a_change(server):
    url = server.put("ckpt/model.tar.gz", archive({"m/weights.bin": b"version 1"}))
    first = from_url(url)
    assert (first / "weights.bin").read_text() == "version 1" and server.gets() == 1
    assert from_url(url) == first and server.gets() == 1  # HEAD only: same size and date
    server.put("ckpt/model.tar.gz", archive({"m/weights.bin": b"version 2, longer"}))
    again = from_url(url)
    assert server.gets() == 2 and (again / "weights.bin").read_text() == "version 2, longer"
    server.stop()  # offline: the copy this URL wrote is used
    assert (from_url(url) / "weights.bin").read_text() == "version 2, longer"


def test_a_cache_entry_is_never_used_for_another_url(server):
    a = server.put("x/vocab.txt", b"from x")
    b = server.put("y/vocab.txt", b"from y, longer")
    dest = Path(url_folder(a)) / "vocab.txt"
    assert fetch(a, dest, quiet=True).read_text() == "from x"
    assert fetch(b, dest, quiet=True).read_text() == "from y, longer"  # same file, other URL: downloaded
    assert server.gets() == 2


@pytest.mark.parametrize("bad, message", [
    (member("../escaped.txt", tarfile.REGTYPE), "'../escaped.txt' would be written outside the unpack folder"),
    (member("/tmp/absolute.txt", tarfile.REGTYPE), "'/tmp/absolute.txt' has an absolute path"),
    (member("model/passwd", tarfile.SYMTYPE, "/etc/passwd"), "'model/passwd' is a link to an absolute path"),
    (member("model/up", tarfile.SYMTYPE, "../../../outside"), "'model/up' is a link pointing outside"),
    (member("model/hard", tarfile.LNKTYPE, "../outside"), "'model/hard' is a link pointing outside"),
    (member("model/tty", tarfile.CHRTYPE), "'model/tty' is a device node or FIFO"),
    (member("model/pipe", tarfile.FIFOTYPE), "'model/pipe' is a device node or FIFO"),
], ids=["dotdot", "absolute", "abs_symlink", "symlink_out", "hardlink_out", "device", "fifo"])
def test_escaping_members_are_refused_in_one_line_and_nothing_is_unpacked(server, tmp_path, capsys, bad, message):
    from workbench.cli import main

    url = server.put("evil/model.tar.gz", archive({"model/model.pt": b"weights"}, special=[bad]))
    with pytest.raises(UnsafeArchiveError, match=f"refused to unpack {url}: member {message}") as err:
        from_url(url)
    assert "\n" not in str(err.value) and "nothing was unpacked" in str(err.value)
    folder = url_folder(url)
    assert not (folder / "unpacked").exists() and not (folder / "unpacking").exists()
    assert not (tmp_path / "cache" / "escaped.txt").exists()
    capsys.readouterr()  # the download's progress bar
    assert main(["import", "fairseq", url, "--out", str(tmp_path / "ckpt")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "refused to unpack" in lines[0] and "Traceback" not in lines[0]


def test_unpacked_size_is_capped(server, monkeypatch):
    zeros = bytes(3 * 2**20)  # 3 MiB that gzip packs into a few KiB
    url = server.put("bomb/model.tar.gz", archive({"model/a.bin": zeros, "model/b.bin": zeros}))
    with pytest.raises(UnsafeArchiveError, match=r"unpacks to more than 4,194,304 bytes \(\d[\d,]* bytes packed\)"):
        from_url(url, max_unpacked=4 * 2**20)
    monkeypatch.setenv("WORKBENCH_MAX_UNPACK", str(5 * 2**20))
    with pytest.raises(UnsafeArchiveError, match=r"more than 5,242,880 bytes.*WORKBENCH_MAX_UNPACK"):
        from_url(url)
    monkeypatch.setenv("WORKBENCH_MAX_UNPACK", str(6 * 2**20))
    assert (from_url(url) / "b.bin").stat().st_size == len(zeros)
    # the default: 20x the packed size, at least 256 MiB; the 4.7 MB archive that unpacked to 1 GiB is refused
    assert unpack_limit(4_700_000) < 2**30 and unpack_limit(2 * 10**9) == 4 * 10**10


def test_gzip_download_for_datasets(server, tmp_path):
    import gzip

    url = server.put("data/train.de.gz", gzip.compress(b"Ein Satz.\n"))
    download(url, tmp_path / "train.de", gunzip=True)
    assert (tmp_path / "train.de").read_text(encoding="utf-8") == "Ein Satz.\n"
    with pytest.raises(FileNotFoundError, match=r"data/missing\.gz: HTTP 404"):
        download(f"{server.url}/data/missing.gz", tmp_path / "missing", gunzip=True)
    assert not (tmp_path / "missing").exists() and not (tmp_path / "missing.part").exists()


def test_named_dataset_downloads_through_the_same_module(server, tmp_path, monkeypatch):
    import gzip

    from workbench.corpus import data

    server.put("corpus/train.de.gz", gzip.compress("Ein Hund läuft.\n".encode()))
    server.put("corpus/train.en.gz", gzip.compress(b"A dog runs.\n"))
    served = data.Dataset("served", {"train": "train", "test": "absent"}, ("de", "en"),
                          url=f"{server.url}/corpus/{{stem}}.{{lang}}.gz")
    monkeypatch.setitem(data.DATASETS, "served", served)
    assert data.load_dataset("served", "train", "de", "en", tmp_path / "root") == (["Ein Hund läuft."],
                                                                                   ["A dog runs."])
    with pytest.raises(FileNotFoundError, match=r"absent\.de is missing and downloading .*HTTP 404.*offline"):
        data.dataset_files("served", "test", "de", "en", tmp_path / "root")


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_proxy_settings_are_read_per_request_and_never_installed_globally(server, monkeypatch):
    """urlopen() would build one opener with the proxy variables of its first call and keep it for the
    process, so a later test's request to 127.0.0.1 would still go to a dead proxy."""
    url = server.put("file.txt", b"hello")
    opener_before = urllib.request._opener
    dead = f"http://127.0.0.1:{_dead_port()}"
    with monkeypatch.context() as m:
        for var in ("http_proxy", "HTTP_PROXY"):
            m.setenv(var, dead)
        with pytest.raises(NetworkUnreachable, match="network unreachable"):
            download(url, Path(url_folder(url)) / "file.txt")
    # the proxy variables are gone again: the same request goes straight to the server
    assert download(url, Path(url_folder(url)) / "file.txt")["size"] == 5
    assert urllib.request._opener is opener_before
    assert server.gets() == 1


def test_hub_download_then_offline_reuse(server, tmp_path, monkeypatch):
    """hf:owner/name from a local hub (HF_ENDPOINT): imported like the local folder; a second import
    downloads nothing, and offline the cached files are used without the optional ones."""
    pytest.importorskip("transformers", reason="the hub folder is a real MarianMTModel's")
    from importer_helpers import write_marian_dir

    from workbench.importers import import_checkpoint

    write_marian_dir(server.root / "owner" / "opus-mt-xx-yy" / "resolve" / "main")
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    local = import_checkpoint("marian", server.root / "owner" / "opus-mt-xx-yy" / "resolve" / "main")
    online = import_checkpoint("marian", "hf:owner/opus-mt-xx-yy")
    files = lambda: [path for method, path in server.requests if method == "GET"]  # noqa: E731
    fetched = files()
    assert len(fetched) == 7  # config, 3 tokenizer files, weights, generation config; optional target_vocab: 404
    for name, tensor in local.model.state_dict().items():
        assert torch.equal(tensor, online.model.state_dict()[name]), name
    text = "the cat sat on the mat ."
    assert online.src_tokenizer.encode(text) == local.src_tokenizer.encode(text)
    import_checkpoint("marian", "hf:owner/opus-mt-xx-yy")
    # unchanged files are only HEAD-checked; the absent optional file is asked for again
    assert files()[len(fetched):] == ["/owner/opus-mt-xx-yy/resolve/main/target_vocab.json"]
    server.stop()
    offline = import_checkpoint("marian", "hf:owner/opus-mt-xx-yy")
    assert torch.equal(offline.model.output_proj.bias, local.model.output_proj.bias)
