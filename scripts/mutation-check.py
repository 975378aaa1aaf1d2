#!/usr/bin/env python3
"""Plants single-line bugs in a scratch copy of trident, one at a time, and
reports whether the CI tests that cover each place catch it.

    scripts/mutation-check.py [--only ID,ID,...] [--group six|caught|new|i44]
                              [--scratch DIR] [--jobs N] [--list] [--no-baseline]

The scratch copy (default /tmp/trident-mutation) gets the working tree's
files (tracked and untracked-not-ignored, so uncommitted tests count) and its
own CPU-only build directory, configured once and rebuilt incrementally; the
real tree is never touched. For each mutation: apply it (the line must be
found exactly once, else the row says "stale": the code moved and the list
needs an update), rebuild the targets named, run the named tests with ctest,
restore the file (every binary any chosen row needs is rebuilt before each
row, so no test runs with the previous row's bug). A mutation is "caught"
when at least one test fails (or the build fails: a bug the compiler
refuses is caught too, and says so).

Not part of CI: it takes minutes (one incremental build and a few tests per
row). Run it when tests of a component are added, and quote its table
(share/trident/testing.md).
"""
import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (id, group, what, file, old, new, anchor, build targets, ctest regex)
# `anchor`: when `old` occurs more than once, the occurrence after the first
# match of anchor is the one changed.
M = []


def mutation(ident, group, what, path, old, new, targets, tests, anchor=None):
    M.append(dict(id=ident, group=group, what=what, path=path, old=old, new=new, anchor=anchor,
                  targets=targets, tests=tests))


TRAIN_TESTS = "^(train_reference_step|test_model|test_trainer)$"
# The ctests of the executable test_ep_unit (one per feature file).
EP_UNIT = "^(test_ep_kernels|test_router|test_moe_layer|test_moe_kernels)$"
ADAMW_TESTS = "^(test_interface|test_step_reference|train_reference_step)$"
ATTN = ["test_attention_kernels"]
RING = ["test_ring_attention"]

# ---- the six the suite missed (issue 29) ----
mutation("S1", "six", "attention tile skip: k_first > q_last -> >=", "kernels/cpu/attention.cpp",
         "if (k_first > q_last) return TileMask::skip;", "if (k_first >= q_last) return TileMask::skip;",
         ATTN, "^test_attention_kernels$")
mutation("S2", "six", "ring pair skip: kr.pos0 > -> >=", "src/parallel/cp/ring_attention.cpp",
         "if (causal && kr.pos0 > qr.pos0", "if (causal && kr.pos0 >= qr.pos0",
         RING, "^test_ring_attention_np(2|4)$")
mutation("S3", "six", "grad norm without its square root", "src/train/trainer.cpp",
         "const double norm = std::sqrt(dp::grad_sumsq(",
         "const double norm = (dp::grad_sumsq(", ["trident"], TRAIN_TESTS)
mutation("S4", "six", "clip when the norm is below the threshold", "src/train/trainer.cpp",
         "clip > 0 && norm > clip ?", "clip > 0 && norm < clip ?", ["trident"], TRAIN_TESTS)
mutation("S5", "six", "cosine phase from step 0, not the warm-up's end", "src/train/optimizer.cpp",
         "double(step - t.warmup_steps) / span", "double(step) / span",
         ["trident", "test_trainer"], TRAIN_TESTS)
mutation("S6", "six", "weight decay on the attention norm", "src/model/transformer.cpp",
         "norm.decay = false;", "norm.decay = true;", ["trident"], TRAIN_TESTS,
         anchor='Param(p + "norm", {d})')

# ---- the kinds the issue lists as caught before ----
mutation("C1", "caught", "LSE merge weight sign", "kernels/cpu/attention.cpp",
         "const float w = 1.0f / (1.0f + std::exp(a - b));",
         "const float w = 1.0f / (1.0f + std::exp(b - a));", ATTN + RING,
         "^(test_attention_kernels|test_ring_attention_np2)$")
