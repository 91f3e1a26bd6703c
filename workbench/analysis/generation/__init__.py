"""What a greedy or beam search saw and chose, step by step."""
