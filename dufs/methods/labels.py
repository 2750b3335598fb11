"""Labels as the supervised methods read them: checked once (:func:`dufs.engine.matrix.check_labels`: one per row,
finite, strings encoded as classes), then either classes or a numeric target.

scikit-learn's ``type_of_target`` decides which: "binary" (at most two distinct values), "multiclass" (more, all
whole numbers) or "continuous" (some value not a whole number). The classification methods (Fisher score, MMFS,
QPFS) refuse a continuous target; the correlation filter takes |Pearson| on a binary or continuous target and the
correlation ratio on classes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dufs.engine import Matrix, check_labels
from dufs.errors import ParameterError
from dufs.kernels.codes import class_codes


def labels_of(M: Matrix, y: Any, method: str) -> np.ndarray:
    """The labels of ``M`` (``y``, or the matrix's own) as float64, checked: numbers as they are, other labels as
    class indices; a :class:`ParameterError` when there are none."""
    if y is None:
        y = M.y
        if y is None:
            raise ParameterError(f"method {method!r} is supervised: give labels y (or a store with labels)")
        return y
    return check_labels(y, M.shape[0])[0]


def target_type(y: np.ndarray) -> str:
    """``"binary"``, ``"multiclass"`` or ``"continuous"`` (scikit-learn's ``type_of_target`` of float64 labels)."""
    from sklearn.utils.multiclass import type_of_target

    kind = type_of_target(np.asarray(y, dtype=np.float64).ravel())
    return kind if kind in ("binary", "multiclass") else "continuous"


def unique_codes(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, codes)``: the sorted distinct labels and each sample's index among them, as ``np.unique(y,
    return_inverse=True)`` gives them (the distinct values first, then a binary search of each label among them,
    faster than the inverse's sort: docs/measurements.md, "Labels")."""
    classes = np.unique(y)
    if y.dtype == np.float64 and y.ndim == 1 and not (classes.size and np.isnan(classes[-1])):
        return classes, class_codes(y, classes)
    return classes, np.searchsorted(classes, y).astype(np.int64)


def class_labels(y: np.ndarray, method: str) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, codes)`` of labels that must be classes (``method`` classifies), after checking that they are:
    a continuous target (a value that is not a whole number) or a single class is a :class:`ParameterError`."""
    y = np.asarray(y, dtype=np.float64).ravel()
    classes, codes = unique_codes(y)
    # target_type's rule on the distinct values alone (type_of_target and np.unique's inverse are slower:
    # docs/measurements.md, "Labels")
    if np.any(classes != np.trunc(classes)):
        n = classes.shape[0]
        raise ParameterError(f"method {method!r} needs class labels; y looks continuous ({n} distinct values, not all "
                             f"whole numbers): give class labels (ints or strings), or use method='correlation', "
                             f"which takes a numeric target")
    if classes.shape[0] < 2:
        raise ParameterError(f"method {method!r} needs at least two classes in y; got "
                             f"{'no samples' if not y.size else '1 class (every sample has the same label)'}")
    return classes, codes.astype(np.int64, copy=False).reshape(-1)
