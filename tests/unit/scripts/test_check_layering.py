#!/usr/bin/env python3
"""scripts/check-layering.py on a made-up tree: a tree that keeps the
layering passes; a model file, a parallel header or a public kernels header
that includes a pointer header fails, named with its line, and so do the
bench engine and the NCCL communicator (no exception is left: they include
the public reference.hpp and cuda_check.hpp); a header the public list does
not name in the public folder, or one it names in the private folder, fails;
with --compile-commands, a src/ file compiled with the private folder on its
include path fails (a kernels/ file may have it); a public header missing
from the tree, or a missing private folder, is an input error (exit 2)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "check-layering.py")
KERNELS = os.path.join("include", "trident", "kernels")
PRIVATE = os.path.join("kernels", "include", "trident", "kernels")

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
    """Every public header, the pointer headers in the private folder, and
    callers that keep the layering (the bench engine and the NCCL
    communicator with their public headers)."""
    rc, out = lint(root, "--list-public")
    assert rc == 0, out
    for name in out.split():
        if name.endswith("/"):
            write(root, os.path.join(KERNELS, name, "shape.hpp"), "#pragma once\n")
        else:
            write(root, os.path.join(KERNELS, name), "#pragma once\n")
    write(root, os.path.join(KERNELS, "functional.hpp"),
          inc("context.hpp") + '#include "trident/kernels/types/shape.hpp"\n')
    write(root, os.path.join(PRIVATE, "ops.hpp"), inc("types/shape.hpp"))
    write(root, os.path.join(PRIVATE, "cuda", "check.hpp"), inc("cuda_check.hpp"))
    write(root, "src/model/layer.cpp", inc("functional.hpp") + "int f() { return 0; }\n")
    write(root, "include/trident/parallel/ring.hpp", inc("types/shape.hpp"))
    write(root, "src/bench/engine.cpp", inc("reference.hpp"))
    write(root, "src/comm/nccl/comm.cpp", inc("cuda_check.hpp"))


def run_checks(root):
    clean_tree(root)
    rc, out = lint(root)
    check(rc == 0 and "0 include(s) or header(s) break" in out,
          "a tree that keeps the layering passes (rc=%d) %s" % (rc, out))

    write(root, "src/model/bad.cpp", "// ops\n#include <cstdint>\n" + inc("ops.hpp"))
    rc, out = lint(root)
    check(rc == 1 and "src/model/bad.cpp:4: includes trident/kernels/ops.hpp" in out
          and "1 include(s) or header(s) break" in out,
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

    write(root, "src/comm/nccl/more.cpp", inc("cuda/check.hpp"))
    write(root, "src/bench/engine.cpp", inc("reference.hpp") + inc("attention.hpp"))
    rc, out = lint(root)
    check(rc == 1 and "src/comm/nccl/more.cpp:2: includes trident/kernels/cuda/check.hpp" in out
          and "src/bench/engine.cpp:4: includes trident/kernels/attention.hpp" in out
          and "2 include(s) or header(s) break" in out,
          "no exception is left: the NCCL communicator and the bench engine include "
          "public headers only (rc=%d) %s" % (rc, out))
    os.remove(os.path.join(root, "src/comm/nccl/more.cpp"))
    write(root, "src/bench/engine.cpp", inc("reference.hpp"))

    write(root, os.path.join(KERNELS, "gemm.hpp"), "#pragma once\n")
    rc, out = lint(root)
    check(rc == 1 and "include/trident/kernels/gemm.hpp: a kernels header in the public folder"
          in out and "kernels/include/trident/kernels/" in out,
          "an unlisted header in the public folder fails, saying where it goes (rc=%d) %s"
          % (rc, out))
    os.remove(os.path.join(root, KERNELS, "gemm.hpp"))

    write(root, os.path.join(PRIVATE, "blas.hpp"), "#pragma once\n")
    rc, out = lint(root)
    check(rc == 1 and "kernels/include/trident/kernels/blas.hpp: a public header in the private "
          "folder" in out, "a public header in the private folder fails (rc=%d) %s" % (rc, out))
    os.remove(os.path.join(root, PRIVATE, "blas.hpp"))

    rc, out = lint(root)
    check(rc == 0, "the tree passes again with the violations gone (rc=%d) %s" % (rc, out))

    compile_commands_checks(root)

    os.remove(os.path.join(root, KERNELS, "blas.hpp"))
    rc, out = lint(root)
    check(rc == 2 and "blas.hpp" in out and out.count("\n") == 1,
          "a public header that does not exist: one line, exit 2 (rc=%d) %s" % (rc, out))

    shutil.rmtree(os.path.join(root, "kernels"))
    rc, out = lint(root)
    check(rc == 2 and "kernels/include/trident/kernels/" in out and out.count("\n") == 1,
          "a tree without the private folder: one line, exit 2 (rc=%d) %s" % (rc, out))

    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


def compile_commands_checks(root):
    """--compile-commands: src/ files must not have kernels/include on their path."""
    build = os.path.join(root, "build")
    commands = os.path.join(build, "compile_commands.json")

    def entry(path, *dirs):
        flags = " ".join("-I%s" % d for d in dirs)
        return {"directory": build, "file": os.path.join(root, path),
                "command": "c++ %s -c %s" % (flags, os.path.join(root, path))}

    def write_commands(*entries):
        os.makedirs(build, exist_ok=True)
        with open(commands, "w", encoding="utf-8") as f:
            json.dump(list(entries), f)

    write_commands(entry("src/model/layer.cpp", "../include"),
                   entry("kernels/cpu/gemm.cpp", "../include", "../kernels/include"))
    rc, out = lint(root, "--compile-commands", commands)
    check(rc == 0, "compile commands where only kernels/ has the private folder pass "
          "(rc=%d) %s" % (rc, out))
    write_commands(entry("src/model/layer.cpp", "../include"),
                   entry("src/bench/engine.cpp", "../include", "../kernels/include/"))
    rc, out = lint(root, "--compile-commands", commands)
    check(rc == 1 and "src/bench/engine.cpp: compiled with the private include folder" in out
          and "layer.cpp" not in out,
          "a src/ file compiled with the private folder fails (rc=%d) %s" % (rc, out))
    write_commands(entry("kernels/cpu/gemm.cpp", "../kernels/include"))
    rc, out = lint(root, "--compile-commands", commands)
    check(rc == 2 and "no file of" in out,
          "compile commands without a src/ file: exit 2 (rc=%d) %s" % (rc, out))
    shutil.rmtree(build)


def main():
    root = tempfile.mkdtemp(prefix="trident-layering-")
    try:
        return run_checks(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
