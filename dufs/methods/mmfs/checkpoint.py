"""MMFS's checkpoint: the support of alpha and the round it was written at, in one file written atomically."""

from __future__ import annotations

import json
import os

import numpy as np

from dufs.errors import ParameterError
from dufs.methods.solver import atomic_write


class Checkpoint:
    """``<directory>/checkpoint.npz``: alpha and a JSON of the rest (round, gamma, the path position, the trace,
    the problem it belongs to), written to a temporary name and renamed into place (atomic)."""

    NAME = "checkpoint.npz"

    def __init__(self, directory: str, problem: dict):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, self.NAME)
        self.problem = problem
        self.writes = 0
        self.last_round: int | None = None

    def save(self, alpha: np.ndarray, meta: dict, support: tuple | None = None) -> None:
        """Write ``alpha`` (its nonzeros: ``support``, (indices, values), where the caller has them) and ``meta``."""
        os.makedirs(self.directory, exist_ok=True)
        meta = {"format": 2, "problem": self.problem, **meta}
        if support is None:
            nz = np.flatnonzero(alpha)  # the support only: alpha is sparse
            support = (nz, alpha[nz])
        nz, val = support
        atomic_write(self.path, lambda f: np.savez(
            f, n=np.int64(alpha.shape[0]), index=nz, value=np.asarray(val, dtype=np.float64),
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)))
        self.writes += 1
        self.last_round = int(meta.get("round", -1))

    def load(self) -> tuple[np.ndarray, dict] | None:
        """The checkpoint (alpha, meta), None when there is none; a ParameterError naming the file when it is
        unreadable or belongs to another problem."""
        if not os.path.exists(self.path):
            return None
        try:
            with np.load(self.path, allow_pickle=False) as z:
                alpha = np.zeros(int(z["n"]))
                alpha[np.asarray(z["index"], dtype=np.int64)] = np.asarray(z["value"], dtype=np.float64)
                meta = json.loads(bytes(np.asarray(z["meta"], dtype=np.uint8)).decode())
        except Exception as e:  # noqa: BLE001 - any failure to read means the file is not a usable checkpoint
            raise ParameterError(f"the MMFS checkpoint {self.path} is unreadable ({type(e).__name__}: {e}); "
                                 f"delete it or run with resume=False") from None
        theirs = meta.get("problem", {})
        for key, ours in self.problem.items():
            got = theirs.get(key)
            same = (np.allclose(got, ours, rtol=1e-9, atol=0.0) if key == "rho" and got is not None
                    and len(got) == len(ours) else got == ours)
            if not same:
                raise ParameterError(f"the MMFS checkpoint {self.path} belongs to another problem ({key}: "
                                     f"{got!r} in the file, {ours!r} here); delete it, give another checkpoint "
                                     f"directory, or run with resume=False")
        if alpha.shape != (self.problem["shape"][1],):
            raise ParameterError(f"the MMFS checkpoint {self.path} holds {alpha.shape[0]} alphas for "
                                 f"{self.problem['shape'][1]} features")
        return alpha, meta
