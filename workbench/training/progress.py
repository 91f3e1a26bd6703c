"""Live training progress without extra dependencies: a terminal line printer and a notebook view.

The trainer calls `start(total)`, `step(step, record)` for every log record, `validation(record)`,
`message(text)` and `close()`. In JupyterLab the notebook view redraws one HTML output in place
(IPython.display handles): a progress bar plus small SVG charts of the loss, the learning rate
actually used and the validation metrics.
"""

from __future__ import annotations

import html
import sys
import time
from typing import Any


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def make_progress(kind: str = "auto", *, enabled: bool = True):
    """auto: the notebook view inside Jupyter, else the terminal printer; "none" prints nothing."""
    if not enabled or kind == "none":
        return NullProgress()
    if kind == "notebook" or (kind == "auto" and in_notebook()):
        return NotebookProgress()
    return TerminalProgress()


class NullProgress:
    def start(self, total: int | None, step: int = 0) -> None: ...
    def step(self, step: int, record: dict[str, Any]) -> None: ...
    def validation(self, record: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...
    def close(self) -> None: ...


class TerminalProgress(NullProgress):
    """One line per log record (a redrawn bar in between when stdout is a terminal)."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.total: int | None = None
        self.t0 = time.time()

    def start(self, total: int | None, step: int = 0) -> None:
        self.total, self.t0 = total, time.time()

    def _bar(self, step: int) -> str:
        if not self.total:
            return f"step {step}"
        frac = min(1.0, step / self.total)
        filled = int(frac * 20)
        return f"[{'#' * filled}{'.' * (20 - filled)}] {step}/{self.total}"

    def step(self, step: int, record: dict[str, Any]) -> None:
        parts = [self._bar(step), f"ep {record.get('epoch', 0)}"]
        for key, fmt in (("loss", "{:.3f}"), ("nll", "{:.3f}"), ("lr", "{:.2e}"), ("grad_norm", "{:.2f}"),
                         ("tokens_per_s", "{:,.0f}")):
            if key in record:
                parts.append(f"{key} " + fmt.format(record[key]))
        self.stream.write(" | ".join(parts) + "\n")
        self.stream.flush()

    def validation(self, record: dict[str, Any]) -> None:
        keys = [k for k in record if k.startswith("valid_")]
        text = ", ".join(f"{k[6:]} {record[k]:.3f}" if isinstance(record[k], float) else f"{k[6:]} {record[k]}"
                         for k in keys)
        self.stream.write(f"validation @ step {record.get('step')}: {text}\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


class NotebookProgress(NullProgress):
    """An HTML block redrawn in place: bar, latest numbers, loss/LR/validation sparklines."""

    def __init__(self) -> None:
        from IPython.display import HTML, display

        self._html = HTML
        self.handle = display(HTML("<i>starting…</i>"), display_id=True)
        self.records: list[dict[str, Any]] = []
        self.valid: list[dict[str, Any]] = []
        self.messages: list[str] = []
        self.total: int | None = None
        self.last_draw = 0.0

    def start(self, total: int | None, step: int = 0) -> None:
        self.total = total

    def step(self, step: int, record: dict[str, Any]) -> None:
        self.records.append(record)
        if time.time() - self.last_draw > 0.5:
            self._draw()

    def validation(self, record: dict[str, Any]) -> None:
        self.valid.append(record)
        self._draw()

    def message(self, text: str) -> None:
        self.messages.append(text)
        self._draw()

    def close(self) -> None:
        self._draw()

    def _draw(self) -> None:
        self.last_draw = time.time()
        last = self.records[-1] if self.records else {}
        step = last.get("step", 0)
        frac = min(1.0, step / self.total) if self.total else 0.0
        bar = (f"<div style='width:320px;border:1px solid #888;height:10px'><div style='width:{frac * 100:.1f}%;"
               f"background:#4c78a8;height:10px'></div></div>")
        nums = " · ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in last.items()
                          if k in ("step", "epoch", "loss", "lr", "grad_norm", "tokens_per_s"))
        charts = [
            _sparkline([r["step"] for r in self.records], [r.get("loss") for r in self.records], "train loss"),
            _sparkline([r["step"] for r in self.records], [r.get("lr") for r in self.records], "learning rate"),
        ]
        for key in ("valid_loss", "valid_bleu"):
            pts = [(r["step"], r[key]) for r in self.valid if key in r]
            if pts:
                charts.append(_sparkline([p[0] for p in pts], [p[1] for p in pts], key))
        notes = "".join(f"<div>{html.escape(m)}</div>" for m in self.messages[-5:])
        self.handle.update(self._html(f"<div>{bar}<div>{html.escape(nums)}</div>"
                                      f"<div style='display:flex;gap:12px'>{''.join(charts)}</div>{notes}</div>"))


def _sparkline(xs: list, ys: list, title: str, w: int = 220, h: int = 90) -> str:
    pts = [(x, y) for x, y in zip(xs, ys) if isinstance(y, (int, float)) and y == y]
    if len(pts) < 2:
        return f"<div><small>{html.escape(title)}</small></div>"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    sx = lambda x: 4 + (w - 8) * (x - x0) / ((x1 - x0) or 1)
    sy = lambda y: h - 14 - (h - 22) * (y - y0) / ((y1 - y0) or 1)
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    return (f"<svg width='{w}' height='{h}'><text x='4' y='10' font-size='10'>{html.escape(title)}: "
            f"{pts[-1][1]:.4g}</text><polyline fill='none' stroke='#4c78a8' points='{path}'/>"
            f"<text x='4' y='{h - 2}' font-size='9'>{y0:.3g}…{y1:.3g}</text></svg>")
