"""gpuobs: observability and release safety for GPU platforms (README.md, docs/)."""

__version__ = "0.1.0"
