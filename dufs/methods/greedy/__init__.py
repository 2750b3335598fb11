"""Greedy sequential selectors in feature space: LapAOFS, LapDOFS (paper 004) and JCFS's greedy Fisher step
(paper 001), in the feature-space forms of docs/methods.md ("LapAOFS and LapDOFS", "JCFS").

With Z the implicitly transformed data (n_samples x n_features, never formed), B = I + lambda1 L (LapAOFS and
LapDOFS; B = I and lambda2 = gamma for JCFS) and G = Z^T B Z + lambda2 I (never formed), the selected set S has the
k x k matrix H = G_SS. Every candidate g keeps O(1) numbers where its block lives: its Schur complement
s_g = G_gg - G_gS H^-1 G_Sg and one more (LapAOFS: v_g = ||H^-1 G_Sg||^2; JCFS: ||E_g||^2 with
E = Z^T Y - G_.S H^-1 Z_S^T Y). The choices:

- LapAOFS (A-optimal, eq. (20)): argmin (1 + v_g) / s_g, the increase of Tr(H^-1);
- LapDOFS (D-optimal, eq. (29)): argmax s_g, det H grows by the factor s_g;
- JCFS (eq. (14)): argmax ||E_g||^2 / s_g.

A step is one pass: the driver, holding only the selected columns and H, builds two n-vectors V = [B r, B Z_S d]
(JCFS: [r, q]) for the feature p just chosen; every block computes Z_b^T V, updates its candidates' numbers
(:func:`dufs.kernels.greedy.greedy_update`) and proposes its best; the driver takes the global best (ties: the
lower feature index). Recorded per step, in the papers' own terms: the chosen feature's criterion (eq. (20),
(29) or (14) evaluated at it) and the objective after the step (Tr(H^-1), log det H, or tr(Y^T M_S Y)).

Checkpoints: with ``checkpoint`` (a directory; ``"auto"``: beside a local store, else under
``dufs.checkpoint.dir``, removed after a successful run unless ``dufs.checkpoint.keep``:
:func:`~dufs.methods.solver.checkpoint_root`) the driver writes the selected
sequence after every step and every block its candidates' numbers every ``checkpoint_every`` steps (atomic
writes); ``resume=True`` continues from there, re-running only the update passes of the steps after the last
complete set of block files. A round that fails because workers were lost rebuilds the block state the same way.
"""

from dufs.methods.greedy.columns import SelectedColumns
from dufs.methods.greedy.lapofs import LAPOFS_PARAMS, lapofs
from dufs.methods.greedy.run import GreedyResult, GreedyRun, check_k, run_greedy

__all__ = ["LAPOFS_PARAMS", "GreedyResult", "GreedyRun", "SelectedColumns", "check_k", "lapofs", "run_greedy"]
