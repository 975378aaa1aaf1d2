#!/usr/bin/env python3
"""scripts/check-layering.py on a made-up tree: a tree that keeps the
layering passes; a model file, a parallel header or a public kernels header
that includes a pointer header fails, named with its line; the bench
engine's exception and the NCCL communicator's are honoured and go no further; a
public header missing from the tree is an input error (exit 2)."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "check-layering.py")
KERNELS = os.path.join("include", "trident", "kernels")

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def lint(root, *args):
    p = subprocess.run([sys.executable, SCRIPT, "--root", root] + list(args),
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def inc(header):
    return '#pragma once\n#include "trident/kernels/%s"\n' % header


def clean_tree(root):
    """Every public header, the pointer headers, and callers that keep the
    layering (the benches and the NCCL communicator use their exceptions)."""
    rc, out = lint(root, "--list-public")
    assert rc == 0, out
    for name in out.split():
        if name.endswith("/"):
            write(root, os.path.join(KERNELS, name, "shape.hpp"), "#pragma once\n")
        else:
            write(root, os.path.join(KERNELS, name), "#pragma once\n")
    write(root, os.path.join(KERNELS, "functional.hpp"),
          inc("context.hpp") + '#include "trident/kernels/types/shape.hpp"\n')
    write(root, os.path.join(KERNELS, "ops.hpp"), inc("types/shape.hpp"))
    write(root, os.path.join(KERNELS, "cuda", "check.hpp"), "#pragma once\n")
    write(root, "src/model/layer.cpp", inc("functional.hpp") + "int f() { return 0; }\n")
    write(root, "include/trident/parallel/ring.hpp", inc("types/shape.hpp"))
    write(root, "src/bench/engine.cpp", inc("attention.hpp"))
    write(root, "src/comm/nccl/comm.cpp", inc("cuda/check.hpp"))


def run_checks(root):
    clean_tree(root)
    rc, out = lint(root)
    check(rc == 0 and "0 include(s) break" in out,
          "a tree that keeps the layering passes, exceptions included (rc=%d) %s" % (rc, out))

    write(root, "src/model/bad.cpp", "// ops\n#include <cstdint>\n" + inc("ops.hpp"))
    rc, out = lint(root)
    check(rc == 1 and "src/model/bad.cpp:4: includes trident/kernels/ops.hpp" in out
          and "1 include(s) break" in out,
          "a model file including ops.hpp fails, named with its line (rc=%d) %s" % (rc, out))
    os.remove(os.path.join(root, "src/model/bad.cpp"))

    write(root, "include/trident/parallel/bad.hpp", "#include <trident/kernels/attention.hpp>\n")
    rc, out = lint(root)
    check(rc == 1 and "include/trident/parallel/bad.hpp:1: includes trident/kernels/attention.hpp"
          in out, "a parallel header including attention.hpp (<...>) fails (rc=%d) %s" % (rc, out))
    os.remove(os.path.join(root, "include/trident/parallel/bad.hpp"))

    write(root, os.path.join(KERNELS, "functional.hpp"), inc("context.hpp") + inc("ops.hpp"))
    rc, out = lint(root)
    check(rc == 1 and "include/trident/kernels/functional.hpp:4: includes trident/kernels/ops.hpp"
          in out and "public kernels header" in out,
          "functional.hpp including a pointer header fails (rc=%d) %s" % (rc, out))
    write(root, os.path.join(KERNELS, "functional.hpp"), inc("context.hpp"))

    write(root, "src/model/cuda_user.cpp", inc("cuda/check.hpp"))
    rc, out = lint(root)
    check(rc == 1 and "src/model/cuda_user.cpp:2: includes trident/kernels/cuda/check.hpp" in out,
          "the NCCL communicator's exception holds in src/comm/nccl only (rc=%d) %s" % (rc, out))
    os.remove(os.path.join(root, "src/model/cuda_user.cpp"))

    write(root, "src/bench/ring.cpp", inc("attention.hpp"))
    write(root, "src/bench/engine.cpp", inc("attention.hpp") + inc("gemm.hpp"))
    rc, out = lint(root)
    check(rc == 1 and "src/bench/ring.cpp:2: includes trident/kernels/attention.hpp" in out
          and "src/bench/engine.cpp:4: includes trident/kernels/gemm.hpp" in out
          and "2 include(s) break" in out,
          "the bench exception holds for engine.cpp's attention.hpp only "
          "(rc=%d) %s" % (rc, out))
    os.remove(os.path.join(root, "src/bench/ring.cpp"))
    write(root, "src/bench/engine.cpp", inc("attention.hpp"))

    write(root, "src/comm/nccl/more.cpp", inc("gemm.hpp"))
    rc, out = lint(root)
    check(rc == 1 and "src/comm/nccl/more.cpp:2: includes trident/kernels/gemm.hpp" in out,
          "the NCCL communicator may include cuda/check.hpp only (rc=%d) %s" % (rc, out))
    os.remove(os.path.join(root, "src/comm/nccl/more.cpp"))

    write(root, "src/bench/moe.cpp", inc("moe.hpp"))
    write(root, "src/bench/attention.cpp", inc("gemm.hpp"))
    write(root, "src/bench/engine_more.cpp", inc("attention.hpp"))
    rc, out = lint(root)
    check(rc == 1 and "src/bench/moe.cpp:2: includes trident/kernels/moe.hpp" in out
          and "src/bench/attention.cpp:2: includes trident/kernels/gemm.hpp" in out
          and "src/bench/engine_more.cpp:2" in out and "3 include(s) break" in out,
          "the bench exceptions hold for the files they name only (rc=%d) %s" % (rc, out))
    os.remove(os.path.join(root, "src/bench/moe.cpp"))
    os.remove(os.path.join(root, "src/bench/attention.cpp"))
    os.remove(os.path.join(root, "src/bench/engine_more.cpp"))

    rc, out = lint(root)
    check(rc == 0, "the tree passes again with the violations gone (rc=%d) %s" % (rc, out))

    os.remove(os.path.join(root, KERNELS, "blas.hpp"))
    rc, out = lint(root)
    check(rc == 2 and "blas.hpp" in out and out.count("\n") == 1,
          "a public header that does not exist: one line, exit 2 (rc=%d) %s" % (rc, out))

    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


def main():
    root = tempfile.mkdtemp(prefix="trident-layering-")
    try:
        return run_checks(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
