"""Analyses beyond attention maps: pure functions over traces (and the model where it must run).

    from workbench.analysis import corpus_head_stats, attention_rollout, alignment_head_scores
    table = corpus_head_stats(model, sources, targets)   # head statistics over a test set

Each module has one job; see docs/analysis.md for the definitions and the literature behind them.
`import workbench` does not import this package.
"""

from __future__ import annotations

from .alignment.alignment import (
    AERScore,
    aer,
    alignment_head_scores,
    attention_links,
    corpus_aer,
    corpus_cross_attention,
    format_pharaoh,
    parse_pharaoh,
    read_alignments,
    score_alignments,
)
from .alignment.word_align import WordMaps, Words, alignment_maps, encode_words, maps_from_trace
from .attention.head_stats import STATS, HeadStats, block_stats, corpus_head_stats, head_stats, punctuation_ids
from .attention.logit_lens import LogitLens, logit_lens
from .attention.norms import NORM_HOOKS, ValueNorms, value_norms
from .attention.positional_share import positional_share, score_terms
from .attention.rollout import DecoderRollout, attention_flow, attention_rollout, decoder_rollout, encoder_rollout
from .attribution.alti import Alti, alti
from .attribution.attribute import attribution_agreement, integrated_gradients, memory_patching, occlusion
from .attribution.attribution import Attribution, gradient_attribution, spearman, step_agreement, token_attribution
from .attribution.decompose import (
    Components,
    LogitAttribution,
    LogitAttributions,
    decompose_resid,
    direct_logit_attribution,
    logit_attributions,
    source_attribution,
)
from .attribution.gradients import run_with_grads
from .attribution.graph import AttributionGraph, attribution_graph, faithfulness_check, remove_nodes
from .circuits.circuits import (
    EdgeGraph,
    EdgeScores,
    circuit_faithfulness,
    circuit_metric,
    edge_patching,
    edge_scores,
    flips,
    iterative_circuits,
    node_circuit,
    node_circuit_of_size,
    node_scores,
)
from .circuits.contrast import GENDER_EN, NUMBER_DE, NUMBER_EN, ContrastPair, noun_swaps, word_swaps
from .circuits.interventions_effect import head_importance, intervention_effect, patch_effect, run_outcome
from .circuits.patching import (
    BatchPatchingResult,
    PatchingResult,
    attribution_patching,
    batch_attribution_patching,
    log_prob,
    logit_diff,
    patching_sweep,
    path_patching,
    sequence_log_prob,
)
from .generation.beam_replay import BeamReplay, add_cross_attention, replay_beam
from .generation.generation_trace import generation_trace

__all__ = [
    "aer", "alignment_head_scores", "attention_links", "corpus_aer", "corpus_cross_attention", "parse_pharaoh",
    "AERScore", "format_pharaoh", "read_alignments", "score_alignments", "Alti", "alti",
    "WordMaps", "Words", "alignment_maps", "encode_words", "maps_from_trace",
    "NORM_HOOKS", "STATS", "DecoderRollout", "HeadStats", "ValueNorms", "attention_flow", "attention_rollout",
    "block_stats", "corpus_head_stats", "decoder_rollout", "encoder_rollout", "head_stats", "punctuation_ids",
    "value_norms", "LogitLens", "logit_lens", "positional_share", "score_terms",
    "Attribution", "gradient_attribution", "spearman", "step_agreement", "token_attribution",
    "BeamReplay", "add_cross_attention", "replay_beam",
    "head_importance", "intervention_effect", "patch_effect", "run_outcome",
    "Components", "LogitAttribution", "LogitAttributions", "decompose_resid", "direct_logit_attribution",
    "logit_attributions", "source_attribution",
    "run_with_grads", "PatchingResult", "attribution_patching", "BatchPatchingResult", "batch_attribution_patching",
    "sequence_log_prob", "log_prob", "logit_diff", "path_patching",
    "patching_sweep", "generation_trace",
    "attribution_agreement", "integrated_gradients", "memory_patching", "occlusion", "ContrastPair", "noun_swaps",
    "GENDER_EN", "NUMBER_DE", "NUMBER_EN", "word_swaps", "AttributionGraph", "attribution_graph", "faithfulness_check",
    "remove_nodes", "EdgeGraph", "EdgeScores", "circuit_faithfulness", "circuit_metric", "edge_patching", "edge_scores",
    "iterative_circuits", "flips", "node_circuit", "node_circuit_of_size", "node_scores",
]
