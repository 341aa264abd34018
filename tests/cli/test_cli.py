#!/usr/bin/env python3
"""End-to-end test of the memtrade command-line tool.

    python3 tests/cli/test_cli.py --memtrade PATH/TO/memtrade --workdir DIR

Runs the real binary on the tiny `test` profile of the gemm suite (CPU backend unless stated) and
checks what a user and CI rely on: exit codes (run 0, or 3 on a case error; compare 0 clean,
1 regression, 2 unreadable input; usage errors 2), deterministic peak-memory counters, compare's
verdicts on hand-edited results files, oom and skipped as recorded results rather than failures,
a results file that survives kill -9 mid-run, and the HTML report.

Each check prints "ok: <what>"; the first failure stops the test with the command, its exit code
and its output. The last line is "cli end-to-end: N passed, 0 failed". Python stdlib only.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 180
# The `test` profile's runs; CPU only so that the check needs neither a GPU nor much time.
RUN_TEST = ["run", "--suite", "gemm", "--profile", "test", "--backend", "cpu"]
CUDA_IMPLS = ("tiled", "cublas")


class CheckFailed(Exception):
    pass


class Ctx:
    def __init__(self, memtrade: Path, workdir: Path):
        self.memtrade = memtrade
        self.workdir = workdir
        self.cuda_available: bool | None = None


CTX: Ctx  # set in main()


# ---------------------------------------------------------------------------------------------
# helpers


def tail(text: str, n: int = 4000) -> str:
    text = text or ""
    return text if len(text) <= n else "...[" + str(len(text) - n) + " chars cut]...\n" + text[-n:]


def describe(cp: subprocess.CompletedProcess) -> str:
    cmd = " ".join(str(a) if re.fullmatch(r"[\w./=,:+-]+", str(a)) else repr(str(a)) for a in cp.args)
    return (f"\n  command: {cmd}\n  cwd: {CTX.workdir}\n  exit code: {cp.returncode}\n"
            f"  --- stdout ---\n{tail(cp.stdout)}\n  --- stderr ---\n{tail(cp.stderr)}")


def memtrade(*args: str, timeout: float = CMD_TIMEOUT_S, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [str(CTX.memtrade), *args]
    try:
        return subprocess.run(cmd, cwd=CTX.workdir, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise CheckFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd)}\n--- stdout ---\n{tail(out)}\n"
                          f"--- stderr ---\n{tail(err)}")


def expect(cond: bool, message: str, cp: subprocess.CompletedProcess | None = None) -> None:
    if not cond:
        raise CheckFailed(message + (describe(cp) if cp is not None else ""))


def expect_rc(cp: subprocess.CompletedProcess, rc: int, what: str) -> None:
    expect(cp.returncode == rc, f"{what}: expected exit code {rc}, got {cp.returncode}", cp)


def path(name: str) -> Path:
    return CTX.workdir / name


def fresh(name: str) -> Path:
    """A work file with no stale copy from an earlier run (so an absent write cannot pass)."""
    p = path(name)
    for q in (p, Path(str(p) + ".partial")):
        if q.exists():
            q.unlink()
    return p


def load(name: str) -> dict:
    p = path(name)
    expect(p.is_file(), f"results file {p} was not written")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise CheckFailed(f"results file {p} is not valid JSON: {e}")
    expect(isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list),
           f"results file {p} has no 'benchmarks' list")
    return doc


def save(name: str, doc: dict) -> None:
    fresh(name).write_text(json.dumps(doc, indent=1) + "\n")


def entries_by_case(doc: dict) -> dict[str, list[dict]]:
    """run_name -> every entry of that case (iterations and aggregates), in file order."""
    out: dict[str, list[dict]] = {}
    for e in doc["benchmarks"]:
        out.setdefault(e.get("run_name", e.get("name")), []).append(e)
    return out


def iterations(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e.get("run_type", "iteration") == "iteration"]


def case_status(doc: dict) -> dict[str, dict]:
    """run_name -> its first iteration entry (which carries status, status_detail and counters)."""
    return {name: iterations(es)[0] for name, es in entries_by_case(doc).items() if iterations(es)}


def peak_keys(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k.startswith("peak_")}


def report_lines(cp: subprocess.CompletedProcess, case: str, metric: str) -> list[list[str]]:
    """Rows of compare's table (split on whitespace) for this case and metric."""
    rows = []
    for line in cp.stdout.splitlines():
        tok = line.split()
        if len(tok) >= 2 and tok[0] == case and tok[1] == metric:
            rows.append(tok)
    return rows


def load_compare_json(name: str, cp: subprocess.CompletedProcess) -> dict:
    p = path(name)
    expect(p.is_file(), f"compare --json did not write {p}", cp)
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise CheckFailed(f"compare --json wrote invalid JSON to {p}: {e}" + describe(cp))


def regression_rows(cmp_doc: dict) -> list[tuple[str, str]]:
    return [(r["name"], r["metric"]) for r in cmp_doc.get("rows", []) if r.get("regression")]


def first_ok_case(doc: dict) -> str:
    for name, e in case_status(doc).items():
        if e.get("status") == "ok":
            return name
    raise CheckFailed("no case with status ok in the results")


# ---------------------------------------------------------------------------------------------
# checks


def check_usage() -> str:
    cp = memtrade("--help")
    expect_rc(cp, 0, "memtrade --help")
    expect("usage: memtrade" in cp.stdout and "compare" in cp.stdout, "memtrade --help printed no usage", cp)
    cp = memtrade("run", "--help")
    expect_rc(cp, 0, "memtrade run --help")
    expect("--suite" in cp.stdout and "--capacity" in cp.stdout, "memtrade run --help does not describe run's options", cp)
    cp = memtrade()
    expect_rc(cp, 2, "memtrade without a command")
    cp = memtrade("bogus")
    expect_rc(cp, 2, "memtrade bogus")
    expect("bogus" in cp.stderr, "memtrade bogus: stderr does not name the unknown command", cp)

    out = "usage_err.json"
    bad = [
        ("unknown suite", ["run", "--suite", "nosuchsuite", "--profile", "test", "--backend", "cpu"], "nosuchsuite"),
        ("unknown profile", ["run", "--suite", "gemm", "--profile", "nosuchprofile", "--backend", "cpu"], "nosuchprofile"),
        ("unknown backend", ["run", "--suite", "gemm", "--profile", "test", "--backend", "tpu"], "tpu"),
        ("unknown flag", [*RUN_TEST, "--frobnicate"], "--frobnicate"),
        ("bad --capacity", [*RUN_TEST, "--capacity", "12 parsecs"], "12 parsecs"),
    ]
    for what, args, named in bad:
        fresh(out)
        cp = memtrade(*args, "--out", out)
        expect_rc(cp, 2, f"run with an {what}" if what[0] in "u" else f"run with a {what}")
        expect(named in cp.stderr, f"run with {what}: stderr does not name the bad value '{named}'", cp)
        expect(not path(out).exists(), f"run with {what}: a usage error still wrote a results file", cp)
    return "help exits 0; unknown command, suite, profile, backend, flag and a bad --capacity exit 2 naming the value"


