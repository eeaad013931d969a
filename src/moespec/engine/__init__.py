"""Lossless speculative decoding: sampling, cached models, proposers, the decode loop, statistics."""
