"""Selection._repr_html_: the method, the parameters in force (Selection.provenance), the top features with their
scores, how the run stopped; every user string escaped. Read back with the standard library's HTML parser."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pytest

import dufs
from dufs.selection import Selection


class _Reader(HTMLParser):
    """The text of the page, and each table as rows of cell texts (entities decoded)."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[str]]] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _shown(v):
    return repr(v) if isinstance(v, str) or v is None or isinstance(v, bool) else str(v)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 40))
    y = (X[:, 5] + X[:, 17] + 0.5 * rng.normal(size=120) > 0).astype(int)
    return X, y


@pytest.mark.parametrize("method,params,stop", [
    ("fisher", {}, "scored in closed form"),
    ("laplacian", {"n_neighbors": 7}, "scored in closed form"),
    ("mmfs", {}, "converged (rounds"),
    ("lapaofs", {}, "12 greedy steps"),
])
def test_html_summary_of_a_fit(data, method, params, stop):
    X, y = data
    sel = dufs.fit(X, y, method=method, n_features=12, **params)
    page = _Reader(sel._repr_html_())
    text = "".join(page.text)
    assert f"dufs Selection: {method}, 12 of 40 features selected" in text
    # the parameters in force: every entry of the provenance, the method's defaults included, and the given ones
    in_force = {r[0]: r[1] for r in page.tables[0][1:]}
    want = {"n_features": "12", "standardize": _shown(sel.provenance["standardize"]),
            **{k: _shown(v) for k, v in sel.provenance["params"].items()}}
    if sel.provenance["graph"] is not None:
        want["graph built"] = _shown(sel.provenance["graph"])
    assert in_force == want
    for k, v in params.items():
        assert in_force[k] == str(v)
    if method in ("laplacian", "lapaofs"):
        assert in_force["graph"] == "'auto'" and in_force["graph built"] == "'knn'"
    # the top 10 features, best first, from the scores themselves (an independent ranking)
    s = sel.scores if sel.higher_is_better else -sel.scores
    if method == "lapaofs":  # greedy: the order of choice, not of a score
        top = sel.indices[:10]
    else:
        top = np.argsort(-s, kind="stable")[:10]
    assert page.tables[-1][0] == ["rank", "feature", "score"]
    rows = page.tables[-1][1:]
    assert [int(r[1]) for r in rows] == top.tolist()
    assert [r[0] for r in rows] == [str(i) for i in range(1, 11)]
    np.testing.assert_allclose([float(r[2]) for r in rows], sel.scores[top], rtol=1e-5)
    assert "2 more not shown" in text
    assert f"stopped: {stop}" in text
    assert f"passes over the data: {sel.diagnostics['passes']}" in text
    assert f"dufs {dufs.__version__}" in text


def test_html_escapes_user_strings():
    sel = Selection(method="fisher", indices=[2, 0], scores=[0.5, 0.1, 0.9], n_features_in=3,
                    params={"n_features": 2}, higher_is_better=True,
                    source={"kind": "store", "shape": [4, 3], "nnz": 7, "path": "data/<b>&co.zarr",
                            "selected_feature_ids": ["<i>f2</i>", "a&b"]},
                    provenance={"params": {"note<": "<script>alert('x')</script>"}, "standardize": None,
                                "graph": "<g>", "versions": {"dufs": "<v>"}},
                    diagnostics={"stopped": "<max_passes>", "degenerate": "<every score equal> & more"})
    raw = sel._repr_html_()
    for s in ("<script>", "<i>", "<b>&", "<g>", "<v>", "<max_passes>", "<every", "note<"):
        assert s not in raw
    assert "&lt;script&gt;" in raw and "&lt;i&gt;f2&lt;/i&gt;" in raw and "a&amp;b" in raw
    page = _Reader(raw)
    text = "".join(page.text)
    in_force = {r[0]: r[1] for r in page.tables[0][1:]}
    assert in_force["note<"] == repr("<script>alert('x')</script>")
    assert in_force["graph built"] == "'<g>'"
    assert page.tables[-1][1:] == [["1", "2", "<i>f2</i>", "0.9"], ["2", "0", "a&b", "0.5"]]
    assert "data/<b>&co.zarr" in text and "stopped: <max_passes>" in text and "<every score equal> & more" in text


def test_html_without_provenance_and_unconverged():
    sel = Selection(method="mmfs", indices=[1], scores=[0.0, 2.0], n_features_in=2,
                    params={"n_features": 1, "C": 0.5},
                    diagnostics={"converged": False, "rounds": 500, "relative_gap": 0.25, "passes": 9})
    page = _Reader(sel._repr_html_())
    text = "".join(page.text)
    assert "defaults in force were not recorded" in text
    assert {r[0]: r[1] for r in page.tables[0][1:]} == {"n_features": "1", "C": "0.5"}
    assert "stopped: not converged (iteration limit) (rounds 500, relative gap 0.25)" in text
    assert "passes over the data: 9" in text
