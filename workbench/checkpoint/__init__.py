"""What is saved with a model: the checkpoint format, the tokenizers, the shipped checkpoints."""
