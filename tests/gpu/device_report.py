#!/usr/bin/env python3
"""The report of one device session (tests/gpu/run_device_checks.sh).

    device_report.py WORK SUMMARY_TXT FIGURES_JSON

Reads WORK/steps.tsv (name, result, seconds, log) and the logs under
WORK/logs, and writes a summary table (every step, its test counts, the MLA
decode kernels, and each bench's steps and heaviest graph nodes) and one
JSON of every figure.
"""
import json
import os
import re
import sys

work, summary_path, figures_path = sys.argv[1:4]
logs = os.path.join(work, "logs")


def read(name):
    try:
        with open(os.path.join(logs, name), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def test_counts(text):
    """Passed and failed counts of a gtest or cli_cuda log, or None."""
    passed = re.findall(r"\[  PASSED  \] (\d+) tests?", text)
    failed = re.findall(r"\[  FAILED  \] (\d+) tests?, listed below", text)
    skipped = re.findall(r"\[  SKIPPED \] (\d+) tests?", text)
    if passed or failed:
        return {"passed": int(passed[-1]) if passed else 0,
                "failed": int(failed[-1]) if failed else 0,
                "skipped": int(skipped[-1]) if skipped else 0}
    m = re.findall(r"cli_cuda: (\d+) passed, (\d+) failed", text)
    if m:
        return {"passed": int(m[-1][0]), "failed": int(m[-1][1]), "skipped": 0}
    return None


def bench_json(text):
    """The JSON object of a bench log (stdout and stderr together: the object
    starts on a line of its own), or None."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"^\{", text, re.M):
        try:
            return decoder.raw_decode(text, m.start())[0]
        except ValueError:
            continue
    return None


figures = {"machine": read("machine.txt").strip().splitlines(), "steps": [],
           "mla_decode": [], "bench": {}}
lines = []
with open(os.path.join(work, "steps.tsv")) as f:
    for row in f:
        name, result, seconds, log = row.rstrip("\n").split("\t")
        counts = test_counts(read(log))
        figures["steps"].append({"name": name, "result": result, "seconds": int(seconds),
                                 "log": log, "tests": counts})
        tests = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
                 if counts else "")
        lines.append(f"{name:<28} {result:<22} {seconds:>4} s  {tests}")

for line in read("mla_decode_bench.log").splitlines():
    m = re.match(r"mla_decode\[(\S+)\] b=(\d+) s=(\d+) H=(\d+): ([\d.]+) us, ([\d.]+) GB/s, "
                 r"([\d.]+)% of copy bandwidth \(([\d.]+) GB/s\)", line)
    if m:
        figures["mla_decode"].append({
            "kernel": m[1], "batch": int(m[2]), "context": int(m[3]), "heads": int(m[4]),
            "us": float(m[5]), "gb_s": float(m[6]), "fraction_of_copy_bandwidth": float(m[7]) / 100,
            "copy_gb_s": float(m[8])})
if figures["mla_decode"]:
    lines.append("")
    lines.append("MLA decode, b=128 s=4096 H=16:")
    for k in figures["mla_decode"]:
        lines.append(f"  {k['kernel']:<14} {k['us']:8.1f} us {k['gb_s']:8.1f} GB/s "
                     f"{100 * k['fraction_of_copy_bandwidth']:5.1f}% of {k['copy_gb_s']:.0f} GB/s")

def bench_lines(model, j):
    """The summary lines of one bench JSON (KeyError on a partial one)."""
    lines = [""]
    lines.append(f"mlag bench {model} ({j.get('weight_dtype')} weights, {j.get('kv_cache_dtype')} KV, "
                 f"context {j.get('context_len')}; copy {j['machine']['bandwidth_gb_s']:.0f} GB/s; "
                 f"built in {j.get('build_seconds', 0):.1f} s):")
    peaks = j["machine"].get("matmul_peak_tflops", {})
    if peaks:
        lines.append("  matmul peak (cuBLASLt probe): " +
                     ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in sorted(peaks.items())))
    for d in j["decode"]:
        gap = d.get("launch_gap_us")
        lines.append(f"  b={d['batch']:<4} graph {d['graph_ms']:8.3f} ms  eager {d['eager_ms']:8.3f} ms  "
                     f"{d['graph_tokens_per_s']:10.1f} tok/s  {100 * d['fraction_of_bandwidth']:5.1f}% of bw"
                     + (f"  gap {gap:.1f} us" if gap is not None else ""))
        for n in d.get("nodes", [])[:8]:
            peak = n.get("fraction_of_matmul_peak")
            lines.append(f"      {n['us']:9.1f} us {n['bytes'] / 1e6:9.2f} MB {n['gflop']:8.3f} GFLOP "
                         f"{100 * n['fraction_of_bandwidth']:5.1f}% bw "
                         + (f"{100 * peak:5.1f}% {n['dtype']} peak " if peak is not None else " " * 17)
                         + n["node"])
    return lines


for model in ("small", "v2-lite-8l", "v2-lite-8l_fp8_cublaslt", "v2-lite-8l_fp8_tc",
              "v2-lite-8l_no_pdl"):
    j = bench_json(read(f"bench_{model}.json"))
    if j is None:
        continue
    figures["bench"][model] = j  # whole, even where the summary cannot read it
    try:
        lines += bench_lines(model, j)
    except (KeyError, TypeError, ValueError) as e:
        lines += ["", f"mlag bench {model}: its JSON lacks {e!r}; see figures.json"]

with open(summary_path, "w") as f:
    f.write("\n".join(lines) + "\n")
with open(figures_path, "w") as f:
    json.dump(figures, f, indent=1)
