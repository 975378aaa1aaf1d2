#!/usr/bin/env python3
"""Fails when code above kernels/ includes a kernels-internal header.

    scripts/check-layering.py [--root DIR] [--list-public] [--compile-commands FILE]

Layers above kernels/ (src/, and their public headers under include/trident/
outside kernels/) call the tensor ops of kernels/functional.hpp; the pointer
kernels (ops.hpp, gemm.hpp, attention.hpp, moe.hpp, router.hpp, swiglu.hpp,
the backend lists, the op table, kernels/cuda/...) are kernels/'s own. They
live in kernels/include/trident/kernels/, a PRIVATE include folder of the
kernels libraries (and of the kernels' tests), so that an include of one from
src/ fails to compile; this check is the second guard, and says why. It reads
every `#include "trident/kernels/..."` (or <...>) of those files and accepts
only the public headers listed in PUBLIC below, with no exception; checks
that the public headers themselves include no internal one (so that
including functional.hpp does not bring the pointer API along); and that the
two folders hold what they should: every header under include/trident/
kernels/ is in PUBLIC (a new kernels header goes to the private folder unless
it is added there with its reason), none of PUBLIC is in the private folder.
share/trident/design.md ("Who calls what") says which header is which and why.
With --compile-commands (a build's compile_commands.json) it also fails on a
file of src/ compiled with the private folder on its include path, so a
build that hands the folder to a src/ target is caught too.

Exit 0 when nothing is wrong, 1 with one line per offending include
(file:line, the header, what to include instead) or misplaced header (file,
where it belongs), 2 for bad arguments, a missing folder or a public header
in the list that does not exist (so the list cannot rot).
"""
import argparse
import json
import os
import re
import shlex
import sys

SUFFIXES = (".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh", ".inc")
KERNELS = "include/trident/kernels/"
PRIVATE = "kernels/include/trident/kernels/"

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
    "reference.hpp": "fp64 host references for checking results (the benches' spot check "
                     "of an attention row; host arithmetic, no tensor op computes it)",
    "cuda_check.hpp": "CUDA_CHECK, for code above kernels/ that calls the CUDA runtime "
                      "itself (the NCCL communicator); no cuBLAS, no kernel",
}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]trident/kernels/([^>"]+)[>"]')


def is_public(header):
    return any(header == p or (p.endswith("/") and header.startswith(p)) for p in PUBLIC)


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
            if not is_public(header):
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
    return found + misplaced(root)


def misplaced(root):
    """(path, 0, header, message) of every kernels header in the wrong folder."""
    found = []
    for path in sources(root, KERNELS):
        header = path[len(KERNELS):]
        if not is_public(header):
            found.append((path, 0, header, "a kernels header in the public folder that PUBLIC "
                          "does not list: move it to %s (internal), or add it to PUBLIC with "
                          "its reason" % PRIVATE))
    for path in sources(root, PRIVATE):
        header = path[len(PRIVATE):]
        if is_public(header):
            found.append((path, 0, header, "a public header in the private folder: it "
                          "belongs in %s" % KERNELS))
    return found


def include_dirs(command):
    """The folders of the -I / -isystem / -iquote flags of one compile command."""
    args = shlex.split(command)
    out = []
    for i, a in enumerate(args):
        if a in ("-I", "-isystem", "-iquote") and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith("-I") and len(a) > 2:
            out.append(a[2:])
    return out


def private_in_src(root, commands_file):
    """(path, 0, '', message) of every src/ file compiled with the private folder,
    and the number of src/ files the compile commands hold."""
    with open(commands_file, encoding="utf-8") as f:
        entries = json.load(f)
    root = os.path.realpath(root)
    private = os.path.realpath(os.path.join(root, "kernels", "include"))
    found, n_src = [], 0
    for e in entries:
        path = os.path.relpath(os.path.realpath(os.path.join(e["directory"], e["file"])), root)
        if not path.startswith("src" + os.sep):
            continue
        n_src += 1
        command = e.get("command") or " ".join(shlex.quote(a) for a in e.get("arguments", []))
        dirs = [os.path.realpath(os.path.join(e["directory"], d)) for d in include_dirs(command)]
        if private in dirs:
            found.append((path, 0, "", "compiled with the private include folder kernels/include:"
                          " no target of src/ may have it"))
    return found, n_src


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--list-public", action="store_true",
                    help="print the public kernels headers (relative to %s) and exit" % KERNELS)
    ap.add_argument("--compile-commands", metavar="FILE",
                    help="a build's compile_commands.json: no src/ file may be compiled with "
                    "the private include folder")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    if args.list_public:
        print("\n".join(sorted(PUBLIC)))
        return 0
    if not all(os.path.isdir(os.path.join(root, d)) for d in ("src", KERNELS, PRIVATE)):
        print("check-layering: %s has no src/, %s or %s" % (root, KERNELS, PRIVATE),
              file=sys.stderr)
        return 2
    _, missing = public_headers(root)
    if missing:
        print("check-layering: the public list names %s, which do(es) not exist under %s"
              % (", ".join(missing), KERNELS), file=sys.stderr)
        return 2
    found = violations(root)
    if args.compile_commands:
        try:
            in_src, n_src = private_in_src(root, args.compile_commands)
        except (OSError, ValueError, KeyError) as e:
            print("check-layering: cannot read %s: %s" % (args.compile_commands, e),
                  file=sys.stderr)
            return 2
        if n_src == 0:
            print("check-layering: %s holds no file of %s/src" % (args.compile_commands, root),
                  file=sys.stderr)
            return 2
        found += in_src
    for path, number, header, message in found:
        if number:
            print("%s:%d: includes trident/kernels/%s: %s" % (path, number, header, message))
        else:
            print("%s: %s" % (path, message))
    print("check-layering: %d include(s) or header(s) break the layering (%d files above "
          "kernels/ and %d public kernels headers read)" % (len(found), len(above_kernels(root)),
                                            len(public_headers(root)[0])))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
