"""UFCM: unsupervised feature analysis with class margin optimisation (paper 003, Wang et al.), docs/methods.md "UFCM".

UFCM reads the matrix's stored values as ``values`` says (``"auto"``: their presence, 1 for each, on sparse
non-negative unstandardized data such as counts, where the raw values let a few large counts decide the principal
directions and the clusters; raw values otherwise: docs/methods.md, "What UFCM reads"). With Zc the implicitly
transformed data centred by its column means (n_samples x n_features, never formed), the
objective (eq. (6), with the l2,p term as ||W||_{2,p}^p, docs/methods.md "UFCM") is

    f(W, U, G) = Tr(W^T S_t W) - alpha ||Zc W - U G^T||_F^2 - beta sum_i ||w^i||^p,   W^T W = I,

S_t = Zc^T Zc, U the n x c cluster indicator, G the d' x c centroids. Algorithm 1 alternates, from W by PCA and U
by k-means on Zc W:

- D_ii = p / (2 ||w^i||^(2-p)) (eq. (7)), the weights of the tangent majoriser of ||W||_{2,p}^p at the current W
  (eq. (8) is a majorisation, not the equivalence the paper says);
- U (eq. (14)): candidates are the current U, Lloyd's k-means started from the current centroids G and ``n_init``
  k-means runs from random (k-means++) starts, all on Y = Zc W; each is judged by the k-means term with its own
  centroids (G from eq. (10)), the smallest kept. The paper judges random candidates against the *old* G, which
  makes a random candidate lose to plain reassignment (eq. (9)) almost surely; judged with their own centroids the
  restarts can win, and keeping the current U among the candidates makes the step never increase the term (above
  ``_KMEANS_SAMPLE_ABOVE`` samples a restart is fitted on a sample and judged after one assignment of all rows,
  the winner then refined by Lloyd on all rows: :func:`dufs.methods.ufcm.clusters._choose`);
- W: the algebraically largest d' eigenvectors of A = S_t - alpha S_w - beta D (eq. (13) with centred data:
  X X^T - X U (U^T U)^-1 U^T X^T = S_w), which can be indefinite. S_w = S_t - S_b and S_b = Q diag(1/n_k) Q^T with
  Q = Zc^T U (d x c, one pass), so A v = (1 - alpha) Zc^T (Zc v) + alpha Q diag(1/n_k) Q^T v - beta D v;
- G = W^T Zc^T U (U^T U)^-1 = W^T Q diag(1/n_k) (eq. (10)).

Every step does not decrease f (Proposition 1, for 0 < p <= 2): the U step by construction, the W step because
Tr(W^T A W) - beta (1 - p/2) ||W_old||_{2,p}^p is a minorant of f( . , U, G*( . )) touching it at W_old. A row of W
whose norm is below ``_EPS`` (a constant feature, say) has an infinite D_ii in the limit: it is kept at zero, out of
the eigenproblem, which keeps the guarantee exact (a finite guard D_ii = p / (2 eps^(2-p)) would break it by up to
beta eps^p per such row).

Below ``dense_below`` features the d x d matrix S_t is built once (2 passes per chunk of columns: Z E then Z^T)
and each W step is a dense ``numpy.linalg.eigh``. Above, the PCA start is block subspace iteration (two passes an
iteration: Zc V, then Zc^T of it); with alpha = 1 (the default) A = Q diag(1/n_k) Q^T - beta D is a diagonal plus
a rank-c matrix and the W step solves its secular equation with c x c eigenproblems and no pass over the data;
otherwise it is LOBPCG warm-started from the previous W on a ``LinearOperator`` whose product with a d x k block
costs two passes. k-means runs on the n x d' projection in this process (scikit-learn, restarts in threads);
n x max(d', c) float64 must fit ``dufs.engine.max-task-bytes`` (at kddb size, 19.3M samples and the default
1 GiB: up to 6).

References
----------
Wang, Nie, Chang, Yao, Li, Sheng, "Unsupervised Feature Analysis with Class Margin Optimization", ECML PKDD 2015,
eqs. (6)-(14), Algorithm 1, Proposition 1.
"""

from dufs.methods.ufcm.method import SPARSE_VALUES, UFCM_PARAMS, UFCMResult, ufcm, ufcm_objective, ufcm_values

__all__ = ["SPARSE_VALUES", "UFCM_PARAMS", "UFCMResult", "ufcm", "ufcm_objective", "ufcm_values"]
