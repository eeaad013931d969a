"""Expert kernels, their registration in transformers, and routing traces."""
