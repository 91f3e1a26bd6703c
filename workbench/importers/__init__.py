"""Importers for published translation checkpoints: Marian/opus-mt, FSMT, fairseq, OpenNMT-py."""
