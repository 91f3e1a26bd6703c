"""The model: configuration, layers, hook points, traces, head names, presets. Imports nothing else of workbench."""
