"""Every download the workbench makes: dataset files, Hugging Face hub files, checkpoint URLs.

Each request builds its own urllib opener with the proxies the environment names at that moment,
so nothing is installed process-wide: `urllib.request.urlopen` keeps the first opener it builds
(and the proxy variables of that moment) for the life of the process.

URL downloads are cached under $WORKBENCH_CACHE keyed by the whole URL; a cached copy is reused
only for the URL that wrote it, and only while the server reports the same ETag, size and
modification time (or cannot be reached). Archives are unpacked with tarfile's "data" filter
after every member has been checked, so a member that escapes the folder, a link out or a device
node stops the import before anything is written; the unpacked size is capped (archive bombs).
Offline, errors say so plainly and ask for a local path.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HF_FILES = {
    "marian": (["config.json", "source.spm", "target.spm", "vocab.json"],
               ["model.safetensors|pytorch_model.bin"], ["generation_config.json", "target_vocab.json"]),
    "fsmt": (["config.json", "vocab-src.json", "vocab-tgt.json", "merges.txt"],
             ["model.safetensors|pytorch_model.bin"], ["generation_config.json", "tokenizer_config.json"]),
}
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
UNPACK_RATIO = 20
"""Unpacked bytes allowed per archive byte: checkpoints barely compress, text dictionaries ~4x."""
UNPACK_FLOOR = 256 * 2**20
"""Small archives may always unpack to this much."""


class NetworkUnreachable(OSError):
    """The download could not even start: no network, DNS failure, proxy refusal."""


class ArchiveError(ValueError):
    """A downloaded archive that cannot be unpacked (corrupt, or refused by UnsafeArchiveError's rules)."""


class UnsafeArchiveError(ArchiveError):
    """An archive member would escape the folder, is a device node, or the archive unpacks too large."""


def cache_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "attention-workbench"))


# ------------------------------------------------------------------------------ requests


def open_url(url: str, *, timeout: float = 30, method: str = "GET") -> Any:
    """A response for `url` through an opener built for this call (proxies read from the environment now)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(urllib.request.getproxies()))
    return opener.open(urllib.request.Request(url, method=method), timeout=timeout)


def _unreachable(url: str, exc: BaseException) -> NetworkUnreachable:
    return NetworkUnreachable(
        f"network unreachable: could not download {url} ({getattr(exc, 'reason', exc)}). "
        f"Download it on a machine with internet access and pass the local path instead."
    )


def download(url: str, dest: Path, *, quiet: bool = True, gunzip: bool = False) -> dict[str, Any]:
    """Download `url` to `dest` atomically (progress bar on stderr unless quiet); `gunzip` decompresses
    on the way. Returns what the server said about the file (etag, size, last_modified).

    HTTP errors raise FileNotFoundError; no connection raises NetworkUnreachable."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with open_url(url) as response, open(tmp, "wb") as out:
            facts = _facts(response.headers)
            total = int(response.headers.get("Content-Length") or 0)
            if gunzip:
                shutil.copyfileobj(gzip.GzipFile(fileobj=response), out)
            else:
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
        raise _unreachable(url, exc) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(dest)
    return facts


def _facts(headers: Any) -> dict[str, Any]:
    """The validators a server may give: a cached copy is stale when any of them changed."""
    size = headers.get("Content-Length")
    return {"etag": headers.get("ETag"), "size": int(size) if size and size.isdigit() else None,
            "last_modified": headers.get("Last-Modified")}


def _server_facts(url: str) -> dict[str, Any] | None:
    """ETag/size/date from a HEAD request; None when the server cannot say (offline, HEAD refused)."""
    try:
        with open_url(url, timeout=10, method="HEAD") as response:
            return _facts(response.headers)
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError):
        return None


def _stale(stored: dict[str, Any], now: dict[str, Any] | None) -> bool:
    if now is None:
        return False  # offline or no HEAD: the copy this URL wrote is the best we have
    return any(now.get(k) is not None and stored.get(k) is not None and now[k] != stored[k]
               for k in ("etag", "size", "last_modified"))


def fetch(url: str, dest: Path, *, quiet: bool = False, check: bool = True) -> Path:
    """`url` downloaded to `dest`, reusing the copy there when this same URL wrote it and the server
    reports the same ETag/size/date (`check=False`: without asking); a `dest.source.json` beside the
    file records which URL and facts."""
    record = dest.with_name(dest.name + ".source.json")
    if dest.is_file() and record.is_file():
        try:
            stored = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stored = {}
        if stored.get("url") == url and not (check and _stale(stored, _server_facts(url))):
            return dest
    record.unlink(missing_ok=True)
    facts = download(url, dest, quiet=quiet)
    record.write_text(json.dumps({"url": url, **facts}, indent=1), encoding="utf-8")
    return dest


def _bar(name: str, done: int, total: int) -> None:
    if total:
        filled = int(30 * done / total)
        print(f"\r{name}: [{'#' * filled}{'.' * (30 - filled)}] {done / 2**20:.1f}/{total / 2**20:.1f} MiB",
              end="", file=sys.stderr)
    else:
        print(f"\r{name}: {done / 2**20:.1f} MiB", end="", file=sys.stderr)


