"""What an import produces: the converted model with its tokenizers and decoding defaults, and the
report of what came from where."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.format import save_checkpoint


@dataclass
class ImportReport:
    """What was converted from where, what was ignored (and why), what is assumed."""

    source_format: str
    source: str
    converted: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source_format": self.source_format,
            "source": self.source,
            "converted": dict(self.converted),
            "ignored": dict(self.ignored),
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        lines = [f"imported {self.source_format} checkpoint {self.source}: {len(self.converted)} tensors converted"]
        transformed = {k: v for k, v in self.converted.items() if "(" in v}
        if transformed:
            lines.append(f"  {len(transformed)} through a transform, e.g. {next(iter(transformed.items()))}")
        for key, why in sorted(self.ignored.items()):
            lines.append(f"  ignored {key}: {why}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


@dataclass
class Imported:
    """A converted model with its tokenizers, decoding defaults and conversion report."""

    model: Any  # workbench.core.model.Transformer
    report: ImportReport
    src_tokenizer: Any = None
    tgt_tokenizer: Any = None
    generation: dict[str, Any] = field(default_factory=dict)
    """append_eos plus DecodeConfig fields (beam, length_penalty {kind, alpha}, max_len...)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More meta.json entries: languages, ids the original forbids, ..."""

    def meta(self) -> dict[str, Any]:
        return {
            "source_format": self.report.source_format,
            "generation": dict(self.generation),
            "import_report": self.report.to_dict(),
            **self.extra,
        }

    def save(self, directory: str | Path) -> Path:
        return save_checkpoint(
            directory, self.model, src_tokenizer=self.src_tokenizer, tgt_tokenizer=self.tgt_tokenizer, meta=self.meta()
        )
