"""methods layer of dufs (docs/architecture.md, "Layers")."""

#: the names ``dufs.fit(method=...)`` takes, in :data:`dufs.methods.registry.METHODS` order; here so that the CLI
#: can name them without importing every method (the registry checks that the two agree)
NAMES = ("variance", "correlation", "fisher", "laplacian", "mmfs", "qpfs", "lapaofs", "lapdofs", "jcfs", "ufcm", "m3fs")
