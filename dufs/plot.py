"""Figures of feature selections and their evaluation, written as PNG files atomically (docs/architecture.md,
"Results and evaluation").

* :func:`plot_topk`: top-K accuracy curves (as :func:`dufs.evaluate.topk_curve` returns them) of several methods;
* :func:`plot_scores`: a selection's per-feature scores in decreasing order, or a grouped bar chart of clustering
  scores (as :func:`dufs.evaluate.kmeans_scores` returns them) per method.

matplotlib is imported on the first figure (the Agg backend). It is an extra (``pip install 'dufs[plot]'``, in the
test extra too): a plain install, which it would slow by about a fifth, draws nothing, and asking for a figure
then raises :class:`dufs.errors.MissingExtraError` naming the extra. Every input check raises
:class:`dufs.errors.ParameterError` naming the parameter.
"""

from __future__ import annotations

import numbers
import os
import tempfile
from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp

from dufs.errors import MissingExtraError, ParameterError

__all__ = ["PLOT_EXTRA", "can_plot", "plot_scores", "plot_topk"]

#: how to install what figures need
PLOT_EXTRA = "pip install 'dufs[plot]'"


def can_plot() -> bool:
    """Whether matplotlib is installed (figures can be drawn)."""
    import importlib.util

    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a broken or stubbed-out install
        return False


def _int(value, name: str, func: str, low: int) -> int:
    if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low):
        raise ParameterError(f"The '{name}' parameter of {func} must be an int >= {low}; got {value!r}.")
    return int(value)


def _save_atomic(fig, path, func: str) -> str:
    """Write ``fig`` as PNG to a temporary name beside ``path``, then rename it over ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ParameterError(f"The 'path' parameter of {func} must be in an existing directory; "
                             f"{directory!r} does not exist.")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):  # mkstemp's 0600 -> what open() gives (0644 under umask 022), as the JSON
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            fig.savefig(f, format="png", dpi=100)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    """This process's umask (from /proc where there is one: setting and resetting it is not thread-safe)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _figure():
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError(f"figures need matplotlib, which a plain install of dufs leaves out: {PLOT_EXTRA}"
                                ) from None

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(6.4, 4.8), layout="constrained")


def plot_topk(curves: Mapping[str, Mapping], path, title: str = "Top-K accuracy", *,
              xlabel: str = "number of selected features K", ylabel: str = "accuracy") -> str:
    """Plot top-K accuracy curves (as returned by :func:`dufs.evaluate.topk_curve`) of several methods into a PNG file.

    The figure of the MMFS paper's (002) evaluation: accuracy against the number of selected features, one line
    per method.

    Parameters
    ----------
    curves : mapping of str to dict
        Method name -> ``{"k": [...], "accuracy": [...]}`` of equal lengths.
    path : str or os.PathLike
        The PNG file to write (its directory must exist); written to a temporary name and renamed on success.
    title, xlabel, ylabel : str
        Figure labels.

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    ParameterError
        When ``curves`` is empty or a curve is malformed, or the directory of ``path`` does not exist.
    """
    func = "plot_topk"
    if not isinstance(curves, Mapping) or len(curves) == 0:
        raise ParameterError(f"The 'curves' parameter of {func} must be a non-empty mapping of name -> "
                             f"{{'k': [...], 'accuracy': [...]}}; got {type(curves).__name__}.")
    fig = _figure()
    ax = fig.add_subplot()
    for name, curve in curves.items():
        ok = isinstance(curve, Mapping) and "k" in curve and "accuracy" in curve
        k = np.asarray(curve["k"], dtype=float) if ok else None
        a = np.asarray(curve["accuracy"], dtype=float) if ok else None
        if not ok or k.ndim != 1 or k.shape != a.shape or k.size == 0:
            raise ParameterError(f"The 'curves' parameter of {func} must map each name to a dict with 'k' and "
                                 f"'accuracy' lists of one equal length; {name!r} does not.")
        ax.plot(k, a, marker="o", label=str(name))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save_atomic(fig, path, func)


def plot_scores(scores, path, title: str = "Scores", *, top: int | None = None, ylabel: str = "score") -> str:
    """Plot scores into a PNG file.

    Two forms:

    * a 1-D array of per-feature scores (a selection's ``scores``): the scores sorted in decreasing order, the
      ``top`` best (all when ``None``) -- the shape of the ranking;
    * a mapping method -> ``{metric: value}`` (e.g. the ``{"acc", "nmi"}`` of
      :func:`dufs.evaluate.kmeans_scores`): a grouped bar chart, one group per method, one bar per metric, as the
      clustering tables of papers 001, 003 and 004.

    Parameters
    ----------
    scores : array-like of float or mapping of str to mapping of str to float
        What to plot (see above).
    path : str or os.PathLike
        The PNG file to write (its directory must exist); written to a temporary name and renamed on success.
    title, ylabel : str
        Figure labels.
    top : int or None, default None
        For per-feature scores, how many of the best to show.

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    ParameterError
        When ``scores`` is empty or malformed, ``top`` < 1, or the directory of ``path`` does not exist.
    """
    func = "plot_scores"
    fig = _figure()
    ax = fig.add_subplot()
    if isinstance(scores, Mapping):
        if len(scores) == 0 or not all(isinstance(v, Mapping) and len(v) for v in scores.values()):
            raise ParameterError(f"The 'scores' parameter of {func} must be a non-empty mapping of method -> "
                                 "non-empty {metric: value}.")
        methods = list(scores)
        metrics = list(dict.fromkeys(m for v in scores.values() for m in v))
        width = 0.8 / len(metrics)
        x = np.arange(len(methods))
        for j, metric in enumerate(metrics):
            vals = [float(scores[name].get(metric, np.nan)) for name in methods]
            ax.bar(x + (j - (len(metrics) - 1) / 2) * width, vals, width, label=str(metric))
        ax.set_xticks(x, [str(name) for name in methods])
        ax.legend()
    else:
        s = np.asarray(scores, dtype=float) if not sp.issparse(scores) else None
        if s is None or s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)):
            raise ParameterError(f"The 'scores' parameter of {func} must be a non-empty 1-D array of finite "
                                 "scores or a mapping of method -> {metric: value}.")
        if top is not None:
            top = _int(top, "top", func, 1)
        order = np.sort(s)[::-1][:top]
        ax.plot(np.arange(1, order.size + 1), order, marker="." if order.size <= 200 else None)
        ax.set_xlabel("rank")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return _save_atomic(fig, path, func)