def check_two_runs() -> str:
    docs = {}
    for name in ("A.json", "B.json"):
        fresh(name)
        cp = memtrade(*RUN_TEST, "--repetitions", "9", "--out", name)
        expect_rc(cp, 0, f"run --out {name}")
        docs[name] = load(name)
    a, b = docs["A.json"], docs["B.json"]

    for fname, doc in docs.items():
        expect(len(doc["benchmarks"]) > 0, f"{fname} holds no benchmarks")
        for e in doc["benchmarks"]:
            expect(e.get("status") == "ok",
                   f"{fname}: {e.get('name')} has status {e.get('status')!r} ({e.get('status_detail')!r}), expected ok")
        for case, es in entries_by_case(doc).items():
            its = iterations(es)
            expect(len(its) == 9, f"{fname}: {case} has {len(its)} iteration entries for --repetitions 9")
            aggs = sorted(e.get("aggregate_name", "") for e in es if e.get("run_type") == "aggregate")
            expect(aggs == ["cv", "mean", "median", "stddev"], f"{fname}: {case} has aggregates {aggs}")
            for e in its:
                expect(isinstance(e.get("real_time"), (int, float)) and e["real_time"] > 0
                       and e.get("time_unit") == "ns", f"{fname}: {e['name']} lacks a positive real_time in ns")
                expect(isinstance(e.get("peak_bytes"), (int, float)) and e["peak_bytes"] > 0,
                       f"{fname}: {e['name']} lacks a positive peak_bytes counter")
        mt = doc.get("context", {}).get("memtrade")
        expect(isinstance(mt, dict), f"{fname}: no context.memtrade object")
        expect(isinstance(mt.get("git_commit"), str), f"{fname}: context.memtrade.git_commit missing or not a string")
        mc = mt.get("machine_class")
        expect(isinstance(mc, dict) and isinstance(mc.get("cpu"), str) and mc["cpu"],
               f"{fname}: context.memtrade.machine_class has no cpu class: {mc!r}")

    ca, cb = entries_by_case(a), entries_by_case(b)
    expect(list(ca) == list(cb), f"A and B hold different cases:\n  A: {list(ca)}\n  B: {list(cb)}")
    for case in ca:
        pa = [peak_keys(e) for e in ca[case]]
        pb = [peak_keys(e) for e in cb[case]]
        expect(pa == pb, f"peak_* counters of {case} differ between two identical runs:\n  A: {pa[0]}\n  B: {pb[0]}")
    return (f"two runs: {len(ca)} cases all ok, peak_* counters identical, context has git_commit "
            f"and machine_class")


def check_compare_clean() -> str:
    cj = fresh("cmp_clean.json")
    cp = memtrade("compare", "A.json", "B.json", "--time", "report", "--json", cj.name)
    expect_rc(cp, 0, "compare A B --time report")
    expect("clean" in cp.stdout or re.search(r"\b0 regression", cp.stdout) is not None,
           "compare A B --time report does not say clean / 0 regressions", cp)
    c = load_compare_json(cj.name, cp)
    expect(c.get("regressions") == 0 and c.get("checks", 0) > 0 and c.get("time_mode") == "report",
           f"compare --json: expected 0 regressions in >0 checks, time_mode report; got "
           f"regressions={c.get('regressions')} checks={c.get('checks')} time_mode={c.get('time_mode')}", cp)
    return f"compare A B --time report: clean ({c['checks']} checks)"


def check_memory_regression() -> str:
    b = load("B.json")
    case = first_ok_case(b)
    edited = 0
    for e in b["benchmarks"]:
        if e.get("run_name") == case:
            e["peak_bytes"] = e["peak_bytes"] + 1
            edited += 1
    save("B_mem.json", b)
    cj = fresh("cmp_mem.json")
    cp = memtrade("compare", "A.json", "B_mem.json", "--time", "report", "--json", cj.name)
    expect_rc(cp, 1, f"compare A B_mem (peak_bytes of {case} +1 B)")
    rows = report_lines(cp, case, "peak_bytes")
    expect(any("regression" in r for r in rows),
           f"compare A B_mem: no 'regression' row naming {case} and peak_bytes", cp)
    regs = regression_rows(load_compare_json(cj.name, cp))
    expect(regs == [(case, "peak_bytes")], f"compare A B_mem: expected exactly one regression "
           f"({case}, peak_bytes), got {regs}", cp)
    cp = memtrade("compare", "A.json", "B_mem.json", "--time", "report", "--memory-tolerance", "1")
    expect_rc(cp, 0, "compare A B_mem --memory-tolerance 1")
    return f"peak_bytes +1 B on {case} ({edited} entries) is a regression (exit 1); --memory-tolerance 1 accepts it"