mutation("C2", "caught", "LSE merge: log1p term dropped", "kernels/cpu/attention.cpp",
         "lse[r] = std::max(a, b) + std::log1p(std::exp(-std::fabs(a - b)));",
         "lse[r] = std::max(a, b);", ATTN + RING, "^(test_attention_kernels|test_ring_attention_np2)$")
mutation("C3", "caught", "zig-zag second chunk off by one", "src/parallel/cp/ring_attention.cpp",
         "TokenRun{c, (2 * int64_t(ring) - 1 - j) * c, c}",
         "TokenRun{c, (2 * int64_t(ring) - 2 - j) * c, c}", RING, "^test_ring_attention_np2$")
mutation("C4", "caught", "1F1B warm-up one forward short", "src/parallel/pp/generators.cpp",
         "const int warmup = std::min(pp - 1 - r, m);", "const int warmup = std::min(pp - 2 - r, m);",
         ["test_pp_schedule"], "^test_pp_schedule$", anchor="Schedule one_f_one_b(")
mutation("C5", "caught", "simulator peak counts after the forward", "src/parallel/pp/simulator.cpp",
         "peaks[r] = std::max(peaks[r], ++live);", "peaks[r] = std::max(peaks[r], live++);",
         ["test_pp_schedule"], "^test_pp_schedule$")
mutation("C6", "caught", "simulator bubble = busy share", "src/parallel/pp/simulator.cpp",
         "rr.bubble_fraction = res.makespan > 0 ? 1.0 - rr.busy / res.makespan : 0.0;",
         "rr.bubble_fraction = res.makespan > 0 ? rr.busy / res.makespan : 0.0;",
         ["test_pp_schedule"], "^test_pp_schedule$")
mutation("C7", "caught", "router softmax gradient sign",
         "kernels/include/trident/kernels/router_token.hpp",
         "dl[e] = static_cast<float>(p[e] * (dp[e] - dot));",
         "dl[e] = static_cast<float>(p[e] * (dp[e] + dot));", ["test_ep_unit"], EP_UNIT)
mutation("C8", "caught", "router norm_topk gradient",
         "kernels/include/trident/kernels/router_token.hpp",
         "for (int j = 0; j < k; ++j) dp[c[j]] += (dw[j] - dot) / S;",
         "for (int j = 0; j < k; ++j) dp[c[j]] += dw[j] / S;", ["test_ep_unit"], EP_UNIT)
mutation("C9", "caught", "combine backward drops the routing weight", "kernels/cpu/moe.cpp",
         "dst[c] = wi * dyt[c];", "dst[c] = dyt[c];", ["test_ep_unit"], EP_UNIT)
mutation("C10", "caught", "capacity tie-break: higher token first", "kernels/cpu/router.cpp",
         "if (token[a / k] != token[b / k]) return token[a / k] < token[b / k];",
         "if (token[a / k] != token[b / k]) return token[a / k] > token[b / k];",
         ["test_ep_unit", "test_ep_capacity_cp"],
         EP_UNIT[:-2] + "|test_ep_capacity_cp_np4)$")
mutation("C11", "caught", "expert grad norm counted on every replica", "src/parallel/dp/grad_reduce.cpp",
         "const bool expert_owner = !expert_replica || expert_replica->rank() == 0;",
         "const bool expert_owner = true;", ["trident", "test_train_parity"],
         "^test_train_parity_np4$")
mutation("C12", "caught", "AdamW without first-moment bias correction", "kernels/cpu/adamw.cpp",
         "const double bc1 = 1.0 - std::pow(h.beta1, double(step));", "const double bc1 = 1.0;",
         ["test_kernel_ops", "trident"], ADAMW_TESTS)
