"""Losslessness checks: the gate (the engine paper's three levels), whether passes of different sizes
agree, whether llama.cpp's routing agrees with the trace, and llama.cpp's own reference decoding."""