def check_time_regression() -> str:
    a = load("A.json")
    case = first_ok_case(a)
    # Five runs per side (what the time test needs at alpha 0.01), made from A with controlled times (A's
    # own repetitions may spread widely on a loaded machine, which would make every copy `unstable`):
    # 1 ms per call, a run-level factor per run, 0.1% between repetitions, and the case's time doubled.
    for side, slow in (("runs_base", 1.0), ("runs_slow", 2.0)):
        d = path(side)
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        for r in range(5):
            doc = copy.deepcopy(a)
            for e in doc["benchmarks"]:
                if e.get("run_type") == "iteration" and "real_time" in e:
                    f = (1 + 0.01 * r) * (1 + 0.001 * e.get("repetition_index", 0))
                    f *= slow if e.get("run_name") == case else 1.0
                    e["time_unit"] = "ns"
                    e["real_time"] = 1e6 * f
                    e["cpu_time"] = 1e6 * f
            (d / f"run-{r}.json").write_text(json.dumps(doc))
    cj = fresh("cmp_slow.json")
    cp = memtrade("compare", "runs_base", "runs_slow", "--json", cj.name)
    expect_rc(cp, 1, f"compare runs_base runs_slow (5 runs a side, time of {case} doubled)")
    expect(any("regression" in r for r in report_lines(cp, case, "time")),
           f"compare runs_base runs_slow: no 'regression' row naming {case} with metric time", cp)
    regs = regression_rows(load_compare_json(cj.name, cp))
    expect(regs == [(case, "time")], f"compare runs: expected exactly one regression ({case}, time), got {regs}", cp)
    cp = memtrade("compare", "runs_base", "runs_slow", "--time", "report")
    expect_rc(cp, 0, "compare runs_base runs_slow --time report")
    expect(any("slower" in r for r in report_lines(cp, case, "time")),
           f"compare runs --time report: {case} is not reported as slower", cp)
    # One file a side: the repetitions of one process are not independent samples; listed, not gated.
    cp = memtrade("compare", "runs_base/run-0.json", "runs_slow/run-0.json")
    expect_rc(cp, 0, "compare of one run a side (time listed, not gated)")
    expect("not gated" in cp.stdout, "compare of one run a side does not say time is not gated", cp)
    # A comma-separated list is a side too.
    lst = ",".join(f"runs_base/run-{r}.json" for r in range(5))
    cp = memtrade("compare", lst, "runs_slow")
    expect_rc(cp, 1, "compare with a comma-separated list of runs as the baseline")
    return (f"doubled time of {case} over 5 runs a side: a regression (exit 1), only reported with --time "
            f"report; one run a side lists it without gating")


def check_ab() -> str:
    verdicts = []
    # Lockstep (default, 7 paired rounds) and whole runs one after the other (5 a side, unpaired).
    for mode, runs in (("lockstep", 7), ("no-lockstep", 5)):
        out = path("ab-" + mode)
        cj = fresh(f"cmp_ab_{mode}.json")
        cp = memtrade("ab", "--baseline-bin", str(CTX.memtrade), "--candidate-bin", str(CTX.memtrade),
                      "--suite", "calibrate", "--profile", "test", "--set", "n=1000000", "--filter", "/compute$",
                      "--candidate-env", "MEMTRADE_CALIBRATE_SCALE=2", "--runs", str(runs), "--retries", "1",
                      "--out-dir", str(out), "--json", cj.name, *(["--no-lockstep"] if mode == "no-lockstep" else []),
                      timeout=300, env={"OPENBLAS_CORETYPE": "Prescott"})
        c = load_compare_json(cj.name, cp)
        runs_a = sorted(p.name for p in (out / "baseline").glob("run-*.json"))
        runs_b = sorted(p.name for p in (out / "candidate").glob("run-*.json"))
        expect(len(runs_a) >= runs and len(runs_a) == len(runs_b),
               f"ab --runs {runs} ({mode}) left {len(runs_a)} baseline and {len(runs_b)} candidate runs", cp)
        # OpenBLAS's SSE3 kernels on a CPU with AVX2 or wider: each run records the note, and the log carries it
        # once a side (each side's first round), not once a round.
        noted = "blas_note" in json.loads((out / "baseline" / runs_a[0]).read_text())["context"]["memtrade"]
        notes = cp.stderr.count("memtrade: note: OpenBLAS runs")
        expect(notes == (2 if noted else 0),
               f"ab ({mode}): the OpenBLAS note printed {notes} time(s) over {len(runs_a)} rounds a side "
               f"(expected {'once a side' if noted else 'never: the runs record no note'})", cp)
        expect(("in lockstep" in cp.stdout) == (mode == "lockstep"), f"ab ({mode}): rounds not reported as such", cp)
        time_rows = [r for r in c["rows"] if r["metric"] == "time"]
        expect(len(time_rows) == 1 and time_rows[0]["verdict"] in ("regression", "unstable"),
               f"ab ({mode}) with the candidate doing 2x the work: expected the compute case's time to be a "
               f"regression (or unstable on a loaded machine), got {time_rows}", cp)
        expect(("paired rounds" in time_rows[0]["detail"]) == (mode == "lockstep"),
               f"ab ({mode}): the time row is not judged {'paired' if mode == 'lockstep' else 'unpaired'}", cp)
        if time_rows[0]["verdict"] == "regression":
            # Two stages: the screening rounds flagged it, 14 fresh rounds of it alone confirmed it.
            expect("confirmed by 14 fresh round(s)" in time_rows[0]["detail"] and len(runs_a) >= runs + 14,
                   f"ab ({mode}): a time regression without its 14 confirmation rounds ({len(runs_a)} rounds): "
                   f"{time_rows[0]['detail']}", cp)
        expect(cp.returncode == (1 if time_rows[0]["verdict"] == "regression" else 0),
               f"ab exit code {cp.returncode} does not match its verdict", cp)
        other = [r for r in c["rows"] if r["regression"] and r["metric"] != "time"]
        expect(not other, f"ab: regressions other than time for a change of work only: {other}", cp)
        verdicts.append(f"{mode}: {time_rows[0]['verdict']} over {len(runs_a)} rounds")
    cp = memtrade("ab", "--baseline-bin", str(path("no-such-binary")), "--candidate-bin", str(CTX.memtrade),
                  "--suite", "calibrate")
    expect_rc(cp, 2, "ab with a missing baseline binary")
    expect("not an executable" in cp.stderr, "ab with a missing binary does not say so", cp)
    return f"ab of 2x work: {'; '.join(verdicts)}; a missing binary exits 2"


