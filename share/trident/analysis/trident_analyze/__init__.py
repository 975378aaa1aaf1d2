"""trident-analyze: read trident run files (share/trident/hdf5-layout.md) and
turn them into summaries, figures, Chrome traces and run-to-run comparisons.

Only the documented layout is read, so this package doubles as an example of
how to use it from h5py.
"""

__version__ = "0.1.0"