mutation("C13", "caught", "AdamW without second-moment bias correction", "kernels/cpu/adamw.cpp",
         "const double bc2 = 1.0 - std::pow(h.beta2, double(step));", "const double bc2 = 1.0;",
         ["test_kernel_ops", "trident"], ADAMW_TESTS)
mutation("C14", "caught", "checkpoint stores the first moment as the second",
         "src/train/checkpointing.cpp",
         "on_host(ctx, t.optimizer().v(p->name), hold)", "on_host(ctx, t.optimizer().m(p->name), hold)",
         ["trident"], "^train_reference_step$", anchor='"adam_v/" + p->name')
mutation("C15", "caught", "resume forgets the optimizer's step count", "src/train/checkpointing.cpp",
         "t.optimizer().set_steps_taken(r.meta().optimizer_steps);",
         "t.optimizer().set_steps_taken(0);", ["trident"], "^train_run_job$")
mutation("C16", "caught", "mesh rule n_experts % ep not enforced", "src/topo/mesh.cpp",
         "if (n_experts > 0 && n_experts % req.ep != 0)", "if (n_experts > 0 && n_experts % req.ep > 1)",
         ["test_mesh"], "^test_mesh$")
mutation("C17", "caught", "interleaved 1F1B warm-up one short", "src/parallel/pp/generators.cpp",
         "const int warmup = std::min(total, (pp - r - 1) * 2 + (vpp - 1) * first_group);",
         "const int warmup = std::min(total, (pp - r - 1) * 2 + (vpp - 1) * first_group - 1);",
         ["test_pp_schedule"], "^test_pp_schedule$")

# ---- one per new test area (issue 29's tests) ----
mutation("N1", "new", "diagonal tile cut one key early", "kernels/cpu/attention.cpp",
         "return std::min(cols, s.q_pos0 + i0 + rows - 1 - (s.k_pos0 + j0) + 1);",
         "return std::min(cols, s.q_pos0 + i0 + rows - 1 - (s.k_pos0 + j0));", ATTN,
         "^test_attention_kernels$")
mutation("N3", "new", "warm-up starts at 0 instead of lr / warmup", "src/train/optimizer.cpp",
         "return t.lr * double(step + 1) / double(t.warmup_steps);",
         "return t.lr * double(step) / double(t.warmup_steps);", ["trident", "test_trainer"],
         TRAIN_TESTS)
mutation("N4", "new", "clip scale inverted", "src/train/trainer.cpp",
         "float(clip / (norm + 1e-6))", "float(norm / (clip + 1e-6))", ["trident"], TRAIN_TESTS)
mutation("N5", "new", "no weight decay on the LM head", "src/model/transformer.cpp",
         "head_.init_normal(float(m.init_std));",
         "head_.init_normal(float(m.init_std)); head_.decay = false;", ["trident"], TRAIN_TESTS)
mutation("N6", "new", "weight decay on the embedding", "src/model/transformer.cpp",
         "embed_.decay = false;", "embed_.decay = true;", ["trident"], TRAIN_TESTS)
mutation("N7", "new", "RoPE second half rotated the wrong way", "kernels/cpu/rope.cpp",
         "v[i + half] = a * s[i] + b * c[i];", "v[i + half] = -a * s[i] + b * c[i];",
         ["trident"], "^train_reference_step$")
mutation("N8", "new", "z-loss gradient without its factor 2",
         "kernels/include/trident/kernels/router_token.hpp",
         "terms.z_coef * 2.0 * lt * terms.inv_tokens[s];", "terms.z_coef * lt * terms.inv_tokens[s];",
         ["trident"], "^train_reference_step$")
mutation("N9", "new", "aux-loss gradient without its factor E",
         "kernels/include/trident/kernels/router_token.hpp",
         "const double aux = double(daux_scale) * terms.aux_coef * E * terms.inv_tokens[s];",
         "const double aux = double(daux_scale) * terms.aux_coef * terms.inv_tokens[s];",
         ["trident"], "^train_reference_step$")
