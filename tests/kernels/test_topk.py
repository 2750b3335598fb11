"""The bounded heap of dufs.kernels.topk: the k smallest keys of a sweep, ties to the lower index, against NumPy's
lexsort of (key, index), keys in random, increasing and decreasing order and tying everywhere."""

from __future__ import annotations

import numba
import numpy as np

from dufs.kernels.topk import in_order, offer


@numba.njit(cache=False)
def _head(keys, k):
    val = np.empty(k)
    idx = np.empty(k, np.int64)
    cnt = 0
    for j in range(keys.shape[0]):
        cnt = offer(val, idx, cnt, keys[j], j)
    return in_order(val, idx, cnt)


def test_heap_head_is_the_lexsort_head_of_keys_in_any_order():
    rng = np.random.default_rng(11)
    for case in range(400):
        n, k = int(rng.integers(0, 2000)), int(rng.integers(1, 300))
        keys = np.round(rng.standard_normal(n) * 2) / 2  # ties everywhere
        if case % 3 == 1:
            keys = np.sort(keys)
        elif case % 3 == 2:
            keys = np.sort(keys)[::-1].copy()
        idx, val = _head(keys, k)
        want = np.lexsort((np.arange(n), keys))[:k]
        np.testing.assert_array_equal(idx, want)
        np.testing.assert_array_equal(val, keys[want])
