"""The importers' two errors: a file that cannot be converted, and one whose pickle we refuse to run."""

from __future__ import annotations


class ConversionError(ValueError):
    """A source checkpoint that cannot be converted; the message names the file or key."""


class UnsafeCheckpointError(ConversionError):
    """The file's pickle asks for code we do not allow (it might run arbitrary commands)."""
