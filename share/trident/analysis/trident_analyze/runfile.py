"""Reading a trident run file, with clear messages for what a file lacks.

A run killed mid-way leaves a file whose completed steps are all readable
(the writer flushes every step); parts that a run never wrote (no MoE layers,
timeline off, no activation capture) are reported as missing, by name, rather
than failing with a traceback.
"""
from __future__ import annotations

import h5py
import numpy as np

COMM_KINDS = ["cp", "pp", "ep", "dp"]

# The run file versions this package reads (share/trident/hdf5-layout.md):
# members are taken by name, and what a version lacks has a default.
NEWEST_FORMAT_VERSION = 3


class AnalysisError(Exception):
    """A problem with the user's file or request: printed as one line, exit 2."""


class RunFile:
    def __init__(self, path: str):
        self.path = path
        try:
            self.h5 = h5py.File(path, "r")
        except FileNotFoundError:
            raise AnalysisError(f"{path}: no such file")
        except OSError as e:
            raise AnalysisError(f"{path}: not a readable HDF5 file (truncated or damaged?): {first_line(e)}")
        fmt = self.attr("format", default=None)
        if fmt not in ("trident-run", b"trident-run"):
            raise AnalysisError(f"{path}: not a trident run file (root attribute format = {fmt!r}, expected 'trident-run')")
        self.format_version = int(self.attr("format_version", default=1))
        if self.format_version > NEWEST_FORMAT_VERSION:
            self.h5.close()
            raise AnalysisError(f"{path}: written by a newer trident (format_version {self.format_version}); "
                                f"this trident-analyze reads 1 to {NEWEST_FORMAT_VERSION}")

    def close(self):
        self.h5.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- generic access -------------------------------------------------
    def attr(self, name, obj="/", default=...):
        node = self.h5[obj] if obj in self.h5 else None
        if node is None or name not in node.attrs:
            if default is ...:
                raise AnalysisError(f"{self.path}: attribute {obj}:{name} is missing")
            return default
        v = node.attrs[name]
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, np.ndarray) and v.dtype.kind in "SO":
            return [x.decode() if isinstance(x, bytes) else str(x) for x in v]
        if isinstance(v, np.generic):
            return v.item()
        return v

    def has(self, path: str) -> bool:
        return path in self.h5

    def require(self, path: str, why: str):
        if path not in self.h5:
            raise AnalysisError(f"{self.path}: has no {path} ({why})")
        return self.h5[path]

    # ---- documented parts ------------------------------------------------
    @property
    def completed(self) -> bool:
        return bool(self.attr("completed", default=0))

    def config_toml(self) -> str:
        return self.attr("config_toml", default="")

    def config(self) -> dict:
        text = self.config_toml()
        if not text:
            return {}
        try:
            import tomllib  # Python 3.11+
        except ModuleNotFoundError:  # pragma: no cover
            try:
                import tomli as tomllib
            except ModuleNotFoundError:
                return {}
        try:
            return tomllib.loads(text)
        except Exception:
            return {}

    def steps(self) -> np.ndarray:
        """Structured array of /metrics/steps (one row per completed step)."""
        ds = self.require("/metrics/steps", "the run wrote no metrics: it ended before its first step")
        return ds[()]

    def comm_bytes(self):
        if not self.has("/metrics/comm_bytes"):
            return None
        return np.asarray(self.h5["/metrics/comm_bytes"][()], dtype=np.float64)

    def expert_tokens(self):
        if not self.has("/metrics/expert_tokens"):
            return None
        return np.asarray(self.h5["/metrics/expert_tokens"][()], dtype=np.int64)

    def events(self) -> np.ndarray:
        ds = self.require("/timeline/events", "output.timeline was off or the run ended before its first step")
        return ds[()]

    def checkpoints(self):
        """/metrics/checkpoints, or None; `local` is 0 in files that lack the
        member (before format_version 3, and version 2 files before issue 47)."""
        if not self.has("/metrics/checkpoints"):
            return None
        rows = self.h5["/metrics/checkpoints"][()]
        if "local" not in (rows.dtype.names or ()):
            from numpy.lib import recfunctions

            rows = recfunctions.append_fields(rows, "local", np.zeros(len(rows), np.int32), usemask=False)
        return rows

    def topology_ranks(self):
        if not self.has("/topology/ranks"):
            return None
        return self.h5["/topology/ranks"][()]

    def rank_summary(self):
        if not self.has("/ranks/summary"):
            return None
        return self.h5["/ranks/summary"][()]

    def activation(self, step: int, layer: int, name: str):
        path = f"/activations/step_{step}/layer_{layer}/{name}"
        if not self.has(path):
            avail = sorted(self.h5["/activations"].keys()) if self.has("/activations") else []
            hint = f"captured steps: {', '.join(avail)}" if avail else "the run captured no activations (output.activation_steps)"
            raise AnalysisError(f"{self.path}: has no {path} ({hint})")
        ds = self.h5[path]
        return np.asarray(ds[()], dtype=np.float32), ds.attrs.get("sample_ids")


def decode(x) -> str:
    return x.decode() if isinstance(x, (bytes, np.bytes_)) else str(x)


def first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
