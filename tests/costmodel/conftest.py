"""Hypothesis strategies shared by the cost-model tests: exact rationals for times, bytes and
bandwidths, and acceptance rates. Import them: `from tests.costmodel.conftest import pos`."""

from fractions import Fraction as F

from hypothesis import settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=100, deadline=None)
# rationals drawn as integer numerators over fixed denominators: st.fractions is ~10x slower
pos = st.integers(1, 64).map(lambda n: F(n, 8)) | st.integers(1, 24).map(lambda n: F(n, 3))
nonneg = st.integers(0, 64).map(lambda n: F(n, 8))
acceptance = st.integers(0, 23).map(lambda n: F(n, 24))  # a in [0, 1)
step_times = st.lists(pos, min_size=2, max_size=5)  # V(0..kmax), kmax <= 4
