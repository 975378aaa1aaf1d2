#!/usr/bin/env python3
"""Writes a small Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx) for
share/trident/examples/megatron-data.toml and the tests: documents of
long-tailed lengths (mean about --mean-length), each a learnable pattern
(a counting run from a random start, ending with the end-of-document id 1).

The layout (share/trident/data.md) is written here with numpy alone:
  .idx: b"MMIDIDX\\x00\\x00", uint64 version 1, uint8 dtype code (8: uint16),
        uint64 sequence count S, uint64 document count D = documents + 1,
        int32 lengths[S], int64 byte pointers[S], int64 document indices[D]
  .bin: the ids of every sequence, back to back.

    python3 make_megatron_data.py PREFIX [--documents N] [--vocab V] [--seed S]
"""
import argparse

import numpy as np


def documents(n, vocab, mean_length, seed):
    rng = np.random.default_rng(seed)
    # long-tailed: lognormal lengths, at least 1 token
    sigma = 1.0
    mu = np.log(mean_length) - sigma * sigma / 2
    lengths = np.maximum(1, rng.lognormal(mu, sigma, n).astype(np.int64))
    out = []
    for length in lengths:
        start = int(rng.integers(2, vocab))
        body = 2 + (start - 2 + np.arange(length - 1)) % (vocab - 2)
        out.append(np.concatenate([body, [1]]).astype(np.uint16))  # 1: end of document
    return out


def write(prefix, docs):
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.zeros(len(docs), dtype=np.int64)
    pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * 2)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(d.tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype="<u8").tobytes())
        f.write(np.array([8], dtype="<u1").tobytes())
        f.write(np.array([len(docs), len(docs) + 1], dtype="<u8").tobytes())
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.arange(len(docs) + 1, dtype="<i8").tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix")
    ap.add_argument("--documents", type=int, default=2000)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--mean-length", type=float, default=16)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    docs = documents(a.documents, a.vocab, a.mean_length, a.seed)
    write(a.prefix, docs)
    print("%s.bin/.idx: %d documents, %d tokens" % (a.prefix, len(docs), sum(len(d) for d in docs)))


if __name__ == "__main__":
    main()
