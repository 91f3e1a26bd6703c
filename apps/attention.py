"""Placeholder for the dashboard (`panel serve apps/attention.py`).

The attention app is being built (views and app issues); until then this page says so and
lists what the installed workbench can already do, so the README's app command never breaks.
"""

import panel as pn

import workbench
from workbench import presets

pn.extension()

model = workbench.Transformer(presets.tiny())
pn.Column(
    "# Attention Workbench",
    f"**Version {workbench.__version__}.** The attention dashboard is not built yet: this placeholder "
    "page stands in for it. The core library is ready: a Transformer with "
    f"{len(model.hook_names())} named hook points in its tiny preset, traces and interventions.",
    pn.pane.Markdown("Hook points of the tiny preset, e.g.:\n\n" + "\n".join(
        f"- `{n}`" for n in model.hook_names("dec.0.cross_attn.*")), css_classes=["hook-list"]),
).servable(title="Attention Workbench")
