"""methods layer of dufs (docs/architecture.md, "Layers")."""
