#!/usr/bin/env python3
"""scripts/check-format.py on a made-up tree: a formatted file passes, a
badly formatted one fails naming its line, an excluded one is not read, an
exclude entry that does not exist is an input error (exit 2), and without a
clang-format 14 the check says SKIP (exit 77). Needs clang-format 14 for the
first three (SKIP, exit 77, without it)."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "check-format.py")

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def lint(root, *args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, SCRIPT, "--root", root] + list(args), env=e,
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    root = tempfile.mkdtemp(prefix="trident-format-")
    try:
        return run_checks(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_checks(root):
    with open(os.path.join(ROOT, ".clang-format"), encoding="utf-8") as f:
        write(os.path.join(root, ".clang-format"), f.read())
    write(os.path.join(root, "src", "good.cpp"), "int f(int x) { return x + 1; }\n")
    write(os.path.join(root, "src", "keep", "later.cpp"), "int   g( ) {return 0;}\n")
    write(os.path.join(root, "scripts", "format-exclude.txt"), "# why: later\nsrc/keep/\n")

    rc, out = lint(root, "src", env={"PATH": "/nonexistent", "TRIDENT_CLANG_FORMAT": ""})
    check(rc == 77 and "SKIP" in out and out.count("\n") == 1,
          "no clang-format: one SKIP line, exit 77 (rc=%d) %s" % (rc, out))

    rc, out = lint(root, "src")
    if rc == 77:
        print("SKIP: %s" % out.strip())
        return 77
    check(rc == 0 and "0 of 1 files not formatted" in out and "1 excluded" in out,
          "a formatted file passes, the excluded one is not read (rc=%d) %s" % (rc, out))

    write(os.path.join(root, "src", "bad.cpp"), "int h(int x)\n{\n  return x;}\n")
    rc, out = lint(root, "src")
    check(rc == 1 and "src/bad.cpp:1:" in out and "good.cpp" not in out.split("check-format:")[0],
          "a badly formatted file fails, named with its line (rc=%d) %s" % (rc, out))

    rc, out = lint(root, "src", "--list-excluded")
    check(rc == 0 and out.split() == ["src/keep/later.cpp"],
          "--list-excluded prints the excluded files (rc=%d) %s" % (rc, out))

    write(os.path.join(root, "scripts", "format-exclude.txt"), "src/gone.cpp  # moved\n")
    rc, out = lint(root, "src")
    check(rc == 2 and "src/gone.cpp does not exist" in out,
          "an exclude entry that does not exist: exit 2 (rc=%d) %s" % (rc, out))

    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
