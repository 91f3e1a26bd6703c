"""Head roles from measured statistics, with the thresholds that decide them (Voita et al. 2019's roles).

    stats = corpus_head_stats(model, sources, targets)               # prev_top, next_top, eos, punct, rare, ...
    roles = head_roles(stats, aer=per_head_aer, diagonal_aer=0.71)   # aer: a DataFrame layer, head, aer (cross)
    print(roles)                                                     # the thresholds, then one line per head
    roles.table                                                      # kind, layer, head, the statistics, roles

A head gets every role whose test it passes (a head can be positional and attend to EOS), none when it passes
no test. The tests:

* previous / next (self-attention): the row's largest weight is on the token one step back / ahead in at least
  `positional` of the rows (Voita et al.'s 90 %);
* alignment (cross-attention): its word-alignment error rate against human gold is below the error rate of the
  diagonal aligner (target word j to source word round(j·(S-1)/(T-1))) on the same gold, so the head knows more
  than word order;
* eos / punct: the mean weight on the source's </s> / on punctuation keys is at least `eos` / `punct` (a sink:
  heads with nothing to do park their weight there; Clark et al. 2019);
* rare: the row's largest weight is on the sentence's least frequent key (corpus counts) in at least `rare` of
  the rows (Voita et al.'s rare-words head; chance is 1/length, about 8 % for a 12-token caption).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .head_stats import HeadStats

ROLES = ("previous", "next", "alignment", "eos", "punct", "rare")


@dataclass(frozen=True)
class RoleRules:
    """The thresholds of each role's test (module docstring)."""

    positional: float = 0.9
    eos: float = 0.5
    punct: float = 0.5
    rare: float = 0.5

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not 0.0 < value <= 1.0:
                raise ValueError(f"role threshold {name} ({value}) must be in (0, 1]")

    def lines(self, diagonal_aer: float | None) -> list[str]:
        diag = ("no gold alignments given: no alignment role" if diagonal_aer is None
                else f"AER below the diagonal aligner's {100 * diagonal_aer:.1f} %")
        return [
            f"previous / next: largest weight on the token one step back / ahead in >= {self.positional:.0%} of rows",
            f"alignment (cross-attention): {diag}",
            f"eos: mean weight on </s> >= {self.eos:.2f}",
            f"punct: mean weight on punctuation >= {self.punct:.2f}",
            f"rare: largest weight on the sentence's least frequent token in >= {self.rare:.0%} of rows",
        ]


@dataclass(frozen=True)
class HeadRoles:
    """Roles of every head: `table` (DataFrame: head_id, kind, layer, head_index, prev_top, next_top, eos, punct,
    rare, aer, roles) and the rules that decided them."""

    table: object
    rules: RoleRules = field(default_factory=RoleRules)
    diagonal_aer: float | None = None

    def of(self, kind: str, layer: int, head: int) -> list[str]:
        t = self.table
        row = t[(t["kind"] == kind) & (t["layer"] == layer) & (t["head_index"] == head)]
        if row.empty:
            raise KeyError(f"no head {kind}:{layer}:{head}")
        value = row["roles"].iloc[0]
        return value.split(",") if value else []

    def counts(self) -> dict[str, dict[str, int]]:
        """{kind: {role: number of heads}} (every role listed, zeros included) and "none" for heads without one."""
        out: dict[str, dict[str, int]] = {}
        for kind, part in self.table.groupby("kind", sort=False):
            c = {r: 0 for r in ROLES} | {"none": 0}
            for value in part["roles"]:
                for r in value.split(",") if value else ["none"]:
                    c[r] += 1
            out[str(kind)] = c
        return out

    def __str__(self) -> str:
        lines = ["Head roles; a head has a role when:", *(f"  {x}" for x in self.rules.lines(self.diagonal_aer))]
        for _, r in self.table.iterrows():
            lines.append(f"  {r['head_id']}  {r['roles'] or '-'}")
        return "\n".join(lines)


def head_roles(stats: HeadStats, *, aer=None, diagonal_aer: float | None = None,
               rules: RoleRules | None = None) -> HeadRoles:
    """Roles of every head from `stats` (`corpus_head_stats`; "rare" needs token counts, which it counts) and,
    for cross-attention, a per-head AER table (DataFrame with columns layer, head_index, aer, as
    `head_aer_table` and `alignment_head_scores` give; rows with head_index "mean" are ignored) with the diagonal
    aligner's AER on the same gold."""
    rules = rules or RoleRules()
    if (aer is None) != (diagonal_aer is None):
        raise ValueError("give both aer (per-head AER) and diagonal_aer (the diagonal baseline's), or neither")
    df = stats.summary()
    cols = ["head_id", "kind", "layer", "head_index", "prev_top", "next_top", "eos", "punct", "rare"]
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"the statistics lack {missing}: compute them with corpus_head_stats")
    df = df[cols].copy()
    df["aer"] = np.nan
    if aer is not None:
        index = "head_index" if "head_index" in aer.columns else "head"  # a table written before the rename
        per_head = aer[aer[index] != "mean"]
        for _, r in per_head.iterrows():
            hit = (df["kind"] == "cross") & (df["layer"] == int(r["layer"])) & (df["head_index"] == int(r[index]))
            df.loc[hit, "aer"] = float(r["aer"])

    def decide(r) -> str:
        out = []
        if r["prev_top"] >= rules.positional:
            out.append("previous")
        if r["next_top"] >= rules.positional:
            out.append("next")
        if diagonal_aer is not None and r["aer"] < diagonal_aer:
            out.append("alignment")
        if r["eos"] >= rules.eos:
            out.append("eos")
        if r["punct"] >= rules.punct:
            out.append("punct")
        if r["rare"] >= rules.rare:
            out.append("rare")
        return ",".join(out)  # NaN compares False: a statistic a kind lacks never gives its role

    df["roles"] = [decide(r) for _, r in df.iterrows()]
    return HeadRoles(df.reset_index(drop=True), rules, diagonal_aer)
