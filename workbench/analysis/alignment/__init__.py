"""Cross-attention as a word aligner: alignments, AER and the protocols of the alignment papers."""
