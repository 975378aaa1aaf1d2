#!/usr/bin/env python3
"""Fails when code above kernels/ includes a kernels-internal header.

    scripts/check-layering.py [--root DIR] [--list-public]

Layers above kernels/ (src/, and their public headers under include/trident/
outside kernels/) call the tensor ops of kernels/functional.hpp; the pointer
kernels (ops.hpp, gemm.hpp, attention.hpp, moe.hpp, router.hpp, swiglu.hpp,
the backend lists, the op table, kernels/cuda/...) are kernels/'s own. This
check reads every `#include "trident/kernels/..."` (or <...>) of those files
and accepts only the public headers listed in PUBLIC below, and checks that
the public headers themselves include no internal one (so that including
functional.hpp does not bring the pointer API along). share/trident/design.md
("Who calls what") says which header is which and why.

Exceptions (EXCEPTIONS below, each with its reason): the bench engine's
spot check takes the fp64 reference row from kernels/attention.hpp, and the
NCCL communicator checks its CUDA calls with kernels/cuda/check.hpp. Every
bench runs on the tensor ops.

Exit 0 when nothing is wrong, 1 with one line per offending include
(file:line, the header, what to include instead), 2 for bad arguments or a
public header in the list that does not exist (so the list cannot rot).
"""
import argparse
import os
import re
import sys

SUFFIXES = (".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh", ".inc")
KERNELS = "include/trident/kernels/"

# The public op API and the kernels/ headers that are not kernels, relative
# to include/trident/kernels/ (a name ending in '/' is a folder), with why
# layers above kernels/ may include each.
PUBLIC = {
    "functional.hpp": "the ops on tensors",
    "tensor_ops.hpp": "tensors made for a Ctx, their copies, fills and transfers",
    "context.hpp": "Ctx and Workspace, what every op runs with",
    "types/": "the parameter and shape types the ops take (no kernel)",
    "host_device.hpp": "TRIDENT_HD, which the types' shared arithmetic carries",
    "backend.hpp": "the rank's device and its DeviceContext",
    "blas.hpp": "the host BLAS's process settings (threads, names) and the CPU's bf16 path, "
                "chosen per process at run time (bench step alternates staged and native)",
    "staging.hpp": "the DeviceStaging of a Ctx's device, for host transports",
    "buffer_uses.hpp": "device buffers in use by a communicator's pending operations",
    "attention_tiles.hpp": "the CPU kernel's tile plan (integers), which the cp document "
                           "layout prices",
}

# (path prefix, kernels header or None for any, reason): includes allowed
# there besides PUBLIC.
EXCEPTIONS = [
    ("src/bench/engine.cpp", "attention.hpp", "the spot check's fp64 reference row "
                                              "(attention_reference_row, host memory; no "
                                              "tensor op computes it)"),
    ("src/comm/nccl/", "cuda/check.hpp", "the NCCL communicator checks its CUDA calls"),
]

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]trident/kernels/([^>"]+)[>"]')


def is_public(header):
    return any(header == p or (p.endswith("/") and header.startswith(p)) for p in PUBLIC)


def excepted(path, header):
    return any(path.startswith(prefix) and (allowed is None or allowed == header)
               for prefix, allowed, _ in EXCEPTIONS)


def sources(root, folder):
    """Paths (relative to root, '/'-separated) of the C++ files under folder."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(SUFFIXES):
                full = os.path.join(dirpath, name)
                out.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return out


def includes(root, path):
    """(line number, kernels header) of every kernels include of path."""
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield number, m.group(1)


def above_kernels(root):
    """The files of the layers above kernels/: src/ and include/trident/
    outside kernels/."""
    return sources(root, "src") + [p for p in sources(root, "include/trident")
                                   if not p.startswith(KERNELS)]


def public_headers(root):
    """The files the public list names (an input error when one is missing)."""
    out, missing = [], []
    for name in sorted(PUBLIC):
        full = os.path.join(root, KERNELS, name)
        if name.endswith("/"):
            if os.path.isdir(full):
                out += sources(root, KERNELS + name)
            else:
                missing.append(name)
        elif os.path.isfile(full):
            out.append(KERNELS + name)
        else:
            missing.append(name)
    return out, missing


def violations(root):
    """(path, line, header, message) of every include that breaks the rules."""
    found = []
    for path in above_kernels(root):
        for number, header in includes(root, path):
            if not is_public(header) and not excepted(path, header):
                found.append((path, number, header,
                              "kernels-internal header above kernels/: call the tensor ops "
                              "(kernels/functional.hpp) and take shapes from kernels/types/"))
    headers, _ = public_headers(root)
    for path in headers:
        for number, header in includes(root, path):
            if not is_public(header):
                found.append((path, number, header,
                              "a public kernels header includes an internal one, so every "
                              "includer sees the pointer kernels"))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--list-public", action="store_true",
                    help="print the public kernels headers (relative to %s) and exit" % KERNELS)
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    if args.list_public:
        print("\n".join(sorted(PUBLIC)))
        return 0
    if not os.path.isdir(os.path.join(root, "src")) or not os.path.isdir(
            os.path.join(root, KERNELS)):
        print("check-layering: %s has no src/ or %s" % (root, KERNELS), file=sys.stderr)
        return 2
    _, missing = public_headers(root)
    if missing:
        print("check-layering: the public list names %s, which do(es) not exist under %s"
              % (", ".join(missing), KERNELS), file=sys.stderr)
        return 2
    found = violations(root)
    for path, number, header, message in found:
        print("%s:%d: includes trident/kernels/%s: %s" % (path, number, header, message))
    print("check-layering: %d include(s) break the layering (%d files above kernels/ and %d "
          "public kernels headers read)" % (len(found), len(above_kernels(root)),
                                            len(public_headers(root)[0])))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
