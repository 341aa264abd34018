#!/usr/bin/env python3
"""Write a synthetic memtrade results file (Google Benchmark JSON, extended).

Used only to exercise scripts/report.py in isolation; the file is marked
"synthetic": true in context.memtrade and every number in it is made up.

    python3 tests/report/make_fixture.py OUT.json [--variant N]

Contents: suite/technique "gemm" (x_param n), impls "reference" (role
reference, fp32) and "openblas" (role vendor, fp32 and fp64), n in
64/128/256/512, 9 repetitions with noisy times plus mean/median/stddev/cv
aggregates, one "oom" case (reference n=512), one "skipped" case
(openblas fp64 n=512) and one claim.  Different --variant values change the
commit, the date and (deterministically) the numbers, so several fixtures can
be fed to the report's trend section; variant 1 also carries a NaN error.
"""
import argparse
import json
import random
import statistics
import sys

SIZES = (64, 128, 256, 512)
REPS = 9
CEIL_FLOPS = 1.12e11
CEIL_COPY = 9.1e9


def gemm_entries(impl, role, dtype, n, variant, rng):
    """Iteration + aggregate entries for one benchmark case."""
    case_id = f"n={n},dtype={dtype}"
    name = f"gemm/{case_id}/{impl}"
    elem = 4 if dtype == "fp32" else 8
    base = {
        "name": name, "run_name": name, "family_index": 0,
        "per_family_instance_index": 0, "threads": 1,
        "repetitions": REPS, "time_unit": "us",
        "suite": "gemm", "technique": "gemm", "impl": impl, "role": role,
        "backend": "cpu", "case_id": case_id,
        "case": {"n": n, "dtype": dtype}, "x": n,
    }
    # Missing/skipped cases: one entry, no times, no counters.
    if impl == "reference" and n == 512:
        return [dict(base, run_type="iteration", repetition_index=0, iterations=0,
                     status="oom",
                     status_detail="allocation of 4.0 MiB (workspace) exceeds "
                                   "capacity 8.0 MiB (peak would be 10.0 MiB)")]
    if impl == "openblas" and dtype == "fp64" and n == 512:
        return [dict(base, run_type="iteration", repetition_index=0, iterations=0,
                     status="skipped",
                     status_detail="fp64 n>=512 not in the quick profile")]

    flops = 2.0 * n ** 3
    eff = 0.02 if impl == "reference" else min(0.85, 0.12 * (n / 64) ** 0.9)
    if dtype == "fp64":
        eff *= 0.5
    if impl == "openblas" and variant >= 1:
        eff *= 0.93  # variant 1+: openblas became ~7% slower
    t_s = flops / (CEIL_FLOPS * eff)
    io = 3 * n * n * elem
    workspace = 0 if impl == "reference" else n * n * elem // 2
    if impl == "openblas" and variant >= 1 and n == 256:
        workspace *= 3  # variant 1+: more workspace at n=256
    peak = io + workspace
    if impl == "reference":
        errs = {"max_abs_err": 0.0, "max_rel_err": 0.0, "rel_l2_err": 0.0}
    else:
        eps = 1.2e-7 if dtype == "fp32" else 2.2e-16
        rel = eps * (n ** 0.5) * (1.0 + 0.1 * variant)
        errs = {"max_abs_err": rel * 40.0, "max_rel_err": rel * 25.0, "rel_l2_err": rel}
        if variant == 1 and dtype == "fp64" and n == 128:
            errs = {"max_abs_err": float("nan"), "max_rel_err": float("nan"),
                    "rel_l2_err": float("nan")}
    counters = {
        "status": "ok", "status_detail": "",
        "peak_bytes": peak, "peak_extra_bytes": workspace,
        "peak_bytes_io": io, "peak_bytes_workspace": workspace,
        "nan_count": 1 if errs["rel_l2_err"] != errs["rel_l2_err"] else 0,
        "inf_count": 0, **errs,
    }
    iterations = max(1, int(0.05 / t_s))
    out, times = [], []
    for rep in range(REPS):
        noise = rng.lognormvariate(0.0, 0.04)
        if rng.random() < 0.1:
            noise *= 1.3  # occasional outlier
        real_us = t_s * noise * 1e6
        times.append(real_us)
        tflops = flops / (real_us * 1e-6) / 1e12
        out.append(dict(base, run_type="iteration", repetition_index=rep,
                        iterations=iterations, real_time=real_us,
                        cpu_time=real_us * rng.uniform(0.97, 1.0),
                        tflops=tflops, gbytes_per_s=io / (real_us * 1e-6) / 1e9,
                        frac_of_gemm_ceiling=tflops * 1e12 / CEIL_FLOPS,
                        **counters))
    aggs = {"mean": statistics.mean(times), "median": statistics.median(times),
            "stddev": statistics.stdev(times)}
    aggs["cv"] = aggs["stddev"] / aggs["mean"]
    for agg, val in aggs.items():
        e = dict(base, name=f"{name}_{agg}", run_type="aggregate", aggregate_name=agg,
                 iterations=REPS, real_time=val, cpu_time=val, **counters)
        if agg == "cv":
            e["aggregate_unit"] = "percentage"
        out.append(e)
    return out


