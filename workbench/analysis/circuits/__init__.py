"""What is necessary: patching, ablations, pruning curves and circuits over contrastive pairs."""
