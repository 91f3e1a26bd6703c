"""Fetching published checkpoints for online users: Hugging Face hub ids and plain URLs, cached.

Offline (or behind a firewall) the error says so plainly and tells the user to pass a local path.
Only files are fetched; nothing is executed, and archives are unpacked with tarfile's "data" filter
(no absolute paths, no links out of the folder).
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

HF_FILES = {
    "marian": (["config.json", "source.spm", "target.spm", "vocab.json"],
               ["model.safetensors|pytorch_model.bin"], ["generation_config.json", "target_vocab.json"]),
    "fsmt": (["config.json", "vocab-src.json", "vocab-tgt.json", "merges.txt"],
             ["model.safetensors|pytorch_model.bin"], ["generation_config.json", "tokenizer_config.json"]),
}


class NetworkUnreachable(OSError):
    """The download could not even start: no network, DNS failure, proxy refusal."""


def cache_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "attention-workbench"))


def fetch(url: str, dest: Path, *, quiet: bool = False) -> Path:
    """Download `url` to `dest` (atomically, with a progress bar on stderr); reuse a cached copy."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(tmp, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done = 0
            while chunk := response.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if not quiet:
                    _bar(dest.name, done, total)
        if not quiet:
            print(file=sys.stderr)
    except urllib.error.HTTPError as exc:
        tmp.unlink(missing_ok=True)
        raise FileNotFoundError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        tmp.unlink(missing_ok=True)
        raise NetworkUnreachable(
            f"network unreachable: could not download {url} ({getattr(exc, 'reason', exc)}). "
            f"Download it on a machine with internet access and pass the local path instead."
        ) from None
    tmp.replace(dest)
    return dest


def _bar(name: str, done: int, total: int) -> None:
    if total:
        filled = int(30 * done / total)
        print(f"\r{name}: [{'#' * filled}{'.' * (30 - filled)}] {done / 2**20:.1f}/{total / 2**20:.1f} MiB",
              end="", file=sys.stderr)
    else:
        print(f"\r{name}: {done / 2**20:.1f} MiB", end="", file=sys.stderr)


def from_hub(repo: str, fmt: str, *, revision: str = "main") -> Path:
    """Download a Marian/FSMT repository's files (hf:owner/name) into the cache; return the folder."""
    if fmt not in HF_FILES:
        raise ValueError(f"hub ids are supported for {sorted(HF_FILES)}, not {fmt!r}; pass a local path or URL")
    folder = cache_dir() / "hf" / repo.replace("/", "--") / revision
    required, one_of, optional = HF_FILES[fmt]
    base = f"https://huggingface.co/{repo}/resolve/{revision}/"
    for name in required:
        fetch(base + name, folder / name)
    for names in one_of:
        errors = []
        for name in names.split("|"):
            try:
                fetch(base + name, folder / name)
                break
            except FileNotFoundError as exc:
                errors.append(str(exc))
        else:
            raise FileNotFoundError(f"{repo} has none of {names.split('|')}: {errors}")
    for name in optional:
        try:
            fetch(base + name, folder / name)
        except FileNotFoundError:
            pass
    return folder


def from_url(url: str) -> Path:
    """Download a file or a .tar(.gz/.bz2) archive into the cache; archives are unpacked safely."""
    name = url.rstrip("/").rsplit("/", 1)[-1] or "download"
    folder = cache_dir() / "url" / name.split(".")[0]
    path = fetch(url, folder / name)
    if not name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2")):
        return path
    out = folder / "unpacked"
    if not out.is_dir():
        tmp = folder / "unpacking"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
        tmp.replace(out)
    entries = [p for p in out.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else out


def resolve_source(source: str, fmt: str) -> Path:
    """A local path as is; hf:owner/name from the hub; http(s):// URLs downloaded."""
    if source.startswith("hf:"):
        return from_hub(source[3:], fmt)
    if source.startswith(("http://", "https://")):
        return from_url(source)
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (use hf:owner/name or a URL to download)")
    return path
