"""pandas DataFrames: ``dufs.fit`` takes numeric ones as the estimators do, and both refuse a non-numeric column
with the same message."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import dufs
from dufs.errors import ParameterError

RNG = np.random.default_rng(0)
X = RNG.random((40, 7))
Y = np.arange(40) % 2
X[Y == 1, 4] += 1.0  # a feature that tells the classes apart
FRAME = pd.DataFrame(X, columns=[f"g{i}" for i in range(7)])


def test_fit_takes_a_numeric_frame_as_its_values():
    sel = dufs.fit(FRAME, pd.Series(Y), method="fisher", n_features=3)
    ref = dufs.fit(X, Y, method="fisher", n_features=3)
    assert sel.indices.tolist() == ref.indices.tolist() and sel.indices[0] == 4
    np.testing.assert_array_equal(sel.scores, ref.scores)
    assert sel.source["selected_feature_ids"] == [f"g{i}" for i in ref.indices]  # the columns' names kept


def test_fit_and_the_estimator_agree_on_a_frame():
    est = dufs.FisherScore(n_features=3).fit(FRAME, Y)
    assert est.get_support(indices=True).tolist() == sorted(dufs.fit(FRAME, Y, method="fisher",
                                                                     n_features=3).indices.tolist())
    assert est.feature_names_in_.tolist() == FRAME.columns.tolist()


def test_a_frame_of_sparse_columns_stays_sparse():
    S = sp.random_array((40, 7), density=0.3, rng=1, format="csr")
    frame = pd.DataFrame.sparse.from_spmatrix(S)
    sel = dufs.fit(frame, Y, method="fisher", n_features=3)
    assert sel.source["nnz"] == S.nnz  # the nonzeros only: no zeros made explicit
    assert sel.indices.tolist() == dufs.fit(S, Y, method="fisher", n_features=3).indices.tolist()


def test_a_non_numeric_column_is_refused_alike_by_fit_and_the_estimator():
    frame = FRAME.assign(city=["x"] * 40)
    with pytest.raises(ParameterError) as by_fit:
        dufs.fit(frame, Y, method="fisher", n_features=3)
    with pytest.raises(ParameterError) as by_est:
        dufs.FisherScore(n_features=3).fit(frame, Y)
    assert "non-numeric columns ['city']" in str(by_fit.value)
    assert str(by_est.value) == str(by_fit.value).replace("parameter of fit", "parameter of FisherScore")