mutation("N10", "new", "embedding backward overwrites repeated tokens", "kernels/cpu/embedding.cpp",
         "for (int64_t i = 0; i < d; ++i) row[i] += g[i];",
         "for (int64_t i = 0; i < d; ++i) row[i] = g[i];", ["trident"], "^train_reference_step$")
mutation("N11", "new", "RMSNorm epsilon outside the square root", "kernels/cpu/rmsnorm.cpp",
         "float r = static_cast<float>(1.0 / std::sqrt(ss / double(d) + double(eps)));",
         "float r = static_cast<float>(1.0 / (std::sqrt(ss / double(d)) + double(eps)));",
         ["trident"], "^train_reference_step$")


# ---- issue 44: real inputs against real references (one per new branch) ----
HF = "^hf_fixtures$"
MEG = "^test_megatron_fixtures$"
mutation("R1", "i44", "transformers 5's Qwen3-MoE expert count name dropped", "src/io/hf_model.cpp",
         '    {Arch::qwen3_moe, "num_experts", "num_local_experts"},\n', "", ["trident"], HF)
mutation("R2", "i44", "rope_parameters not read as rope_scaling", "src/io/hf_model.cpp",
         '    {std::nullopt, "rope_scaling", "rope_parameters"},\n', "", ["trident"], HF)
mutation("R3", "i44", "rotary_emb.inv_freq buffers not skipped", "src/io/hf_model.cpp",
         'n.ends_with(".rotary_emb.inv_freq")', 'n.ends_with(".rotary_emb.inv_freqs")',
         ["trident"], HF)
mutation("R4", "i44", "fused gate_up_proj: gate and up halves swapped", "src/io/hf_model.cpp",
         "const int64_t off = e * per + (which == 1 ? fe * d : 0);",
         "const int64_t off = e * per + (which == 0 ? fe * d : 0);", ["trident"], HF)
mutation("R5", "i44", "transformers 5 Mixtral router name (mlp.gate) refused",
         "src/io/hf_model.cpp", "expected.insert({n.hf, v5_mixtral_name(n.hf)});",
         "expected.insert(n.hf);", ["trident"], HF)
mutation("R6", "i44", "tied model expects an lm_head tensor", "src/io/hf_model.cpp",
         'if (!m.tie_embeddings) out.push_back({"lm_head"', 'if (true) out.push_back({"lm_head"',
         ["trident"], HF)
mutation("R7", "i44", "fp16 read with exponent bias off by one", "src/io/safetensors.cpp",
         "u = sign | ((exp + 112) << 23) | (man << 13);",
         "u = sign | ((exp + 111) << 23) | (man << 13);", ["trident"], HF)
mutation("R8", "i44", "fp16 write: ties rounded away from zero, not to even",
         "src/io/safetensors.cpp", "const uint32_t r = a + 0x0FFFu + ((a >> 13) & 1u);",
         "const uint32_t r = a + 0x1000u;", ["trident"], HF)
mutation("R9", "i44", "fp16 write: subnormals truncated, not rounded", "src/io/safetensors.cpp",
         "if (rem > half || (rem == half && (r & 1u))) ++r;", "if (rem > half + half) ++r;",
         ["trident"], HF)
mutation("R10", "i44", "bf16 write: ties rounded away from zero, not to even",
         "src/io/safetensors.cpp", "const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);",
         "const uint32_t rounding = 0x8000u;", ["trident"], HF)
mutation("D1", "i44", "data.split rounds half away from zero (llround)", "src/model/data.cpp",
         "return {int64_t(std::nearbyint(v0 * double(n)))",
         "return {int64_t(std::llround(v0 * double(n)))", ["test_megatron_fixtures"], MEG)
mutation("D2", "i44", "blend order measured at j + 1, not Megatron's max(j, 1)",
         "src/model/data.cpp", "double(std::max(j, 1))", "double(j + 1)",
         ["test_megatron_fixtures"], MEG)
