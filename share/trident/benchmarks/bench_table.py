"""A table added to a trident bench file (`trident bench ... --output FILE.h5`)
by a peer's script (torch-attention-bench.py, torch-moe-bench.py), in the
file's own layout (share/trident/hdf5-layout.md, "Bench file": one group per
table under /bench, one dataset per column named as trident names it, the
headers in the group's `columns` attribute), so that `trident-analyze bench
FILE.h5` prints PyTorch's rows beside trident's.

A table that is already in the file with the same columns gets the new rows
appended (one script run per precision or mask adds its rows); other columns
replace it. The file must exist and be a trident bench file: the rows are put
beside a trident measurement, never in a file of their own.
"""
import h5py
import numpy as np


def dataset_name(column):
    """bench_dataset_name (io/bench_report.hpp): '/' -> '_per_', ' ' -> '_'."""
    return column.replace("/", "_per_").replace(" ", "_")


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _old_rows(g, columns):
    if [_text(c) for c in g.attrs["columns"]] != columns:
        return []
    cols = []
    for c in columns:
        ds = g[dataset_name(c)]
        cols.append([_text(x) for x in ds[()]] if ds.dtype.kind in "SO" else ds[()].tolist())
    return [list(r) for r in zip(*cols)]


def _write_column(g, column, values):
    if all(isinstance(v, str) for v in values):
        ds = g.create_dataset(dataset_name(column), data=np.array(values, dtype=object),
                              dtype=h5py.string_dtype("utf-8"))
    elif all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        ds = g.create_dataset(dataset_name(column), data=np.array(values, dtype=np.int64))
    else:
        ds = g.create_dataset(dataset_name(column), data=np.array(values, dtype=np.float64))
    ds.attrs["column"] = column


def add_table(path, name, title, columns, rows, notes):
    """Adds rows (lists of str, int or float, one per column) to table `name`
    of the trident bench file at path; raises SystemExit with one line when
    path is not one."""
    try:
        f = h5py.File(path, "a")
    except OSError as e:
        raise SystemExit(f"--bench-h5 {path}: cannot open ({e})")
    with f:
        if _text(f.attrs.get("format")) != "trident-bench":
            raise SystemExit(f"--bench-h5 {path}: not a trident bench file (trident bench ... --output)")
        bench = f.require_group("bench")
        old = _old_rows(bench[name], columns) if name in bench else []
        if name in bench:
            del bench[name]
        all_rows = old + [list(r) for r in rows]
        g = bench.create_group(name)
        g.attrs["title"] = title
        g.attrs["notes"] = np.array(notes, dtype=object)
        g.attrs["columns"] = np.array(columns, dtype=object)
        g.attrs["rows"] = np.int64(len(all_rows))
        for i, c in enumerate(columns):
            _write_column(g, c, [r[i] for r in all_rows])
