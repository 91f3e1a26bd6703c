"""Sparse dictionaries on an encoder-decoder model: SAEs and transcoders, their evaluation and dashboards.

    from workbench.features import SparseDictionary, resolve_site, splice_hooks
    d = SparseDictionary.load("checkpoints/multi30k-de-en/features/hook_memory")

`import workbench` does not import this package.
"""

from __future__ import annotations

from .attribution import FeatureAttribution, ablate_features, feature_attribution
from .dictionary import DictionaryConfig, SparseDictionary, fvu
from .sites import Site, capture_site, resolve_site, site_of, site_rows, splice, splice_hooks, unsplice
from .stream import ActivationStream

__all__ = ["ActivationStream", "DictionaryConfig", "FeatureAttribution", "Site", "SparseDictionary",
           "ablate_features", "capture_site", "feature_attribution", "fvu", "resolve_site", "site_of", "site_rows",
           "splice", "splice_hooks", "unsplice"]
