"""Suite-wide settings. `pytest -n 2` runs two workers on this 2-core machine: at torch's default of
two threads each, the four threads' OpenMP barriers wait out scheduler slices (a 0.5 ms expert call
took 50-290 ms), which ruins the smoke chain's timings. One thread per worker keeps them steady."""

import torch

torch.set_num_threads(1)
