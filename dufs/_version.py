"""dufs's version, and those of the libraries its results depend on (what ``dufs --version`` prints and a
selection file records)."""

__version__ = "0.1.0"

#: the libraries whose versions a result records, beside dufs's and Python's
VERSIONED = ("dask", "distributed", "numpy", "scipy", "zarr", "numba", "scikit-learn")


def versions() -> dict[str, str]:
    """The versions of dufs, the libraries of :data:`VERSIONED` and Python (from the installed packages'
    metadata: nothing is imported)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found = {"dufs": __version__}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    found["python"] = platform.python_version()
    return found
