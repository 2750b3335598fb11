"""dufs.fit(verbose=...) in a notebook: one HTML progress bar redrawn in place as the passes run (issue 59), fed
by the same pass callbacks as the CLI's rich bar; nothing of it outside a Jupyter kernel."""

from __future__ import annotations

import re

import numpy as np
import scipy.sparse as sp

import dufs
from dufs.engine import as_matrix
from dufs.engine.progress import NotebookBar, in_notebook, notebook_bar, on_pass


class _Shown:
    """What IPython's display would have drawn: the first display and its handle's updates, in order."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def display(self, obj, display_id=False):
        assert display_id is True  # a handle, so that the bar is redrawn in place
        self.calls.append(("display", obj))
        return self

    def update(self, obj):
        self.calls.append(("update", obj))


def _values(html):
    m = re.search(r'pass (\d+) \((.*?)\) <progress value="(\d+)" max="(\d+)"', html)
    return int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))


def test_the_bar_is_drawn_once_and_redrawn_for_every_pass():
    shown = _Shown()
    bar = NotebookBar(shown.display, str, interval=0.0)
    X = sp.random_array((300, 400), density=0.05, rng=0, format="csc")
    M = as_matrix(X, block_width=50)
    with on_pass(bar):
        M.column_stats()
        M.rmatvec(np.ones(300))
    assert shown.calls[0][0] == "display" and all(kind == "update" for kind, _ in shown.calls[1:])
    seen = [_values(html) for _, html in shown.calls]
    assert seen[-1][0] == bar.passes == 2  # two passes, counted
    assert all(0 <= done <= total for _, _, done, total in seen)
    assert seen[-1][2] == seen[-1][3]  # the last pass drawn to its end


def test_names_are_escaped_and_a_slow_pass_is_drawn_at_its_ends():
    shown = _Shown()
    bar = NotebookBar(shown.display, str, interval=3600.0)
    for done in range(6):
        bar("<rmatvec>", done, 5)
    drawn = [_values(html)[2] for _, html in shown.calls]
    assert drawn == [0, 5]  # within the interval only the start and the end
    assert "&lt;rmatvec&gt;" in shown.calls[0][1]


def test_outside_a_kernel_there_is_no_bar():
    assert not in_notebook() and notebook_bar() is None
    X = sp.random_array((200, 50), density=0.1, rng=1, format="csr")
    sel = dufs.fit(X, method="variance", n_features=5, verbose=1)  # logs, draws nothing
    assert sel.indices.shape == (5,)
