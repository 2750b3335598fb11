"""M3FS, unsupervised maximum margin feature selection with manifold regularisation (papers 000; docs/methods.md,
"M3FS"), as a package of its parts:

- :mod:`~dufs.methods.m3fs.problem`: the parameters, the normalised Laplacian and the closed-form sigma step;
- :mod:`~dufs.methods.m3fs.faithful`: the paper's cutting plane, CCCP and SOCP, for moderate dimension;
- :mod:`~dufs.methods.m3fs.alternating`: the scalable alternation of labels, v and sigma;
- :mod:`~dufs.methods.m3fs.vstep`: its v-step (smoothed hinge, manifold term, class balance, placement);
- :mod:`~dufs.methods.m3fs.fista`: the v-step's solver (FISTA with backtracking and restart);
- :mod:`~dufs.methods.m3fs.resident`: the v-step's state kept on the workers beside the blocks.
"""

from dufs.methods.m3fs.alternating import M3FSAlternatingResult, m3fs_alternating
from dufs.methods.m3fs.faithful import M3FSResult, m3fs_faithful
from dufs.methods.m3fs.problem import M3FS_PARAMS, m3fs_laplacian, sigma_step

__all__ = ["M3FS_PARAMS", "M3FSAlternatingResult", "M3FSResult", "m3fs_alternating", "m3fs_faithful",
           "m3fs_laplacian", "sigma_step"]