mutation("D3", "i44", "uint16 token ids read as int16", "src/model/token_files.cpp",
         "return is_signed ? int64_t(load<int16_t>(p)) : int64_t(load<uint16_t>(p));",
         "return int64_t(load<int16_t>(p));", ["test_megatron_fixtures"], MEG)
mutation("D4", "i44", "int32 token ids read as uint16", "src/model/token_files.cpp",
         "return is_signed ? int64_t(load<int32_t>(p)) : int64_t(load<uint32_t>(p));",
         "return is_signed ? int64_t(load<uint16_t>(p)) : int64_t(load<uint32_t>(p));",
         ["test_megatron_fixtures"], MEG)
mutation("E1", "i44", "validation loss averaged over the last batch's targets",
         "src/train/trainer.cpp", "res.targets += targets;", "res.targets = targets;",
         ["trident"], HF)
mutation("P1", "i44", "recompute_layers N recomputes N + 1 layers", "src/model/transformer.cpp",
         "int(i) < t.recompute_layers", "int(i) <= t.recompute_layers", ["trident"],
         "^train_recompute_layers$")
mutation("P2", "i44", "selective recompute renorms in fp32 under bf16", "src/model/transformer.cpp",
         "    c.h1 = lp.activation({c.x.dim(0), d});\n    kernels::rmsnorm_forward",
         "    c.h1 = kernels::empty(ctx_, {c.x.dim(0), d});\n    kernels::rmsnorm_forward",
         ["trident"], "^train_recompute_layers$")

def sh(cmd, cwd, log, timeout=None, env=None):
    with open(log, "a") as f:
        f.write("\n$ %s\n" % " ".join(cmd))
        f.flush()
        try:
            return subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=env).returncode
        except subprocess.TimeoutExpired:
            f.write("TIMEOUT\n")
            return 124


def sync_tree(scratch):
    """Copy the working tree's files (tracked and untracked-not-ignored) into
    scratch/src. Only files whose bytes differ are written, and with a new
    mtime (not the source's: after a rebase a source can be older than the
    scratch object built from its previous version), so ninja rebuilds what
    changed and nothing else."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           stdout=subprocess.PIPE, check=True).stdout.decode().split("\0")
    dst_root = os.path.join(scratch, "src")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        dst = os.path.join(dst_root, rel)
        if os.path.exists(dst) and filecmp.cmp(src, dst, shallow=False):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        shutil.copymode(src, dst)
    venv = os.path.join(ROOT, ".venv")
    link = os.path.join(dst_root, ".venv")
    if os.path.isdir(venv) and not os.path.exists(link):
        os.symlink(os.path.realpath(venv), link)
    return dst_root


def failed_tests(ctest_output):
    """Names under ctest's "The following tests FAILED:" ("  3 - name (Failed)")."""
    names, inside = [], False
    for line in ctest_output.splitlines():
        if line.startswith("The following tests FAILED"):
            inside = True
        elif inside and " - " in line:
            names.append(line.split(" - ", 1)[1].rsplit(" (", 1)[0].strip())
    return names


def run_tests(build, regex, out):
    with open(out, "w") as f:
        rc = subprocess.run(["ctest", "--test-dir", build, "-R", regex, "--output-on-failure",
                             "--timeout", "600"], stdout=f, stderr=subprocess.STDOUT).returncode
    with open(out) as f:
        return rc, f.read()