def check_unreadable_input() -> str:
    raw = path("A.json").read_bytes()
    fresh("A_trunc.json").write_bytes(raw[: len(raw) // 2])
    for args in (("A.json", "A_trunc.json"), ("A_trunc.json", "A.json")):
        cp = memtrade("compare", *args)
        expect_rc(cp, 2, f"compare {' '.join(args)} (A_trunc is A cut to half its bytes)")
        expect("A_trunc.json" in cp.stderr, "compare with a truncated file: stderr does not name A_trunc.json", cp)

    a = load("A.json")
    save("no_benchmarks.json", {"context": a.get("context", {}), "results": a["benchmarks"]})
    cp = memtrade("compare", "A.json", "no_benchmarks.json")
    expect_rc(cp, 2, "compare A no_benchmarks (valid JSON without a 'benchmarks' list)")
    expect("no_benchmarks.json" in cp.stderr, "compare with no 'benchmarks' list: stderr does not name the file", cp)

    fresh("does_not_exist.json")
    cp = memtrade("compare", "A.json", "does_not_exist.json")
    expect_rc(cp, 2, "compare A does_not_exist.json")
    expect("does_not_exist.json" in cp.stderr, "compare with a missing file: stderr does not name it", cp)
    return "truncated, benchmark-less and missing results files make compare exit 2 naming the file"


def check_nan_error() -> str:
    a = load("A.json")
    case = first_ok_case(a)
    for e in a["benchmarks"]:
        if e.get("run_name") == case:
            e["rel_l2_err"] = None
    save("A_nan.json", a)
    cj = fresh("cmp_nan.json")
    cp = memtrade("compare", "A.json", "A_nan.json", "--time", "report", "--json", cj.name)
    expect_rc(cp, 1, f"compare A A_nan (rel_l2_err of {case} null)")
    regs = regression_rows(load_compare_json(cj.name, cp))
    expect(regs == [(case, "rel_l2_err")], f"compare A A_nan: expected exactly one regression "
           f"({case}, rel_l2_err), got {regs}", cp)
    return f"rel_l2_err null (NaN) on {case} is a regression (exit 1)"


def check_missing_case() -> str:
    a = load("A.json")
    case = first_ok_case(a)
    a["benchmarks"] = [e for e in a["benchmarks"] if e.get("run_name") != case]
    save("A_missing.json", a)
    cp = memtrade("compare", "A.json", "A_missing.json", "--time", "report")
    expect_rc(cp, 1, f"compare A A_missing ({case} removed)")
    expect(any("missing" in r for r in report_lines(cp, case, "case")),
           f"compare A A_missing: no 'missing' row naming {case}", cp)
    cp = memtrade("compare", "A.json", "A_missing.json", "--time", "report", "--allow-missing")
    expect_rc(cp, 0, "compare A A_missing --allow-missing")
    expect(case in cp.stdout, f"compare --allow-missing: the missing case {case} is not listed", cp)
    return f"a case missing from current ({case}) is a regression (exit 1), allowed with --allow-missing (exit 0)"


def check_oom() -> str:
    a_cases = case_status(load("A.json"))
    peaks = sorted(e["peak_bytes"] for e in a_cases.values())
    expect(peaks[0] < peaks[-1], f"the test profile's cases all have the same peak ({peaks[0]} B): no capacity splits them")
    # A capacity in whole KiB between the smallest and largest peak of A: some cases fit, some not.
    # (20KiB would not do: the largest case of the test profile, n=40 fp32, peaks at ~19 KiB.)
    kib = int((peaks[0] + peaks[-1]) / 2 // 1024)
    if peaks[0] <= kib * 1024 < peaks[-1]:
        cap_arg, cap = f"{kib}KiB", kib * 1024
    else:
        cap = int((peaks[0] + peaks[-1]) // 2)
        cap_arg = str(cap)
    fresh("C.json")
    cp = memtrade(*RUN_TEST, "--repetitions", "3", "--capacity", cap_arg, "--out", "C.json")
    expect_rc(cp, 0, f"run --capacity {cap_arg}")
    c = load("C.json")
    expect(c.get("context", {}).get("memtrade", {}).get("capacity_bytes") == cap,
           f"C.json: context.memtrade.capacity_bytes is "
           f"{c.get('context', {}).get('memtrade', {}).get('capacity_bytes')!r}, expected {cap}")
    c_cases = case_status(c)
    expect(list(c_cases) == list(a_cases), f"C.json does not hold every case of the profile that A holds:\n"
           f"  A: {list(a_cases)}\n  C: {list(c_cases)}")
    n_oom = n_ok = 0
    first_oom = None
    for i, (case, e) in enumerate(c_cases.items()):
        need = a_cases[case]["peak_bytes"]
        st, detail = e.get("status"), e.get("status_detail", "")
        if need > cap:
            expect(st == "oom", f"{case} peaks at {need:.0f} B without a limit, above the capacity {cap} B, "
                   f"but has status {st!r} ({detail!r}), expected oom")
            expect(str(cap) in detail or cap_arg in detail,
                   f"{case}: oom status_detail does not mention the capacity {cap} B: {detail!r}")
            expect(len(entries_by_case(c)[case]) == 1, f"{case}: an oom case should have one entry")
            n_oom += 1
            first_oom = i if first_oom is None else first_oom
        else:
            expect(st == "ok", f"{case} peaks at {need:.0f} B, within the capacity {cap} B, but has status "
                   f"{st!r} ({detail!r}), expected ok")
            expect(peak_keys(e) == peak_keys(a_cases[case]),
                   f"{case}: peak_* counters under a capacity differ from the unlimited run:\n"
                   f"  A: {peak_keys(a_cases[case])}\n  C: {peak_keys(e)}")
            n_ok += 1
    expect(n_oom > 0 and n_ok > 0, f"expected both oom and ok cases, got {n_oom} oom and {n_ok} ok")
    expect(first_oom is not None and first_oom < len(c_cases) - 1,
           "the first oom case is the last case: cannot tell whether the run went on after it")
    return (f"--capacity {cap_arg}: {n_oom} cases oom naming the capacity, {n_ok} ok with unchanged peaks, "
            f"the run went on after the first oom (exit 0)")


def check_error_exit() -> str:
    """A case that errors is recorded as status error, the run goes on, and run exits 3."""
    suite = json.loads((REPO_ROOT / "suites" / "gemm.json").read_text())
    suite["profiles"] = {"test": {"repetitions": 3, "min_time_s": 0.001,
                                  "grid": [{"n": [2097152, 24], "dtype": ["fp32"]}]}}
    suite["claims"] = []
    sdir = CTX.workdir / "suites_err"
    if sdir.exists():
        shutil.rmtree(sdir)
    sdir.mkdir()
    (sdir / "gemm.json").write_text(json.dumps(suite, indent=1))
    fresh("F.json")
    cp = memtrade(*RUN_TEST, "--suites-dir", str(sdir), "--out", "F.json")
    expect_rc(cp, 3, "run with a case the technique rejects (n = 2^21, above its limit)")
    f = case_status(load("F.json"))
    bad = {k: e for k, e in f.items() if "n=2097152" in k}
    good = {k: e for k, e in f.items() if "n=24" in k}
    expect(bad and all(e.get("status") == "error" and e.get("status_detail") for e in bad.values()),
           f"F.json: the n=2097152 cases should have status error with a detail: "
           f"{ {k: (e.get('status'), e.get('status_detail')) for k, e in bad.items()} }", cp)
    expect(good and all(e.get("status") == "ok" for e in good.values()),
           f"F.json: the n=24 cases after the error should still run ok: "
           f"{ {k: (e.get('status'), e.get('status_detail')) for k, e in good.items()} }", cp)
    return f"a case that errors is recorded (status error, {len(bad)} records), later cases still run, exit 3"


def check_schema() -> str:
    """Suite files are checked against the technique's declared axes: a typo or a wrong type exits 2 naming
    the file, the profile and the key; `list TECHNIQUE` prints the axes."""
    suite = json.loads((REPO_ROOT / "suites" / "gemm.json").read_text())
    suite["claims"] = []
    sdir = CTX.workdir / "suites_schema"
    for grid, needle in (([{"n": [24], "dtype": ["fp32"], "dtpye": ["bf16"]}], "unknown key 'dtpye' (did you mean 'dtype'?)"),
                         ([{"n": [24], "m": ["24"], "dtype": ["fp32"]}], "key 'm' must be an integer, got \"24\""),
                         ([{"n": [24], "dtype": ["fp8"]}], "key 'dtype' has value \"fp8\", allowed")):
        if sdir.exists():
            shutil.rmtree(sdir)
        sdir.mkdir()
        suite["profiles"] = {"test": {"grid": [{"n": [24], "dtype": ["fp32"]}]}, "full": {"grid": grid}}
        (sdir / "gemm.json").write_text(json.dumps(suite, indent=1))
        cp = memtrade(*RUN_TEST, "--suites-dir", str(sdir), "--out", "S.json")
        expect_rc(cp, 2, f"run with a bad key in another profile ({needle})")
        expect(str(sdir / "gemm.json") in cp.stderr and "profile 'full'" in cp.stderr and needle in cp.stderr,
               f"the message should name the file, the profile 'full' and say: {needle}", cp)
    cp = memtrade("list", "gemm")
    expect_rc(cp, 0, "memtrade list gemm")
    for word in ("axes", "dtype", "string in {\"fp32\", \"bf16\", \"fp16\"}", "implementations", "openblas",
                 "peak_bytes", "exact"):
        expect(word in cp.stdout, f"memtrade list gemm should print {word!r}", cp)
    cp = memtrade("list", "nonesuch")
    expect_rc(cp, 2, "memtrade list of an unknown technique")
    return "bad keys, types and values exit 2 naming file, profile and key (with a hint); list TECHNIQUE prints axes"


def check_filter_and_set() -> str:
    """--filter is a regex over suite/case/impl; --set overrides a parameter of every case."""
    fresh("R.json")
    cp = memtrade(*RUN_TEST, "--filter", "n=(24|40),dtype=fp32/open", "--out", "R.json")
    expect_rc(cp, 0, "run --filter")
    names = sorted(case_status(load("R.json")))
    expect(names == ["gemm/n=24,dtype=fp32/openblas", "gemm/n=40,dtype=fp32/openblas"],
           f"--filter should run exactly the two openblas fp32 cases, ran {names}", cp)
    fresh("R.json")
    cp = memtrade(*RUN_TEST, "--set", "n=16", "--set", "dtype=fp32", "--out", "R.json")
    expect_rc(cp, 0, "run --set")
    names = sorted(case_status(load("R.json")))
    expect(names == ["gemm/n=16,dtype=fp32/openblas", "gemm/n=16,dtype=fp32/reference"],
           f"--set n=16 dtype=fp32 should leave one case, ran {names}", cp)
    cp = memtrade(*RUN_TEST, "--set", "nn=16", "--out", "R.json")
    expect_rc(cp, 2, "run --set with an unknown key")
    expect("unknown key 'nn' (did you mean 'n'?)" in cp.stderr, "the message should name the key", cp)
    cp = memtrade(*RUN_TEST, "--filter", "(", "--out", "R.json")
    expect_rc(cp, 2, "run --filter with a bad regex")
    return "--filter regex ran 2 records; --set n=16 collapsed the grid to one case; bad key or regex exit 2"


def cuda_available() -> bool:
    if CTX.cuda_available is None:
        cp = memtrade("list")
        expect_rc(cp, 0, "memtrade list")
        line = next((l for l in cp.stdout.splitlines() if l.startswith("cuda:")), None)
        expect(line is not None, "memtrade list printed no 'cuda:' line", cp)
        CTX.cuda_available = "no CUDA device" not in line
    return CTX.cuda_available


def check_no_gpu() -> str | None:
    if cuda_available():
        print("skip: run --backend auto without a GPU (memtrade list reports a CUDA device)")
        return None
    cp = memtrade("list", "gemm")
    expect_rc(cp, 0, "memtrade list gemm")
    if not re.search(r"^\s+\S+\s+\S+\s+cuda\s", cp.stdout, re.M):
        print("skip: run --backend auto without a GPU (built without the CUDA backend: no CUDA implementation)")
        return None
    fresh("D.json")
    cp = memtrade("run", "--suite", "gemm", "--profile", "test", "--backend", "auto", "--out", "D.json")
    expect_rc(cp, 0, "run --backend auto without a CUDA device")
    d = case_status(load("D.json"))
    impls = {e.get("impl") for e in d.values()}
    for impl in CUDA_IMPLS:
        expect(impl in impls, f"D.json has no case of the CUDA implementation {impl}: {sorted(impls)}")
    n_skip = n_ok = 0
    for case, e in d.items():
        if e.get("impl") in CUDA_IMPLS or e.get("backend") == "cuda":
            expect(e.get("status") == "skipped" and str(e.get("status_detail", "")).startswith("no CUDA device"),
                   f"{case}: expected status skipped with a detail starting 'no CUDA device', got "
                   f"{e.get('status')!r} ({e.get('status_detail')!r})")
            n_skip += 1
        else:
            expect(e.get("status") == "ok", f"{case}: CPU case has status {e.get('status')!r} "
                   f"({e.get('status_detail')!r}), expected ok")
            n_ok += 1
    expect(n_ok > 0, "no CPU case ran in D.json")
    return f"--backend auto without a GPU: {n_skip} CUDA cases skipped ('no CUDA device ...'), {n_ok} CPU cases ok (exit 0)"


def check_kill_mid_run() -> str:
    # An earlier results file must survive a rerun that is killed: the run works in E.json.partial.
    out = path("E.json")
    partial = path("E.json.partial")
    previous = {"context": {"memtrade": {"note": "an earlier run"}}, "benchmarks": [], "claims": []}
    out.write_text(json.dumps(previous))
    partial.unlink(missing_ok=True)
    log = path("E.log")
    # More repetitions than the profile's 9 only to keep the run going well past the second case.
    cmd = [str(CTX.memtrade), "run", "--suite", "gemm", "--profile", "quick", "--backend", "cpu",
           "--repetitions", "20", "--out", out.name]
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, cwd=CTX.workdir, stdout=logf, stderr=subprocess.STDOUT)
    seen: list = []
    seen_ok: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if partial.exists():
                text = partial.read_text()
                try:
                    doc = json.loads(text)
                except json.JSONDecodeError as e:
                    raise CheckFailed(f"E.json.partial read while the run was going was not valid JSON ({e}): it "
                                      f"is not replaced atomically ({len(text)} bytes read)")
                seen = doc.get("benchmarks", [])
                seen_ok = sorted({e.get("run_name") for e in seen if e.get("status") == "ok"})
                if len(seen_ok) >= 2:
                    break
            time.sleep(0.01)
        alive = proc.poll() is None
        if alive:
            proc.kill()  # SIGKILL, this process only
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log_text = log.read_text(errors="replace") if log.exists() else ""
    if not alive:
        raise CheckFailed(f"the run ended (exit {proc.returncode}) before it could be killed with 2 ok cases in "
                          f"E.json.partial (seen: {seen_ok})\n--- output ---\n{tail(log_text)}")
    expect(len(seen_ok) >= 2, f"E.json.partial never held 2 ok cases within 120 s (seen: {seen_ok})\n"
           f"--- output ---\n{tail(log_text)}")
    expect(json.loads(out.read_text()) == previous, "E.json (the earlier results) was changed by a run that was killed")
    doc = load("E.json.partial")
    expect(isinstance(doc.get("context", {}).get("memtrade"), dict), "E.json.partial after kill -9 has no context.memtrade")
    kept = doc["benchmarks"]
    expect(kept[: len(seen)] == seen, f"E.json.partial after kill -9 lost entries it held before the kill: had "
           f"{len(seen)}, now {len(kept)}")
    return (f"kill -9 mid-run: the earlier E.json is intact; E.json.partial parses and holds the {len(seen_ok)} ok "
            f"cases ({len(kept)} entries) written before the kill")


def check_nightly_exit_codes() -> str:
    # What a nightly job relies on: a selection that runs nothing, an unusable requested backend and an
    # output that cannot be written are errors (exit 2), and the previous results file is untouched.
    keep = path("K.json")
    keep.write_text('{"benchmarks": [], "note": "keep me"}')
    cp = memtrade(*RUN_TEST, "--filter", "no-such-case-xyz", "--out", "K.json")
    expect_rc(cp, 2, "run whose --filter selects nothing")
    expect("ran nothing" in cp.stderr, "a run that selects nothing does not say so", cp)
    expect(json.loads(keep.read_text()).get("note") == "keep me", "a failed run replaced the earlier K.json")
    cp = memtrade("run", "--suite", ",", "--out", "K.json")
    expect_rc(cp, 2, "run --suite ,")
    d = path("adir")
    d.mkdir(exist_ok=True)
    cp = memtrade(*RUN_TEST, "--out", "adir")
    expect_rc(cp, 2, "run --out naming a folder")
    expect("is a folder" in cp.stderr, "run --out DIR does not say it is a folder", cp)
    cp = memtrade("compare", "A.json", "B.json", "--time", "report", "--json", "/proc/no/such/dir/c.json")
    expect_rc(cp, 2, "compare --json to an unwritable path")
    if not cuda_available():
        cp = memtrade("run", "--suite", "gemm", "--profile", "test", "--backend", "cuda", "--out", "K.json")
        expect_rc(cp, 2, "run --backend cuda without a usable device")
        expect("no usable CUDA device" in cp.stderr, "run --backend cuda without a device does not say why", cp)
    # --list prints what a selection would run, without running or writing anything.
    cp = memtrade(*RUN_TEST, "--filter", "n=24,dtype=fp32", "--list")
    expect_rc(cp, 0, "run --list")
    listed = cp.stdout.split()
    expect(listed == ["gemm/n=24,dtype=fp32/reference", "gemm/n=24,dtype=fp32/openblas"],
           f"run --list printed {listed}", cp)
    # A suite named twice runs once.
    fresh("twice.json")
    cp = memtrade(*RUN_TEST[:2], "gemm,gemm", *RUN_TEST[3:], "--filter", "n=24,dtype=fp32/reference", "--out", "twice.json")
    expect_rc(cp, 0, "run --suite gemm,gemm")
    names = [e["name"] for e in load("twice.json")["benchmarks"] if e.get("run_type") == "iteration"]
    expect(len(names) == len(set(names)) * 3, f"--suite gemm,gemm ran a case twice: {names}")
    return ("exit 2 for a selection that runs nothing (earlier results kept), --suite ',', --out a folder, an "
            "unwritable --json" + ("" if cuda_available() else ", --backend cuda without a device") +
            "; --list prints the selection; --suite gemm,gemm runs once")


def check_report() -> str | None:
    cp = subprocess.run(["python3", "-c", "import matplotlib"], capture_output=True, text=True)
    if cp.returncode != 0:
        print("skip: report (python3 cannot import matplotlib)")
        return None
    html = fresh("r.html")
    cp = memtrade("report", "A.json", "B.json", "--baseline", "A.json", "-o", html.name)
    expect_rc(cp, 0, "report A B --baseline A -o r.html")
    expect(html.is_file() and html.stat().st_size > 0, "report did not write a non-empty r.html", cp)
    text = html.read_text(errors="replace")
    expect("<html" in text.lower() and "</html>" in text.lower(), "r.html is not an HTML document", cp)
    expect(not Path(str(html) + ".compare.json").exists(), "report left its r.html.compare.json behind", cp)
    # No shell between memtrade and the script: a path with a quote and a space passes as it is.
    odd = path("it's a dir")
    odd.mkdir(exist_ok=True)
    cp = memtrade("report", "A.json", "-o", str(odd / "r.html"))
    expect_rc(cp, 0, "report -o a path with a quote and a space")
    expect((odd / "r.html").is_file(), "report to a path with a quote wrote nothing", cp)
    cp = memtrade("--version")
    expect_rc(cp, 0, "memtrade --version")
    expect(cp.stdout.startswith("memtrade "), "memtrade --version prints no version", cp)
    return (f"report A B --baseline A: wrote r.html ({html.stat().st_size // 1024} KiB); a path with a quote works; "
            f"--version")


# A stand-in for the few PyTorch calls scripts/peers.py makes on the gemm and kvcache suites, in plain
# Python: the test checks the peers file's format, how compare and report take it, and the tensor shapes the
# kvcache peer gives SDPA (the query heads folded into the query length per KV head), not PyTorch. A package:
# the kvcache peer imports torch.nn.attention and torch.nn.functional.
FAKE_TORCH = {
    "__init__.py": """
__version__ = "0.0-fake"
float32, bfloat16, float16 = "float32", "bfloat16", "float16"
from . import nn
class backends:
    class cpu:
        get_cpu_capability = staticmethod(lambda: "none")
class cuda:
    is_available = staticmethod(lambda: False)
def set_num_threads(n):
    pass
class no_grad:
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
class Generator:
    def __init__(self, device="cpu"):
        self.x = 1
    def manual_seed(self, seed):
        self.x = seed
        return self
class Tensor:
    def __init__(self, shape, rows=None, dtype=float32):
        self.shape, self.rows, self.dtype = tuple(shape), rows, dtype
    def to(self, device=None, dtype=None):
        return Tensor(self.shape, self.rows, dtype or self.dtype)
    def element_size(self):
        return 4 if self.dtype == float32 else 2
    def sum(self):
        return 0.0
def randn(*shape, generator):
    generator.x += 1
    if len(shape) != 2:
        return Tensor(shape)
    n, m = shape
    return Tensor(shape, [[((generator.x * 7919 + i * 104729 + j * 1299709) % 1000) / 500.0 - 1.0 for j in range(m)]
                          for i in range(n)])
def ones(n):
    return Tensor((n,))
def mm(a, b):
    cols = list(zip(*b.rows))
    return Tensor((len(a.rows), len(cols)), [[sum(x * y for x, y in zip(r, c)) for c in cols] for r in a.rows])
""",
    "nn/__init__.py": "from . import attention, functional\n",
    "nn/attention.py": """
class SDPBackend:
    def __init__(self, name):
        self.name = name
SDPBackend.FLASH_ATTENTION, SDPBackend.MATH = SDPBackend("FLASH_ATTENTION"), SDPBackend("MATH")
SDPBackend.EFFICIENT_ATTENTION = SDPBackend("EFFICIENT_ATTENTION")
SDPBackend.CUDNN_ATTENTION = SDPBackend("CUDNN_ATTENTION")
active = []
class sdpa_kernel:
    def __init__(self, backend):
        self.backend = backend
    def __enter__(self):
        active.append(self.backend)
    def __exit__(self, *exc):
        active.pop()
        return False
""",
    "nn/functional.py": """
from .attention import active
def scaled_dot_product_attention(q, k, v):
    # One decode token per query head, a KV head's query heads folded into the query length: q [b, h_kv,
    # group, d] against k and v [b, h_kv, n, d] of one dtype, under a chosen backend.
    if not active:
        raise RuntimeError("no sdpa_kernel backend chosen")
    if len(q.shape) != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise RuntimeError(f"shapes q {q.shape}, k {k.shape}, v {v.shape} are not one attention")
    if not q.dtype == k.dtype == v.dtype:
        raise RuntimeError(f"dtypes {q.dtype}, {k.dtype}, {v.dtype}")
    return q
""",
}


def fake_torch() -> Path:
    root = path("fake_torch")
    for name, text in FAKE_TORCH.items():
        f = root / "torch" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    stale = root / "torch.py"  # the one-file stand-in of earlier versions would shadow the package
    if stale.exists():
        stale.unlink()
    return root


def check_peers() -> str:
    """scripts/peers.py writes a results file with memtrade's case names that compare and report take."""
    fake = fake_torch()
    out = fresh("peers.json")
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "peers.py"), "--memtrade", str(CTX.memtrade), "--suite", "gemm",
           "--profile", "test", "--out", str(out), "--against", str(path("A.json"))]
    cp = subprocess.run(cmd, cwd=CTX.workdir, capture_output=True, text=True, timeout=CMD_TIMEOUT_S,
                        env={**os.environ, "PYTHONPATH": str(fake)})
    expect_rc(cp, 0, " ".join(cmd))
    doc = load("peers.json")
    ours = {e["case_id"] for e in load("A.json")["benchmarks"] if e.get("backend") == "cpu"}
    peers = [e for e in iterations(doc["benchmarks"]) if e["impl"] == "torch-mm"]
    expect({e["case_id"] for e in peers} == ours and all(e["role"] == "peer" and e["status"] == "ok" for e in peers),
           f"peers.json: torch-mm records for {sorted({e['case_id'] for e in peers})}, expected ok peer records for "
           f"{sorted(ours)}", cp)
    expect(cp.stdout.count("/ torch-mm") >= len(ours), "peers.py --against printed no ratio per case", cp)
    cp = memtrade("compare", "peers.json", "peers.json")
    expect_rc(cp, 0, "compare peers.json peers.json")
    html = fresh("rp.html")
    cp = memtrade("report", "A.json", "peers.json", "-o", html.name)
    expect_rc(cp, 0, "report A.json peers.json")
    text = html.read_text(errors="replace")
    expect("torch-mm" in text and "Against peers" in text, "the report shows no peer beside memtrade", cp)
    kv = check_kvcache_peers(fake)
    return (f"peers.py on the gemm test profile (a stand-in torch): {len(ours)} cases; compare and report take the "
            f"file; {kv}")


def check_kvcache_peers(fake: Path) -> str:
    """The kvcache peer: each SDPA backend of the CPU for the 16- and 32-bit KV types, with the shapes one
    decode step's attention has; no peer (and a reason) for the quantized ones."""
    out = fresh("peers_kv.json")
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "peers.py"), "--memtrade", str(CTX.memtrade), "--suite",
           "kvcache", "--profile", "test", "--out", str(out)]
    cp = subprocess.run(cmd, cwd=CTX.workdir, capture_output=True, text=True, timeout=CMD_TIMEOUT_S,
                        env={**os.environ, "PYTHONPATH": str(fake)})
    expect_rc(cp, 0, " ".join(cmd))
    cp_list = memtrade("run", "--suite", "kvcache", "--profile", "test", "--backend", "cpu", "--list")
    expect_rc(cp_list, 0, "run --suite kvcache --profile test --list")
    cases = {line.split("/")[1] for line in cp_list.stdout.split() if line.startswith("kvcache/")}
    wide = {c for c in cases if any(f"kv_dtype={t}," in c for t in ("fp32", "bf16", "fp16"))}
    expect(wide and len(wide) < len(cases), f"the kvcache test profile has no mix of KV types: {sorted(cases)}")
    recs = iterations(load("peers_kv.json")["benchmarks"])
    bad = [f"{e['case_id']}/{e['impl']}: {e['status']} {e.get('status_detail', '')}" for e in recs if e["status"] != "ok"]
    expect(not bad, f"kvcache peer records not ok: {bad[:3]}", cp)
    for impl in ("torch-sdpa-flash", "torch-sdpa-math"):
        got = {e["case_id"] for e in recs if e["impl"] == impl}
        expect(got == wide, f"{impl}: records for {sorted(got)}, expected {sorted(wide)}", cp)
    expect(all(e.get("cold_cache") == 1 and e["gbytes_per_s"] > 0 for e in recs), "kvcache peer records not cold, "
           "or without bytes per second", cp)
    # A read stream: its rate against the timed flushes' read rate, as memtrade records it.
    expect(all(e["flush_read_gbytes_per_s"] > 0 and
               abs(e["frac_of_flush_read"] - e["gbytes_per_s"] / e["flush_read_gbytes_per_s"]) <= 1e-9 * e["frac_of_flush_read"]
               for e in recs), "kvcache peer records without the flush read rate or the fraction of it", cp)
    expect(cp.stdout.count("no peer (PyTorch has no") == len(cases) - len(wide),
           "peers.py did not say why the quantized KV types have no peer", cp)
    return f"kvcache peer: {len(wide)} of {len(cases)} cases, flash and math"


