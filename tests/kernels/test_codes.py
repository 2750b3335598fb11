from __future__ import annotations

import numpy as np
import pytest

from dufs.kernels.codes import class_codes
from dufs.methods.labels import unique_codes


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 9, 16, 33])
def test_class_codes_are_numpys_search_among_the_classes(k):
    rng = np.random.default_rng(k)
    classes = np.sort(rng.choice(np.arange(-50.0, 50.0), k, replace=False))
    y = np.concatenate([rng.choice(classes, 5000), rng.uniform(-60, 60, 500), [-np.inf, np.inf, -0.0]])
    np.testing.assert_array_equal(class_codes(y, classes), np.searchsorted(classes, y))


def test_unique_codes_are_numpys_unique_with_its_inverse():
    rng = np.random.default_rng(0)
    for y in [(rng.random(10_000) < 0.3).astype(np.float64), rng.integers(0, 7, 1000).astype(np.float64),
              np.array([3.0, -0.0, 0.0, 2.5, -1e300]), np.array([np.nan, 1.0, 2.0, np.nan]), np.arange(5),
              np.array([], dtype=np.float64)]:
        classes, codes = unique_codes(y)
        ref, inverse = np.unique(y, return_inverse=True)
        np.testing.assert_array_equal(classes, ref)
        np.testing.assert_array_equal(codes, inverse.reshape(-1))
        assert codes.dtype == np.int64