# ------------------------------------------------------------------------------ sources


def from_hub(repo: str, fmt: str, *, revision: str = "main") -> Path:
    """Download a Marian/FSMT repository's files (hf:owner/name) into the cache; return the folder.

    Cached files are checked against the hub once it answers; offline, the cached copy is used."""
    if fmt not in HF_FILES:
        raise ValueError(f"hub ids are supported for {sorted(HF_FILES)}, not {fmt!r}; pass a local path or URL")
    folder = cache_dir() / "hf" / repo.replace("/", "--") / revision
    required, one_of, optional = HF_FILES[fmt]
    # HF_ENDPOINT: the hub's address, as huggingface_hub reads it (mirrors, a local server)
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    base = f"{endpoint}/{repo}/resolve/{revision}/"
    # one question decides whether the cached files are checked at all: behind a firewall that drops
    # packets every HEAD would wait for its timeout
    cached = (folder / required[0]).is_file()
    check = not cached or _server_facts(base + required[0]) is not None
    for name in required:
        fetch(base + name, folder / name, check=check)
    for names in one_of:
        errors = []
        choices = names.split("|")
        if not check:  # offline: whichever alternative is cached
            choices = [n for n in choices if (folder / n).is_file()] or choices
        for name in choices:
            try:
                fetch(base + name, folder / name, check=check)
                break
            except FileNotFoundError as exc:
                errors.append(str(exc))
        else:
            raise FileNotFoundError(f"{repo} has none of {names.split('|')}: {errors}")
    for name in optional:
        if not check and not (folder / name).is_file():
            continue  # offline: an optional file that was never there must not stop a cached model
        try:
            fetch(base + name, folder / name, check=check)
        except FileNotFoundError:
            pass
    return folder


def url_folder(url: str) -> Path:
    """The cache folder of one URL: the file name for people, a hash of the whole URL for uniqueness."""
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "download"
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    return cache_dir() / "url" / f"{name}-{digest}"


def from_url(url: str, *, max_unpacked: int | None = None) -> Path:
    """Download a file or a .tar(.gz/.bz2/.xz) archive into the cache; archives are unpacked safely.

    `max_unpacked` caps the unpacked bytes (default: unpack_limit of the archive size, or
    $WORKBENCH_MAX_UNPACK bytes)."""
    folder = url_folder(url)
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "download"
    path = folder / name
    before = path.stat().st_mtime_ns if path.is_file() else None
    fetch(url, path)
    if not name.endswith(ARCHIVES):
        return path
    out = folder / "unpacked"
    if out.is_dir() and path.stat().st_mtime_ns != before:
        shutil.rmtree(out)  # a new download replaces what the old one unpacked
    if not out.is_dir():
        if max_unpacked is None:
            env = os.environ.get("WORKBENCH_MAX_UNPACK")
            max_unpacked = int(env) if env else unpack_limit(path.stat().st_size)
        tmp = folder / "unpacking"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            unpack(path, tmp, max_bytes=max_unpacked, source=url)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        tmp.replace(out)
    entries = list(out.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else out


def unpack_limit(archive_bytes: int) -> int:
    """Default cap on an archive's unpacked size: UNPACK_RATIO x its size, at least UNPACK_FLOOR."""
    return max(UNPACK_RATIO * archive_bytes, UNPACK_FLOOR)


_REFUSALS = (
    (tarfile.AbsolutePathError, "has an absolute path"),
    (tarfile.OutsideDestinationError, "would be written outside the unpack folder"),
    (tarfile.AbsoluteLinkError, "is a link to an absolute path"),
    (tarfile.LinkOutsideDestinationError, "is a link pointing outside the unpack folder"),
    (tarfile.SpecialFileError, "is a device node or FIFO, not a regular file"),
)


def unpack(archive: Path, dest: Path, *, max_bytes: int, source: str | None = None) -> None:
    """Extract `archive` into `dest` with tarfile's data filter, after checking every member first:
    one unsafe member, or more than `max_bytes` in all, raises UnsafeArchiveError and writes nothing."""
    what = source or str(archive)
    try:
        with tarfile.open(archive) as tar:
            members, total = [], 0
            for member in tar:
                try:
                    if member.name.startswith(("/", os.sep)):
                        # the data filter would strip the slash; an archive that asks for it is not trusted
                        raise tarfile.AbsolutePathError(member)
                    tarfile.data_filter(member, str(dest))
                except tarfile.FilterError as exc:
                    why = next((w for cls, w in _REFUSALS if isinstance(exc, cls)), str(exc))
                    raise UnsafeArchiveError(
                        f"refused to unpack {what}: member {member.name!r} {why}; nothing was unpacked"
                    ) from None
                total += member.size if member.isfile() else 0
                if total > max_bytes:
                    raise UnsafeArchiveError(
                        f"refused to unpack {what}: it unpacks to more than {max_bytes:,} bytes "
                        f"({archive.stat().st_size:,} bytes packed); set WORKBENCH_MAX_UNPACK to a larger byte "
                        f"count if you trust it"
                    )
                members.append(member)
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.ReadError, tarfile.CompressionError, EOFError) as exc:
        raise ArchiveError(f"cannot unpack {what}: not a readable tar archive ({exc})") from None


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
