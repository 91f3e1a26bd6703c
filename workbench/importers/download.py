"""Old home of the checkpoint downloads, kept so existing imports work:
everything lives in workbench.corpus.download."""

from __future__ import annotations

from ..corpus.download import (
    HF_FILES,
    ArchiveError,
    NetworkUnreachable,
    UnsafeArchiveError,
    cache_dir,
    fetch,
    from_hub,
    from_url,
    resolve_source,
)

__all__ = ["HF_FILES", "ArchiveError", "NetworkUnreachable", "UnsafeArchiveError", "cache_dir", "fetch", "from_hub",
           "from_url", "resolve_source"]
