"""Compiling kernels through NVRTC, caching them, and launching them with the shared parameter block."""
