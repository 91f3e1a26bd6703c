"""The package version, in a module of its own so saving a checkpoint need not import the package root."""

__version__ = "0.1.0"