def check_git_commit() -> str:
    """context.memtrade.git_commit identifies the source tree's commit: a hash, or "" when there is none."""
    commit = load("A.json")["context"]["memtrade"]["git_commit"]
    head = None  # the source tree's HEAD now: a hash, "" with no commit yet, None without git
    if shutil.which("git") and (REPO_ROOT / ".git").exists():
        cp = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", "-q", "HEAD"],
                            capture_output=True, text=True)
        head = cp.stdout.strip() if cp.returncode == 0 else ""
    expect(commit == "" or re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit) is not None,
           f"A.json: context.memtrade.git_commit is {commit!r}, neither a commit hash nor empty"
           + (f" ({REPO_ROOT} has no commit yet)" if head == "" else ""))
    if head == "":
        expect(commit == "", f"A.json: context.memtrade.git_commit is {commit!r}, but {REPO_ROOT} has no commit")
    elif head:
        # A commit of this repository (HEAD may have moved on since the run: not compared with HEAD).
        cp = subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", commit + "^{commit}"],
                            capture_output=True, text=True)
        expect(cp.returncode == 0, f"A.json: context.memtrade.git_commit {commit!r} is not a commit of {REPO_ROOT}")
    return f"context.memtrade.git_commit is {commit or '(empty: no commit)'}"


