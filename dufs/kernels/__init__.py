"""kernels layer of dufs (see DESIGN.md section 2)."""
