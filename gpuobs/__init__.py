"""gpuobs: observability and release safety for GPU platforms (see shared design.md)."""

__version__ = "0.1.0"