def make(variant):
    rng = random.Random(1234 + variant)
    benchmarks = []
    for impl, role, dtype in (("reference", "reference", "fp32"),
                              ("openblas", "vendor", "fp32"),
                              ("openblas", "vendor", "fp64")):
        for n in SIZES:
            benchmarks += gemm_entries(impl, role, dtype, n, variant, rng)
    commit = f"{0xabc1230 + variant * 0x1111:07x}" + "d" * 33
    context = {
        "date": f"2025-01-{10 + variant:02d}T09:30:00+00:00",
        "host_name": "synthetic-host", "executable": "./build/memtrade",
        "num_cpus": 2, "mhz_per_cpu": 2800, "cpu_scaling_enabled": False,
        "caches": [{"type": "Data", "level": 1, "size": 32768, "num_sharing": 1}],
        "load_avg": [0.1, 0.2, 0.3], "library_build_type": "release",
        "memtrade": {
            "synthetic": True,
            "suites": {"gemm": {"technique": "gemm", "x_param": "n",
                                "x_label": "matrix size n (M=N=K)",
                                "description": "Dense GEMM C=A*B; reference "
                                               "triple loop vs OpenBLAS (synthetic data)."}},
            "profile": "quick", "backend": "cpu", "capacity_bytes": 8 * 2 ** 20,
            "git_commit": commit, "git_dirty": variant % 2 == 1,
            "compiler": "GNU 12.2.0", "build_type": "Release", "cxx_flags": "-O3 -march=native",
            "cpu_model": "Synthetic Xeon @ 2.80GHz", "cpu_cores": 2,
            "gpu_name": None, "gpu_driver": None, "cuda_runtime": None,
            "machine_class": "cpu|Synthetic Xeon @ 2.80GHz|2", "repetitions": REPS,
            "ceilings": {"cpu_fp32_gemm_flops": CEIL_FLOPS, "cpu_copy_bytes_per_s": CEIL_COPY},
        },
    }
    if variant == 1:  # the current run's OpenBLAS ran narrower kernels than its CPU allows
        context["memtrade"]["blas_core"] = "Haswell"
        context["memtrade"]["blas_note"] = ("OpenBLAS runs its Haswell kernels on a CPU with AVX-512 because "
                                            "$OPENBLAS_CORETYPE is Haswell (synthetic)")
    claims = [{
        "id": "fp32-gemm-error-growth",
        "statement": "fp32 GEMM relative error grows roughly like sqrt(K)*eps",
        "source": "Higham, Accuracy and Stability of Numerical Algorithms, ch. 3 (synthetic)",
        "measured": "rel_l2_err 9.6e-7 at n=64 .. 2.7e-6 at n=512",
        "expected": "<= n*eps = 6.1e-5 at n=512",
        "verdict": "reproduced",
        "note": "synthetic fixture data",
    }]
    return {"context": context, "benchmarks": benchmarks, "claims": claims}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output JSON path")
    ap.add_argument("--variant", type=int, default=0, help="0, 1, 2, ... (default 0)")
    args = ap.parse_args(argv)
    with open(args.out, "w") as f:
        json.dump(make(args.variant), f, indent=1)  # NaN is written as NaN, like Google Benchmark
    return 0


if __name__ == "__main__":
    sys.exit(main())
