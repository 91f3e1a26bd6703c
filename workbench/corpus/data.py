"""Parallel text in, padded batches out: aligned files, named datasets, the copy task, token-budget batching.

    src, tgt = read_parallel("train.de", "train.en")              # clear errors with file and line
    src, tgt = load_dataset("multi30k", "train", "de", "en")      # local root, else its public URL
    data = ParallelData.encode(src, tgt, src_tok, tgt_tok, max_len=250)
    for idx in data.batches(max_tokens=4096, seed=1, epoch=3):   # every pair exactly once per epoch
        batch = data.collate(idx, cfg)

Batching follows fairseq: pairs are sorted by length (ties broken by a seeded shuffle), cut
greedily into batches whose padded size on each side (pairs x longest sequence) stays within the
token budget, and the batch order is shuffled. Sorting keeps padding small (typically a few
percent instead of the third a random batch wastes), and the whole plan is a pure function of
(seed, epoch), so resuming only needs the epoch and the batch position.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.batching import token_batches
from ..core.config import ModelConfig
from .download import download

# ------------------------------------------------------------------------------------------- reading


def read_lines(path: str | Path) -> list[str]:
    """UTF-8 lines without their newline; invalid UTF-8 and empty files raise naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"{path} is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path} line {line}: invalid UTF-8 ({exc.reason} at byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def read_parallel(src_path: str | Path, tgt_path: str | Path, *, limit: int = 0) -> tuple[list[str], list[str]]:
    """Aligned files: line N of one translates line N of the other."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        shorter = src_path if len(src) < len(tgt) else tgt_path
        raise ValueError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: not aligned "
            f"({shorter} ends first, after line {min(len(src), len(tgt))})"
        )
    if limit:
        src, tgt = src[:limit], tgt[:limit]
    return src, tgt


# ------------------------------------------------------------------------------------- named datasets


@dataclass(frozen=True)
class Dataset:
    """A public parallel corpus: where its files sit under the local root and where they come from."""

    folder: str
    splits: dict[str, str]
    """split name -> file stem; files are {stem}.{lang}."""
    langs: tuple[str, ...]
    url: str | None = None
    """Template with {stem} and {lang} for a gzip download; None: fetch it by hand (see `source`)."""
    source: str = ""


DATASETS: dict[str, Dataset] = {
    "multi30k": Dataset(
        "multi30k", {"train": "train", "valid": "val", "test": "test_2016_flickr", "test2016": "test_2016_flickr"},
        ("de", "en", "fr"),
        url="https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{stem}.{lang}.gz",
        source="https://github.com/multi30k/dataset (Elliott et al. 2016), task 1 raw",
    ),
    "wmt14_sample": Dataset(
        "wmt14-train-sample", {"train": "train"}, ("de", "en"),
        source="first 20k pairs of https://www.statmt.org/wmt14/translation-task.html (Europarl v7 de-en)",
    ),
    "wmt_news": Dataset(
        "wmt-news", {f"newstest{y}": f"newstest{y}" for y in range(2008, 2019)} | {"valid": "newstest2013",
                                                                                    "test": "newstest2014"},
        ("de", "en"),
        source="sacrebleu -t wmt14 -l de-en --echo src/ref (https://www.statmt.org/wmt14/)",
    ),
    "tatoeba": Dataset(
        "tatoeba-de-en", {"train": "train", "test": "tatoeba-test-v2021-08-07"}, ("de", "en"),
        source="https://www.manythings.org/anki/ (train); https://github.com/Helsinki-NLP/Tatoeba-Challenge (test)",
    ),
    "iwslt14": Dataset(
        "iwslt14-de-en", {"test": "test.raw", "test_lc": "test.detok.lc", "valid_lc": "valid.detok.lc"}, ("de", "en"),
        source="https://wit3.fbk.eu/2014-01 (IWSLT14 TED de-en, fairseq's prepare-iwslt14.sh)",
    ),
}


def default_data_root() -> Path:
    """$WORKBENCH_DATA, else a `shared/data` beside the project checkout, else ~/.cache/workbench/data."""
    if os.environ.get("WORKBENCH_DATA"):
        return Path(os.environ["WORKBENCH_DATA"])
    beside = Path(__file__).resolve().parents[3] / "shared" / "data"  # workbench/corpus/data.py -> ../shared/data
    if beside.is_dir():
        return beside
    return Path.home() / ".cache" / "workbench" / "data"


def dataset_files(name: str, split: str, src_lang: str, tgt_lang: str, root: str | Path | None = None,
                  *, download: bool = True) -> tuple[Path, Path]:
    """Paths of a named dataset's split, downloading it into the root first when it is missing and can be."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS)}, mixtures: {sorted(MIXTURES)} "
                         "(or use your own files)")
    ds = DATASETS[name]
    if split not in ds.splits:
        raise ValueError(f"dataset {name!r} has no split {split!r}; splits: {sorted(ds.splits)}")
    for lang in (src_lang, tgt_lang):
        if lang not in ds.langs:
            raise ValueError(f"dataset {name!r} has no language {lang!r}; languages: {ds.langs}")
    folder = Path(root or default_data_root()) / ds.folder
    stem = ds.splits[split]
    paths = (folder / f"{stem}.{src_lang}", folder / f"{stem}.{tgt_lang}")
    for path, lang in zip(paths, (src_lang, tgt_lang)):
        if path.is_file():
            continue
        if ds.url is None or not download:
            raise FileNotFoundError(f"{path} is missing; get {name} from {ds.source} and put it under {folder}")
        _download(ds.url.format(stem=stem, lang=lang), path)
    return paths


