#!/usr/bin/env bash
# Where a trident run's BLAS time goes, shape by shape: every cblas_sgemm
# call of the run is timed (thread CPU time) by a small interposer loaded
# with LD_PRELOAD, and the table gives, per shape class and for the shapes
# that took longest, the calls, the seconds and the rate reached. The
# attention's own kernels (gemm_direct where it is native) are not BLAS
# calls and do not appear.
#
#   share/trident/benchmarks/gemm-shapes.sh OUTDIR BINARY ARGS...
#
# e.g. CORE=1 share/trident/benchmarks/gemm-shapes.sh /tmp/shapes build/trident run \
#        share/trident/examples/cpu-moe-bench.toml --set train.steps=4
#
# PRELOAD (environment): a further library to load before the program's own
# BLAS, e.g. another BLAS's libblas/libblis, to time its cblas_sgemm instead;
# it must be preloaded (not only opened), or its cblas layer resolves sgemm_
# to the BLAS the program links. CORE: the core to pin to (default the last);
# one BLAS thread. Needs cc and python3.
set -euo pipefail
out=${1:?usage: gemm-shapes.sh OUTDIR BINARY ARGS...}
bin=${2:?usage: gemm-shapes.sh OUTDIR BINARY ARGS...}
shift 2
core=${CORE:-$(($(nproc) - 1))}
command -v cc >/dev/null || { echo "gemm-shapes.sh: needs a C compiler (cc)" >&2; exit 2; }
[[ -x $bin ]] || { echo "gemm-shapes.sh: $bin is not an executable" >&2; exit 2; }
mkdir -p "$out"
out=$(realpath "$out")

cat >"$out/sgemm-timer.c" <<'EOF'
// Times each cblas_sgemm call by shape; the table is written at exit.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
enum { kMaxShapes = 1 << 16 };
static struct shape { int order, ta, tb, m, n, k; long calls; double seconds; } shapes[kMaxShapes];
static int n_shapes, overflow;
static sgemm_fn next_sgemm;

static double thread_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void write_table(void) {
  const char* path = getenv("TRIDENT_SGEMM_TIMES");
  FILE* f = path ? fopen(path, "w") : NULL;
  if (!f) return;
  fprintf(f, "order ta tb m n k calls seconds\n");
  for (int i = 0; i < n_shapes; ++i)
    fprintf(f, "%d %d %d %d %d %d %ld %.6f\n", shapes[i].order, shapes[i].ta, shapes[i].tb,
            shapes[i].m, shapes[i].n, shapes[i].k, shapes[i].calls, shapes[i].seconds);
  if (overflow) fprintf(f, "# %d calls of shapes beyond the table's %d not counted\n", overflow,
                        kMaxShapes);
  fclose(f);
}

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (!next_sgemm) {
    next_sgemm = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    if (!next_sgemm) {
      fprintf(stderr, "sgemm-timer: no cblas_sgemm after the interposer\n");
      abort();
    }
    atexit(write_table);
  }
  const double t0 = thread_seconds();
  next_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const double t = thread_seconds() - t0;
  int i = 0;
  while (i < n_shapes && !(shapes[i].order == order && shapes[i].ta == ta && shapes[i].tb == tb &&
                           shapes[i].m == m && shapes[i].n == n && shapes[i].k == k))
    ++i;
  if (i == n_shapes) {
    if (n_shapes == kMaxShapes) {
      ++overflow;
      return;
    }
    shapes[n_shapes++] = (struct shape){order, ta, tb, m, n, k, 0, 0.0};
  }
  ++shapes[i].calls;
  shapes[i].seconds += t;
}
EOF
cc -O2 -shared -fPIC "$out/sgemm-timer.c" -o "$out/sgemm-timer.so" -ldl

preload=$out/sgemm-timer.so
[[ -n ${PRELOAD:-} ]] && preload="$preload $PRELOAD"
export OPENBLAS_NUM_THREADS=1
/usr/bin/time -f "process CPU time %U s user + %S s system" -o "$out/time.txt" \
  env TRIDENT_SGEMM_TIMES="$out/sgemm.txt" LD_PRELOAD="$preload" \
  taskset -c "$core" "$bin" "$@" >"$out/run.log" 2>&1 ||
  { echo "gemm-shapes.sh: the run failed; its output: $out/run.log" >&2; exit 1; }

python3 - "$out/sgemm.txt" "$out/time.txt" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    if line.startswith(("order", "#")):
        if line.startswith("#"): print(line.strip())
        continue
    _, ta, tb, m, n, k, calls, sec = line.split()
    m, n, k, calls, sec = int(m), int(n), int(k), int(calls), float(sec)
    op = ("A" if ta == "111" else "Aᵀ") + ("·B" if tb == "111" else "·Bᵀ")
    rows.append((op, m, n, k, calls, sec, 2.0 * m * n * k * calls / 1e9))
total = sum(r[5] for r in rows)
print(open(sys.argv[2]).read().strip())
print(f"cblas_sgemm: {sum(r[4] for r in rows)} calls, {total:.3f} s, "
      f"{sum(r[6] for r in rows) / max(total, 1e-12):.1f} GFLOP/s overall\n")

def klass(m, n, k):
    s = min(m, n, k)
    return "smallest dim <= 16" if s <= 16 else "smallest dim 17-64" if s <= 64 else \
           "smallest dim 65-256" if s <= 256 else "smallest dim > 256"
groups = {}
for op, m, n, k, calls, sec, gf in rows:
    g = groups.setdefault(klass(m, n, k), [0, 0.0, 0.0, 0])
    g[0] += calls; g[1] += sec; g[2] += gf; g[3] += 1
print("| shapes (M x N x K) | shapes | calls | seconds | share | GFLOP/s |\n|---|---|---|---|---|---|")
for name in sorted(groups):
    c, s, gf, ns = groups[name]
    print(f"| {name} | {ns} | {c} | {s:.3f} | {100 * s / total:.1f}% | {gf / s:.1f} |")
print("\n| op | M | N | K | calls | seconds | share | GFLOP/s |\n|---|---|---|---|---|---|---|---|")
for op, m, n, k, calls, sec, gf in sorted(rows, key=lambda r: -r[5])[:20]:
    print(f"| {op} | {m} | {n} | {k} | {calls} | {sec:.3f} | {100 * sec / total:.1f}% | {gf / sec:.1f} |")
PY
