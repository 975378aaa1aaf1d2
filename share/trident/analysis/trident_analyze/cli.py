"""The trident-analyze command line."""
from __future__ import annotations

import argparse
import json
import sys

from . import attention, bench, compare, flight, plots, predicted, stragglers, summary, trace
from .runfile import AnalysisError, RunFile


def cmd_summary(a) -> int:
    with RunFile(a.file) as rf:
        s = summary.summarize(rf)
    print(json.dumps(s, indent=2) if a.json else summary.format_text(s))
    return 0


def cmd_plot(a) -> int:
    with RunFile(a.file) as rf:
        made, missing = plots.plot_all(rf, a.out, a.step, a.only)
    for p in made:
        print(f"wrote {p}")
    for name, why in missing:
        print(f"skipped {name}: {why}", file=sys.stderr)
    if a.only and missing:
        return 2  # a figure asked for by name could not be made
    return 0 if made else 2


def cmd_trace(a) -> int:
    with RunFile(a.file) as rf:
        n = trace.write_trace(rf, a.output)
    print(f"wrote {a.output}: {n} events (open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def cmd_compare(a) -> int:
    with RunFile(a.a) as ra, RunFile(a.b) as rb:
        res = compare.compare(ra, rb)
    print(json.dumps(res, indent=2) if a.json else compare.format_text(res))
    if a.tolerance is not None:
        worst = max((m["max_rel"] for k, m in res["metrics"].items() if k in a.metrics), default=0.0)
        ok = worst <= a.tolerance
        print(f"{'PASS' if ok else 'FAIL'}: max relative difference {worst:.3e} {'<=' if ok else '>'} {a.tolerance:g}")
        return 0 if ok else 1
    return 0


def cmd_attention(a) -> int:
    with RunFile(a.file) as rf:
        res = attention.check(rf, a.step, a.layer, causal=not a.non_causal)
    ok = res["rel_l2_diff"] <= a.tolerance
    if a.json:
        res["pass"] = ok
        print(json.dumps(res, indent=2))
    else:
        print(f"step {res['step']} layer {res['layer']}: q {res['shape_q']} k/v {res['shape_kv']} samples {res['samples']}")
        print(f"recomputed vs captured attn_out: max abs diff {res['max_abs_diff']:.3e}, relative L2 {res['rel_l2_diff']:.3e}")
        print(f"{'PASS' if ok else 'FAIL'} (tolerance {a.tolerance:g})")
    return 0 if ok else 1


def cmd_bench(a) -> int:
    b = bench.select(bench.read_bench(a.file), a.table)
    print(json.dumps(bench.to_json_ready(b), indent=2) if a.json else bench.format_text(b))
    return 0


def cmd_predicted(a) -> int:
    with RunFile(a.file) as rf:
        res = predicted.compare(rf, a.prediction, a.skip)
    print(json.dumps(res, indent=2) if a.json else predicted.format_text(res))
    return 0


def cmd_stragglers(a) -> int:
    with RunFile(a.file) as rf:
        res = stragglers.analyse(rf)
    print(json.dumps(res, indent=2) if a.json else stragglers.format_text(res))
    return 0


def cmd_flight(a) -> int:
    res = flight.analyse(a.path)
    print(json.dumps(res, indent=2) if a.json else flight.format_text(res))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trident-analyze", description="Analyse trident HDF5 run files and bench files.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="config, topology, loss, throughput, time split, comm bytes, expert imbalance")
    s.add_argument("file")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_summary)
    s = sub.add_parser("plot", help="PNG figures: loss, pipeline Gantt, CP balance, expert load, comm volume")
    s.add_argument("file")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--step", type=int, default=None, help="step for the pipeline timeline (default: last)")
    s.add_argument("--only", nargs="*", choices=list(plots.FIGURES), help="only these figures")
    s.set_defaults(fn=cmd_plot)
    s = sub.add_parser("trace", help="timeline as Chrome trace JSON (Perfetto)")
    s.add_argument("file")
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(fn=cmd_trace)
    s = sub.add_parser("compare", help="step-by-step difference of two runs")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--json", action="store_true")
    s.add_argument("--tolerance", type=float, default=None, help="exit 1 if the max relative difference exceeds this")
    s.add_argument("--metrics", nargs="*", default=["loss"], help="metrics the tolerance applies to (default: loss)")
    s.set_defaults(fn=cmd_compare)
    s = sub.add_parser("attention", help="recompute attention from captured q, k, v and compare with attn_out")
    s.add_argument("file")
    s.add_argument("--step", type=int, required=True)
    s.add_argument("--layer", type=int, required=True)
    s.add_argument("--tolerance", type=float, default=1e-4, help="relative L2 tolerance (default 1e-4)")
    s.add_argument("--non-causal", action="store_true")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_attention)
    s = sub.add_parser("bench", help="the tables of a bench file (trident bench ... --output FILE.h5)")
    s.add_argument("file")
    s.add_argument("--table", nargs="*", default=[], help="only these tables (e.g. ring ring_steps)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_bench)
    s = sub.add_parser("predicted", help="measured step time, time split and memory next to the planner's prediction")
    s.add_argument("file")
    s.add_argument("--prediction", default=None, help="JSON of trident plan --format json (default: the run file's)")
    s.add_argument("--skip", type=int, default=1, help="warm-up steps left out of the medians (default 1)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_predicted)
    s = sub.add_parser("stragglers", help="per-rank times over the run, the ranks waited on, the straggler named")
    s.add_argument("file")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_stragglers)
    s = sub.add_parser("flight", help="the flight records of a stopped job: where the ranks diverge, who never arrived")
    s.add_argument("path", help="RUN.flight (the folder of rankNNNNN.json) or the run file RUN.h5 beside it")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_flight)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except AnalysisError as e:
        print(f"trident-analyze: error: {e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"trident-analyze: error: {args.__dict__.get('file', '')}: missing field {e} "
              f"(file does not follow share/trident/hdf5-layout.md)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
