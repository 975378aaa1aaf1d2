#!/usr/bin/env python3
"""scripts/check-function-length.py on small C++ files whose function
lengths are known: what counts as a function, how long it is, and the exit
codes with and without an allowlist."""
import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "scripts", "check-function-length.py")
spec = importlib.util.spec_from_file_location("check_function_length", SCRIPT)
lint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lint)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def body(n):
    """n lines of statements."""
    return "".join("  x += %d;\n" % i for i in range(n))


# Each function's signature line to closing brace, counted by hand.
SOURCE = (
    "// a comment { with a brace\n"                                       # 1
    "#include <string>\n"                                                  # 2
    "#define BLOCK { \\\n"                                                 # 3
    "  }\n"                                                                # 4
    "namespace a {\n"                                                      # 5
    "const char* s = \"}{\";\n"                                            # 6
    "const int kTable[] = {1, 2,\n"                                        # 7
    "                      3};\n"                                          # 8
    "int free_function(int x) {\n"                                         # 9
    + body(3) +                                                            # 10-12
    "  auto f = [&] { return '}'; };\n"                                    # 13
    "  return x;\n"                                                        # 14
    "}\n"                                                                  # 15
    "struct S : Base {\n"                                                  # 16
    "  int m{0};\n"                                                        # 17
    "  S(int a) : m{a}, n_(a) {\n"                                         # 18
    "    m += 1;\n"                                                        # 19
    "  }\n"                                                                # 20
    " public:\n"                                                           # 21
    "  int get() const { return m; }\n"                                   # 22
    "  auto raw() const -> const char* {\n"                                # 23
    "    return R\"(}})\";\n"                                              # 24
    "  }\n"                                                                # 25
    "};\n"                                                                 # 26
    "enum class K { one, two };\n"                                         # 27
    "template <class T>\n"                                                 # 28
    "T twice(T v) {\n"                                                     # 29
    "  return v + v;\n"                                                    # 30
    "}\n"                                                                  # 31
    "}  // namespace a\n"                                                  # 32
)
EXPECTED = [("free_function", 9, 15), ("S", 18, 20), ("get", 22, 22), ("raw", 23, 25),
            ("twice", 28, 31)]

found = lint.functions(SOURCE)
check(found == EXPECTED, "functions found: %s, expected %s" % (found, EXPECTED))


def run(files, allow=None, limit=80, ccn=15):
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "src"))
        for name, text in files.items():
            with open(os.path.join(root, "src", name), "w") as f:
                f.write(text)
        allow_path = os.path.join(root, "allow.txt")
        with open(allow_path, "w") as f:
            f.write(allow or "")
        p = subprocess.run([sys.executable, SCRIPT, "--root", root, "--allowlist", allow_path,
                            "--max", str(limit), "--ccn", str(ccn), "src"], capture_output=True, text=True)
        return p.returncode, p.stdout


def function(name, lines):
    """A function `lines` long from signature to closing brace."""
    return "void %s() {\n%s}\n" % (name, body(lines - 2))


rc, out = run({"ok.cpp": function("fits", 80)})
check(rc == 0 and out == "", "an 80-line function passes (rc %d, %r)" % (rc, out))
rc, out = run({"long.cpp": function("too_long", 81)})
check(rc == 1 and "src/long.cpp:1: too_long is 81 lines" in out,
      "an 81-line function fails, named with its file and line (rc %d, %r)" % (rc, out))
rc, out = run({"long.cpp": function("table", 90)}, "src/long.cpp:table  a table of keys\n")
check(rc == 0, "an allowlisted function passes (rc %d, %r)" % (rc, out))
rc, out = run({"long.cpp": function("table", 90)}, "src/long.cpp:table\n")
check(rc == 1 and "gives no reason" in out, "an allowlist entry without a reason fails (%r)" % out)
rc, out = run({"short.cpp": function("table", 10)}, "src/short.cpp:table  a table of keys\n")
check(rc == 1 and "matches no function" in out, "a stale allowlist entry fails (%r)" % out)

# Complexity: 1 + if/for/while/case/catch/&&/||/?; strings, comments and
# attributes do not count, and the name after an attribute is the function's.
BRANCHY = ("__attribute__((always_inline)) inline int branchy(int x) {\n"
           "  // if while for && || ? in a comment\n"
           "  const char* s = \"if (a && b) ? c : d\";\n"
           "  if (x > 0 && x < 9) return 1;\n"           # 2
           "  for (int i = 0; i < x; ++i) x += i;\n"     # 1
           "  while (x > 100) x /= 2;\n"                  # 1
           "  switch (x) { case 1: return 2; case 2: return 3; default: break; }\n"  # 2
           "  try { x = x || s[0] ? 1 : 0; } catch (...) { }\n"  # 3
           "  return x;\n"
           "}\n")
found = lint.functions(BRANCHY, with_ccn=True)
check(found == [("branchy", 1, 10, 10)], "CCN of a known function: %s, expected branchy 10" % found)
rc, out = run({"b.cpp": BRANCHY}, ccn=10)
check(rc == 0 and out == "", "CCN 10 passes a ceiling of 10 (rc %d, %r)" % (rc, out))
rc, out = run({"b.cpp": BRANCHY}, ccn=9)
check(rc == 1 and "src/b.cpp:1: branchy has CCN 10 (at most 9)" in out,
      "CCN 10 fails a ceiling of 9, named with its file and line (rc %d, %r)" % (rc, out))
rc, out = run({"b.cpp": BRANCHY}, "src/b.cpp:branchy  a lexer: one case per character class\n", ccn=9)
check(rc == 0, "an allowlisted branchy function passes (rc %d, %r)" % (rc, out))
rc, out = run({"b.cpp": BRANCHY}, ccn=0)
check(rc == 0, "--ccn 0 turns the complexity check off (rc %d, %r)" % (rc, out))

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