def locate(text, m):
    start = 0
    if m["anchor"]:
        start = text.find(m["anchor"])
        if start < 0:
            return -1
        return text.find(m["old"], start)
    if text.count(m["old"]) != 1:
        return -1
    return text.find(m["old"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated ids (S1,C3,...)")
    ap.add_argument("--group", default="", help="six | caught | new | i44")
    ap.add_argument("--scratch", default="/tmp/trident-mutation")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--list", action="store_true", help="print the mutations and exit")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip running the chosen tests once unmutated first")
    args = ap.parse_args()
    chosen = [m for m in M if (not args.only or m["id"] in args.only.split(","))
              and (not args.group or m["group"] == args.group)]
    if args.list:
        for m in chosen:
            print("%-4s %-7s %-50s %s" % (m["id"], m["group"], m["what"], m["path"]))
        return 0
    os.makedirs(args.scratch, exist_ok=True)
    log = os.path.join(args.scratch, "mutation.log")
    src = sync_tree(args.scratch)
    build = os.path.join(args.scratch, "build")
    env = dict(os.environ)
    if not os.path.exists(os.path.join(build, "build.ninja")):
        rc = sh(["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                 "-DTRIDENT_CUDA=OFF"], src, log, env=env)
        if rc != 0:
            print("configure failed, see %s" % log)
            return 1
    # Everything the chosen rows need, built once unmutated: each row then
    # rebuilds incrementally, and a test that fails unmutated is reported.
    targets = sorted({t for m in chosen for t in m["targets"]} | {"trident"})
    print("building the unmutated scratch copy (%s) ..." % ", ".join(targets), flush=True)
    if sh(["cmake", "--build", build, "-j", str(args.jobs), "--target"] + targets, src, log) != 0:
        print("the unmutated build failed, see %s" % log)
        return 1
    if not args.no_baseline:
        regex = "|".join("(%s)" % m["tests"] for m in chosen)
        rc, text = run_tests(build, regex, os.path.join(args.scratch, "ctest-baseline.log"))
        if rc != 0:
            print("tests fail without any mutation (%s): fix those first"
                  % " ".join(failed_tests(text)))
            return 1
        print("baseline: the chosen tests pass unmutated", flush=True)
    rows = []
    for m in chosen:
        path = os.path.join(src, m["path"])
        t0 = time.time()
        with open(path) as f:
            original = f.read()
        at = locate(original, m)
        if at < 0:
            rows.append((m, "stale", "", 0.0))
            print("%-4s stale (line not found once)" % m["id"], flush=True)
            continue
        mutated = original[:at] + m["new"] + original[at + len(m["old"]):]
        try:
            with open(path, "w") as f:
                f.write(mutated)
            # Every chosen row's targets, not just this row's: the file the
            # previous row restored must be rebuilt into every binary it went
            # into, or a later row would run a test still holding that bug.
            if sh(["cmake", "--build", build, "-j", str(args.jobs), "--target"] + targets, src,
                  log) != 0:
                verdict, failed = "caught", "(build fails)"
            else:
                rc, text = run_tests(build, m["tests"],
                                     os.path.join(args.scratch, "ctest-%s.log" % m["id"]))
                failed = " ".join(failed_tests(text)) or "-"
                ran = "No tests were found" not in text
                verdict = "caught" if rc != 0 and ran else ("survived" if ran else "no tests")
        finally:
            with open(path, "w") as f:
                f.write(original)
        rows.append((m, verdict, failed, time.time() - t0))
        print("%-4s %-8s %s  (%.0f s)" % (m["id"], verdict, failed, time.time() - t0), flush=True)
    # Leave the scratch binaries unmutated (the last row's file is restored
    # but not yet rebuilt).
    sh(["cmake", "--build", build, "-j", str(args.jobs), "--target"] + targets, src, log)
    print()
    print("| id | group | change | file | tests run | verdict | failing tests |")
    print("|---|---|---|---|---|---|---|")
    for m, verdict, failed, _ in rows:
        print("| %s | %s | %s | %s | `%s` | **%s** | %s |" % (m["id"], m["group"], m["what"],
                                                             m["path"], m["tests"], verdict, failed))
    caught = sum(1 for r in rows if r[1] == "caught")
    print("\n%d of %d caught" % (caught, len(rows)))
    return 0 if caught == len(rows) else 3


if __name__ == "__main__":
    sys.exit(main())
