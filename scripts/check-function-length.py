#!/usr/bin/env python3
"""Fails when a C++ function under the given folders is too long or too branchy.

    scripts/check-function-length.py [--max 80] [--ccn 15] [--allowlist FILE] [DIR ...]

A function's length is counted from the first line of its signature
(template line included) to the line of its closing brace. The scan needs
nothing but Python: comments, string and character literals and preprocessor
lines are blanked (line breaks kept), then braces are matched. A brace that
opens at namespace or class level after a parameter list (or a constructor's
initialiser list, a qualifier such as const/override/noexcept, or a trailing
return type) opens a function body; anything nested inside a body (lambdas,
local classes) counts toward that function. Braces of namespaces, classes,
enums and initialisers (tables, `x{...}` members) are not functions.

A function's cyclomatic complexity (CCN) is counted as lizard and the
usual tools count it: 1, plus one for each `if`, `for`, `while`, `case`,
`catch`, `&&`, `||` and `?` in its body (lambdas inside it count toward it).
`--ccn 0` turns that check off.

The allowlist (default: scripts/function-length-allowlist.txt) names
functions that are declarative tables or lexers, one `path:function  reason`
a line, allowed past both limits; an entry without a reason, or one that no
longer matches a function past a limit, is an error too, so the list cannot
rot. Exit 0 when all is well, 1 with one
line per offender otherwise, 2 for bad arguments.
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".cpp", ".hpp", ".h", ".cc", ".cu", ".cuh")
QUALIFIER_END = re.compile(r"\b(const|override|final|noexcept|mutable|try)\s*$")
TRAILING_RETURN = re.compile(r"\)[^()]*->[^=;{}]*$")
SCOPE_HEAD = re.compile(r"\b(namespace|class|struct|union)\b[^()]*$|^\s*extern\s*$")
ENUM_HEAD = re.compile(r"\benum\b")
ACCESS_END = re.compile(r"\b(public|private|protected)\s*$")
# Attributes before a name (`__attribute__((...))`, CUDA's `__launch_bounds__(...)`).
ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)|__launch_bounds__\s*\([^()]*\)")
NAME = re.compile(r"((?:[A-Za-z_]\w*::)*(?:operator\s*[^\s(]+|~?[A-Za-z_]\w*))\s*(?:<[^()]*>)?\s*\($")


def blank(text):
    """Comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # a preprocessor line, with its backslash continuations
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            delim_end = text.find("(", i + 2)
            close = ")" + text[i + 2:delim_end] + '"'
            j = text.find(close, delim_end)
            j = n if j < 0 else j + len(close)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                out.append(c)  # digit separator (1'000'000)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


DECISION = re.compile(r"\b(?:if|for|while|case|catch)\b|&&|\|\||\?")


def ccn(code):
    """Cyclomatic complexity of a blanked function's text."""
    return 1 + len(DECISION.findall(code))


def functions(text, with_ccn=False):
    """(name, first line, last line) of every function body at namespace or
    class level; with_ccn: (name, first line, last line, CCN)."""
    code = ATTRIBUTE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), blank(text))
    line_of = [0] * (len(code) + 1)
    line = 1
    for i, c in enumerate(code):
        line_of[i] = line
        if c == "\n":
            line += 1
    found = []
    # frames: (kind, head start, open position); kind: scope, function, nested, init
    stack = []
    head_start = 0
    for i, c in enumerate(code):
        in_body = any(k in ("function", "nested") for k, _, _ in stack)
        if c == "{":
            if in_body:
                stack.append(("nested", head_start, i))
                continue
            head = code[head_start:i]
            stripped = head.rstrip()
            if SCOPE_HEAD.search(head) and not ENUM_HEAD.search(head):
                stack.append(("scope", head_start, i))
                head_start = i + 1
            elif "(" in head and (stripped.endswith(")") or stripped.endswith("}")
                                  or QUALIFIER_END.search(stripped)
                                  or TRAILING_RETURN.search(stripped)):
                stack.append(("function", head_start, i))
            else:
                # an initialiser or an enum: its close does not end the head
                stack.append(("init", head_start, i))
        elif c == "}":
            if not stack:
                continue
            kind, start, _ = stack.pop()
            if kind == "function":
                sig = code[start:]
                first = start + (len(sig) - len(sig.lstrip()))
                paren = code.find("(", first)
                m = NAME.search(re.sub(r"\s+", " ", code[first:paren + 1]))
                entry = (m.group(1).replace(" ", "") if m else "?", line_of[first], line_of[i])
                found.append(entry + (ccn(code[paren:i + 1]),) if with_ccn else entry)
                head_start = i + 1
            elif kind == "scope":
                head_start = i + 1
            elif kind == "nested" and not any(k in ("function", "nested") for k, _, _ in stack):
                head_start = i + 1
        elif c == ";" and not in_body:
            if not stack or stack[-1][0] != "init":
                head_start = i + 1
        elif c == ":" and not in_body and ACCESS_END.search(code[head_start:i]):
            head_start = i + 1  # access specifier
    return found


def load_allowlist(path):
    entries, errors = {}, []
    if not path or not os.path.exists(path):
        return entries, errors
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            text = raw.strip()
            if not text or text.startswith("#"):
                continue
            key, _, reason = text.partition(" ")
            if not reason.strip():
                errors.append("%s:%d: allowlist entry %s gives no reason" % (path, number, key))
            entries[key] = number
    return entries, errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", default=["src"])
    parser.add_argument("--max", type=int, default=80, help="longest allowed function, in lines")
    parser.add_argument("--ccn", type=int, default=15, help="highest allowed complexity (0: off)")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--allowlist", default=None)
    args = parser.parse_args()
    allow_path = args.allowlist or os.path.join(args.root, "scripts", "function-length-allowlist.txt")
    allowed, problems = load_allowlist(allow_path)
    used = set()
    for d in args.dirs:
        top = os.path.join(args.root, d)
        if not os.path.isdir(top):
            print("check-function-length: %s is not a folder" % top, file=sys.stderr)
            return 2
        for folder, _, files in sorted(os.walk(top)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, args.root)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for func, first, last, branches in functions(text, with_ccn=True):
                    length = last - first + 1
                    limits = []
                    if length > args.max:
                        limits.append("is %d lines (at most %d)" % (length, args.max))
                    if args.ccn and branches > args.ccn:
                        limits.append("has CCN %d (at most %d)" % (branches, args.ccn))
                    if not limits:
                        continue
                    key = "%s:%s" % (rel, func)
                    if key in allowed:
                        used.add(key)
                        continue
                    problems.append("%s:%d: %s %s; split it along its steps"
                                    % (rel, first, func, " and ".join(limits)))
    scanned = tuple(os.path.normpath(d) + os.sep for d in args.dirs)
    for key, number in allowed.items():
        if key not in used and key.startswith(scanned):
            problems.append("%s:%d: allowlist entry %s matches no function past a limit"
                            " (%d lines, CCN %d)" % (allow_path, number, key, args.max, args.ccn))
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
