#!/usr/bin/env python3
"""Fails when a C++ source under the given folders is not as clang-format
formats it with the repository's .clang-format.

    scripts/check-format.py [--root DIR] [--exclude FILE] [--list-excluded] [DIR ...]

Runs `clang-format --dry-run --Werror` on every .cpp .hpp .h .cc .cu .cuh
.inc file under the folders (default: src include kernels tests), except the
paths the exclude list names (default: scripts/format-exclude.txt, one path
a line, a folder ending in `/`; `#` starts a comment, and the file says why
each path is there). An excluded path that no longer exists is an error, so
the list cannot rot. `--list-excluded` prints the excluded files that exist
(for `clang-format -i $(scripts/check-format.py --list-excluded)`) and checks
nothing.

The tree is formatted with clang-format 14 (Debian 12's package, which
scripts/install-deps.sh installs): other major versions format some
constructs differently, so the check runs only with 14. It looks for
$TRIDENT_CLANG_FORMAT, then clang-format-14, then clang-format. Exit 0 when
every file is formatted, 1 with one line per file that is not (and
clang-format's first complaint), 2 for bad arguments or a bad exclude list,
77 (ctest's SKIP) with one line saying why when no clang-format 14 is found.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

SUFFIXES = (".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh", ".inc")
WANTED_MAJOR = 14
SKIP = 77


def find_clang_format():
    """(path, None) of a clang-format 14, or (None, why not)."""
    found = []
    for name in (os.environ.get("TRIDENT_CLANG_FORMAT"), "clang-format-14", "clang-format"):
        path = shutil.which(name) if name else None
        if not path:
            continue
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"version (\d+)\.", out)
        if m and int(m.group(1)) == WANTED_MAJOR:
            return path, None
        found.append("%s (%s)" % (path, (out.strip().splitlines() or ["no version"])[0]))
    if found:
        return None, "found only %s; the tree is formatted with clang-format %d" % (
            ", ".join(found), WANTED_MAJOR)
    return None, "no clang-format on PATH (scripts/install-deps.sh installs Debian's clang-format %d)" % (
        WANTED_MAJOR)


def load_exclude(path, root):
    """The excluded paths (relative to root; folders end in '/')."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            text = raw.split("#", 1)[0].strip()
            if not text:
                continue
            if not os.path.exists(os.path.join(root, text)):
                raise ValueError("%s:%d: %s does not exist (remove it from the list)" % (path, number, text))
            out.append(text)
    return out


def excluded(rel, exclude):
    return any(rel == e or (e.endswith("/") and rel.startswith(e)) for e in exclude)


def sources(root, dirs):
    for d in dirs:
        for base, subdirs, files in os.walk(os.path.join(root, d)):
            subdirs.sort()
            for name in sorted(files):
                if name.endswith(SUFFIXES):
                    yield os.path.relpath(os.path.join(base, name), root)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", default=["src", "include", "kernels", "tests"])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--exclude")
    ap.add_argument("--list-excluded", action="store_true")
    args = ap.parse_args()
    exclude_path = args.exclude or os.path.join(args.root, "scripts", "format-exclude.txt")
    try:
        for d in args.dirs:
            if not os.path.isdir(os.path.join(args.root, d)):
                raise ValueError("%s is not a folder under %s" % (d, args.root))
        exclude = load_exclude(exclude_path, args.root)
    except (OSError, ValueError) as e:
        print("check-format: %s" % e, file=sys.stderr)
        return 2
    files = list(sources(args.root, args.dirs))
    if args.list_excluded:
        print("\n".join(f for f in files if excluded(f, exclude)))
        return 0
    clang_format, why = find_clang_format()
    if not clang_format:
        print("check-format: SKIP: %s" % why)
        return SKIP
    todo = [f for f in files if not excluded(f, exclude)]
    bad = []
    for i in range(0, len(todo), 200):  # one clang-format for many files
        p = subprocess.run([clang_format, "--dry-run", "--Werror"] + todo[i:i + 200],
                           cwd=args.root, capture_output=True, text=True)
        first = {}
        for m in re.finditer(r"^(\S+?):(\d+):(\d+): error", p.stderr, re.M):
            first.setdefault(m.group(1), "%s:%s:%s" % m.groups())
        if p.returncode != 0 and not first:
            print("check-format: %s failed: %s" % (clang_format, p.stderr.strip()[:300]))
            return 2
        bad += ["%s: not as clang-format formats it (clang-format -i %s)" % (where, rel)
                for rel, where in first.items()]
    checked = len(todo)
    for line in bad:
        print(line)
    print("check-format: %d of %d files not formatted (%s; %d excluded by %s)" % (
        len(bad), checked, clang_format, len(files) - checked, os.path.relpath(exclude_path, args.root)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
