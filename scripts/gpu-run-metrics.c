/* The GPU training bundle's reader of run files (scripts/gpu-bundle.sh
 * pack-train builds it against the bundle's HDF5), for machines whose Python
 * has no h5py: prints /metrics/steps of a trident run file as text, one
 * header line and one line per step, every value with 17 significant digits
 * so that scripts/gpu-train-check.py compares what the file holds.
 *
 *   gpu-run-metrics RUN.h5                  the steps' loss, gradient norm, tokens/s
 *   gpu-run-metrics RUN.h5 --expert-tokens  /metrics/expert_tokens: one line per step,
 *                                           its tokens per (MoE layer, expert) in order
 *
 * Exit 0; 2 with one line when the file or the dataset cannot be read. */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct Row {
  int64_t step;
  double loss, grad_norm, tokens_per_s;
};

static int fail(const char* file, const char* what) {
  fprintf(stderr, "gpu-run-metrics: %s: %s\n", file, what);
  return 2;
}

/* /metrics/expert_tokens [steps, moe layers, experts] as one line per step
 * (the router's choices, which scripts/gpu-train-check.py compares). */
static int print_expert_tokens(const char* name, hid_t file) {
  const hid_t set = H5Dopen2(file, "/metrics/expert_tokens", H5P_DEFAULT);
  if (set < 0) return fail(name, "no dataset /metrics/expert_tokens");
  const hid_t space = H5Dget_space(set);
  hsize_t dims[3] = {0, 0, 0};
  if (space < 0 || H5Sget_simple_extent_ndims(space) != 3 ||
      H5Sget_simple_extent_dims(space, dims, NULL) != 3)
    return fail(name, "/metrics/expert_tokens is not three-dimensional");
  const hsize_t per_step = dims[1] * dims[2], n = dims[0] * per_step;
  int64_t* counts = calloc(n ? n : 1, sizeof(int64_t));
  if (!counts) return fail(name, "out of memory");
  if (n > 0 && H5Dread(set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, counts) < 0)
    return fail(name, "cannot read /metrics/expert_tokens");
  for (hsize_t s = 0; s < dims[0]; ++s) {
    printf("%llu", (unsigned long long)s);
    for (hsize_t k = 0; k < per_step; ++k) printf(" %lld", (long long)counts[s * per_step + k]);
    printf("\n");
  }
  free(counts);
  H5Sclose(space);
  H5Dclose(set);
  H5Fclose(file);
  return 0;
}

int main(int argc, char** argv) {
  const int experts = argc == 3 && strcmp(argv[2], "--expert-tokens") == 0;
  if (argc != 2 && !experts) {
    fprintf(stderr, "gpu-run-metrics: usage: gpu-run-metrics RUN.h5 [--expert-tokens]\n");
    return 2;
  }
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* one line of our own, not HDF5's stack */
  const hid_t file = H5Fopen(argv[1], H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return fail(argv[1], "cannot open as HDF5");
  if (experts) return print_expert_tokens(argv[1], file);
  const hid_t set = H5Dopen2(file, "/metrics/steps", H5P_DEFAULT);
  if (set < 0) return fail(argv[1], "no dataset /metrics/steps");
  /* The members read by name: HDF5 converts from the file's compound type. */
  const hid_t type = H5Tcreate(H5T_COMPOUND, sizeof(struct Row));
  H5Tinsert(type, "step", HOFFSET(struct Row, step), H5T_NATIVE_INT64);
  H5Tinsert(type, "loss", HOFFSET(struct Row, loss), H5T_NATIVE_DOUBLE);
  H5Tinsert(type, "grad_norm", HOFFSET(struct Row, grad_norm), H5T_NATIVE_DOUBLE);
  H5Tinsert(type, "tokens_per_s", HOFFSET(struct Row, tokens_per_s), H5T_NATIVE_DOUBLE);
  const hid_t space = H5Dget_space(set);
  hsize_t n = 0;
  if (space < 0 || H5Sget_simple_extent_ndims(space) != 1 ||
      H5Sget_simple_extent_dims(space, &n, NULL) != 1)
    return fail(argv[1], "/metrics/steps is not one-dimensional");
  struct Row* rows = calloc(n ? n : 1, sizeof(struct Row));
  if (!rows) return fail(argv[1], "out of memory");
  if (n > 0 && H5Dread(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows) < 0)
    return fail(argv[1], "cannot read step, loss, grad_norm, tokens_per_s of /metrics/steps");
  printf("step loss grad_norm tokens_per_s\n");
  for (hsize_t i = 0; i < n; ++i)
    printf("%lld %.17g %.17g %.17g\n", (long long)rows[i].step, rows[i].loss, rows[i].grad_norm,
           rows[i].tokens_per_s);
  free(rows);
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(set);
  H5Fclose(file);
  return 0;
}