MIXTURES: dict[str, dict[str, list[tuple[str, str]]]] = {
    # All the real de-en training text on these machines (never a test set): the shipped general-en-de model.
    "general_de_en": {
        "train": [("tatoeba", "train"), ("multi30k", "train"), ("wmt14_sample", "train")]
        + [("wmt_news", f"newstest{y}") for y in range(2008, 2013)],
        "valid": [("wmt_news", "newstest2013")],
    },
}
"""Named concatenations of dataset splits, in this order; usable wherever a dataset name is."""


def load_dataset(name: str, split: str, src_lang: str, tgt_lang: str, root: str | Path | None = None,
                 *, limit: int = 0) -> tuple[list[str], list[str]]:
    """A named dataset's split, or a named mixture's parts concatenated (`limit` caps the total)."""
    if name not in MIXTURES:
        return read_parallel(*dataset_files(name, split, src_lang, tgt_lang, root), limit=limit)
    if split not in MIXTURES[name]:
        raise ValueError(f"mixture {name!r} has no split {split!r}; splits: {sorted(MIXTURES[name])}")
    src: list[str] = []
    tgt: list[str] = []
    for part, part_split in MIXTURES[name][split]:
        s, t = read_parallel(*dataset_files(part, part_split, src_lang, tgt_lang, root))
        src += s
        tgt += t
    return (src[:limit], tgt[:limit]) if limit else (src, tgt)


def _download(url: str, path: Path) -> None:
    try:
        download(url, path, gunzip=url.endswith(".gz"))
    except (OSError, EOFError) as exc:  # NetworkUnreachable and HTTP errors are OSErrors; EOFError: cut-off gzip
        raise FileNotFoundError(f"{path} is missing and downloading {url} failed ({exc}); "
                                f"offline, point data_root / $WORKBENCH_DATA at a local copy") from None


# ------------------------------------------------------------------------------------------ copy task


def copy_task(n: int, *, vocab: int = 11, length: int = 10, seed: int = 0, first_id: int = 4) -> list[list[int]]:
    """The Annotated Transformer's synthetic task: random id sequences the model must copy."""
    if vocab <= first_id:
        raise ValueError(f"vocab ({vocab}) leaves no ids above the specials (first id {first_id})")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(first_id, vocab, (n, length), generator=g).tolist()


# ------------------------------------------------------------------------------------------ batching


@dataclass
class Batch:
    """Padded tensors for one step; built once per batch (the model derives its masks from `pad_id`)."""

    src: torch.Tensor  # (B, S) source ids + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) start id + target ids, right-padded
    tgt_out: torch.Tensor  # (B, T) target ids + EOS, right-padded: what the loss compares against
    indices: list[int]
    n_src_tokens: int  # real (non-pad) tokens
    n_tgt_tokens: int
    # flat positions of tgt_out that are not padding, found on the host where the batch is built: the loss reads
    # them instead of asking the device (a nonzero() waits for it, once per micro-batch; see `training.loss`)
    tgt_rows: torch.Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Batch:
        """The batch on `device`. To a CUDA device the tensors go through pinned memory: a copy from pageable
        memory waits for the device's queue to drain, which once per micro-batch left the H100 idle while the host
        launched the next forward (docs/gpu.md)."""
        pin = torch.device(device).type == "cuda" and torch.cuda.is_available()

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            if pin and t.device.type == "cpu":
                t = t.pin_memory()
            return t.to(device, non_blocking=non_blocking)

        return Batch(move(self.src), move(self.tgt_in), move(self.tgt_out), self.indices, self.n_src_tokens,
                     self.n_tgt_tokens, move(self.tgt_rows))

    @property
    def size(self) -> int:
        return len(self.indices)


