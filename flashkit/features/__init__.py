"""Features that shape a call: block-sparse masks and FP8 quantization."""