CHECKS = [
    check_usage,
    check_two_runs,
    check_compare_clean,
    check_memory_regression,
    check_time_regression,
    check_ab,
    check_unreadable_input,
    check_nan_error,
    check_missing_case,
    check_oom,
    check_error_exit,
    check_schema,
    check_filter_and_set,
    check_no_gpu,
    check_kill_mid_run,
    check_nightly_exit_codes,
    check_report,
    check_peers,
    check_git_commit,
]


def main() -> int:
    global CTX
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memtrade", required=True, help="the memtrade binary")
    ap.add_argument("--workdir", required=True, help="scratch directory (created; its files are overwritten)")
    args = ap.parse_args()
    exe = Path(args.memtrade).resolve()
    if not (exe.is_file() and exe.stat().st_mode & 0o111):
        print(f"FAIL: memtrade binary {exe} does not exist or is not executable")
        print("cli end-to-end: 0 passed, 1 failed")
        return 1
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    CTX = Ctx(exe, workdir)

    passed = 0
    t0 = time.monotonic()
    for check in CHECKS:
        try:
            what = check()
        except CheckFailed as e:
            print(f"FAIL: {check.__name__}: {e}", flush=True)
            print(f"cli end-to-end: {passed} passed, 1 failed")
            return 1
        if what is not None:
            passed += 1
            print(f"ok: {what}", flush=True)
    print(f"(took {time.monotonic() - t0:.1f} s)")
    print(f"cli end-to-end: {passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
