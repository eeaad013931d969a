"""Deterministic mock models at the CachedModel level, shared by the engine tests."""

import pytest
import torch

from moespec.backends.table_model import TableLM


@pytest.fixture
def table_lm():
    """Factory: table_lm(V=48, seed=0, width=None, scale=1.0) -> TableLM."""
    return TableLM


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a shared, loaded machine an OpenMP
    barrier per op can cost milliseconds; run the engine tests single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