class ParallelData:
    """Token-id pairs (source without EOS, target without BOS/EOS) plus their batching plan."""

    def __init__(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> None:
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} sources but {len(tgt)} targets")
        if not src:
            raise ValueError("no sentence pairs (after length filtering?)")
        self.src = [list(s) for s in src]
        self.tgt = [list(t) for t in tgt]
        # lengths as the model sees them: source + EOS, target + (BOS | EOS)
        self.src_lens = np.array([len(s) + 1 for s in self.src], dtype=np.int64)
        self.tgt_lens = np.array([len(t) + 1 for t in self.tgt], dtype=np.int64)

    @classmethod
    def encode(cls, src_text: Sequence[str], tgt_text: Sequence[str], src_tok, tgt_tok, *, max_len: int = 0,
               ) -> ParallelData:
        """Tokenize pairs, dropping those longer than `max_len` tokens on either side (0: keep all)."""
        enc = lambda tok, xs: tok.encode_batch(xs) if hasattr(tok, "encode_batch") else [tok.encode(x) for x in xs]
        src, tgt = enc(src_tok, list(src_text)), enc(tgt_tok, list(tgt_text))
        return cls(src, tgt).filter(max_len) if max_len else cls(src, tgt)

    def filter(self, max_len: int, *, min_len: int = 1) -> ParallelData:
        """Keep pairs with min_len..max_len tokens (before EOS) on both sides."""
        keep = [i for i, (s, t) in enumerate(zip(self.src, self.tgt))
                if min_len <= len(s) <= max_len and min_len <= len(t) <= max_len]
        return ParallelData([self.src[i] for i in keep], [self.tgt[i] for i in keep])

    def __len__(self) -> int:
        return len(self.src)

    def batches(self, max_tokens: int, *, seed: int = 0, epoch: int = 0, shuffle: bool = True) -> list[list[int]]:
        """Index lists covering every pair exactly once, each within `max_tokens` padded tokens per side."""
        longest = int(max(self.src_lens.max(), self.tgt_lens.max()))
        if longest > max_tokens:
            raise ValueError(f"max_tokens ({max_tokens}) is smaller than the longest sequence ({longest} tokens); "
                             f"raise it or filter by length")
        n = len(self)
        if shuffle:
            rng = np.random.default_rng([seed, epoch])
            tie = rng.permutation(n)
        else:
            rng, tie = None, np.arange(n)
        # sort by source length, then target length, ties in seeded random order (np.lexsort: last key first)
        order = np.lexsort((tie, self.tgt_lens, self.src_lens))
        # a batch's padded size per side is pairs x longest; the larger side decides
        out = token_batches(np.maximum(self.src_lens, self.tgt_lens).tolist(), max_tokens, order.tolist())
        if rng is not None:
            out = [out[j] for j in rng.permutation(len(out)).tolist()]
        return out

    def collate(self, indices: Sequence[int], cfg: ModelConfig) -> Batch:
        """Right-padded tensors for the pairs `indices` (source + EOS; start + target; target + EOS)."""
        b = len(indices)
        s_len = int(self.src_lens[list(indices)].max())
        t_len = int(self.tgt_lens[list(indices)].max())
        src = np.full((b, s_len), cfg.pad_id, dtype=np.int64)
        tgt_in = np.full((b, t_len), cfg.pad_id, dtype=np.int64)
        tgt_out = np.full((b, t_len), cfg.pad_id, dtype=np.int64)
        n_src = n_tgt = 0
        for row, i in enumerate(indices):
            s, t = self.src[i], self.tgt[i]
            src[row, : len(s)] = s
            src[row, len(s)] = cfg.eos_id
            tgt_in[row, 0] = cfg.start_id
            tgt_in[row, 1 : len(t) + 1] = t
            tgt_out[row, : len(t)] = t
            tgt_out[row, len(t)] = cfg.eos_id
            n_src += len(s) + 1
            n_tgt += len(t) + 1
        rows = np.flatnonzero(tgt_out.reshape(-1) != cfg.pad_id)
        return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), list(indices),
                     n_src, n_tgt, torch.from_numpy(rows))


def shard(indices: Sequence[int], rank: int, world: int) -> list[int]:
    """This rank's share of a global batch: every world-th pair (the batch is length-sorted, so shares match)."""
    return list(indices[rank::world])


def padding_fraction(data: ParallelData, batches: list[list[int]]) -> float:
    """Share of padded target positions over a batching plan (for reports and tests)."""
    real = padded = 0
    for idx in batches:
        lens = data.tgt_lens[idx]
        real += int(lens.sum())
        padded += int(lens.max()) * len(idx)
    return 1.0 - real / padded
