"""scikit-learn estimators over the functional API, one per method.

Each estimator validates its parameters (one ``_parameter_constraints`` table) and its input, calls the plain
function :func:`dufs.api.fit`, and stores what it found in attributes ending in ``_``. Choosing the columns
(``transform``, ``get_support``, ``get_feature_names_out``) comes from
:class:`~sklearn.feature_selection.SelectorMixin`.

>>> from dufs.estimators import FisherScore
>>> FisherScore(n_features=20).fit(X, y).get_support(indices=True)   # doctest: +SKIP
"""

from __future__ import annotations

from dufs.estimators.base import EstimatorParameterError
from dufs.estimators.clustering import M3FS, UFCM
from dufs.estimators.filters import CorrelationSelector, FisherScore, LaplacianScore, VarianceSelector
from dufs.estimators.greedy import JCFS, LapAOFS, LapDOFS
from dufs.estimators.mmfs import MMFS

__all__ = ["JCFS", "M3FS", "MMFS", "UFCM", "CorrelationSelector", "EstimatorParameterError", "FisherScore", "LapAOFS",
           "LapDOFS", "LaplacianScore", "VarianceSelector"]
