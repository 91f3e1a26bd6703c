"""Parallel corpora: reading, batching by tokens, and the downloads that fetch them."""
