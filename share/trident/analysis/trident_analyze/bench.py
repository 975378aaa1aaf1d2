"""Reading a trident bench file (`trident bench ... --output FILE.h5`).

The layout is the one in share/trident/hdf5-layout.md ("Bench file"): one
group per table under /bench, one dataset per column, the printed headers in
the group's `columns` attribute. Tables that the bench writes to the file
only (ring_steps) are read like the others.
"""
from __future__ import annotations

import h5py
import numpy as np

from .runfile import AnalysisError, first_line


def _text(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.dtype.kind in "SO":
        return [_text(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_bench(path: str) -> dict:
    """{"command", "created_utc", "tables": {name: {"title", "notes", "columns", "rows"}}}."""
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise AnalysisError(f"{path}: no such file")
    except OSError as e:
        raise AnalysisError(f"{path}: not a readable HDF5 file (truncated or damaged?): {first_line(e)}")
    with f:
        fmt = _text(f.attrs.get("format"))
        if fmt != "trident-bench":
            raise AnalysisError(f"{path}: not a trident bench file (root attribute format = {fmt!r}, "
                                f"expected 'trident-bench')")
        tables = {}
        for name, g in f.get("bench", {}).items():
            by_header = {_text(g[d].attrs["column"]): g[d] for d in g}
            columns = _text(g.attrs["columns"])
            data = []
            for h in columns:
                ds = by_header[h]
                data.append([_text(x) for x in ds[()]] if ds.dtype.kind in "SO" else ds[()].tolist())
            tables[name] = {"title": _text(g.attrs.get("title", "")),
                            "notes": _text(g.attrs.get("notes", [])),
                            "columns": columns,
                            "rows": [list(r) for r in zip(*data)] if data else []}
        return {"command": _text(f.attrs.get("command", "")),
                "created_utc": _text(f.attrs.get("created_utc", "")),
                "tables": tables}


def select(b: dict, names) -> dict:
    """Only the named tables (all when names is empty); an unknown name is an error."""
    if not names:
        return b
    unknown = [n for n in names if n not in b["tables"]]
    if unknown:
        raise AnalysisError(f"--table {unknown[0]}: no such table (the file has: "
                            f"{', '.join(sorted(b['tables']))})")
    return dict(b, tables={n: b["tables"][n] for n in names})


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def format_text(b: dict) -> str:
    out = [f"command  {b['command']}", f"created  {b['created_utc']}"]
    for name, t in b["tables"].items():
        out += ["", f"# [{name}] {t['title']}"]
        cells = [[_cell(v) for v in r] for r in t["rows"]]
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(t["columns"])]
        out.append("  ".join(h.rjust(w) for h, w in zip(t["columns"], widths)))
        out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
        out += [f"# {n}" for n in t["notes"]]
    return "\n".join(out)


def to_json_ready(b: dict) -> dict:
    """The same with NaN cells (a column the run did not measure) as None."""
    def fix(v):
        return None if isinstance(v, float) and v != v else v
    return dict(b, tables={n: dict(t, rows=[[fix(v) for v in r] for r in t["rows"]])
                           for n, t in b["tables"].items()})
