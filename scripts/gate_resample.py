#!/usr/bin/env python3
"""The regression gate on real noise: false alarms and detection rates from runs of identical code.

Given N >= 10 results files of one build (independent runs, e.g. `memtrade run ... --out runs/run-NN.json`
in a loop), each trial splits them at random into two disjoint halves of 5 and compares them with
`memtrade compare` (time gating on), several ways:
  identical   the halves as they are: every time regression is a false alarm;
  slow F      every case of the candidate half F times slower (--factors, default 1.10 and 1.25): every
              time check that is not a regression is a miss;
  +1 byte     peak_bytes of every ok case + 1 in the candidate half: every case must be flagged;
  verdict     error_ok of every judged case 1 -> 0 in the candidate half: every case must be flagged.
Halves of one pool overlap between trials, so the trials are not independent compares; they sample the
machine's real run-to-run noise, which synthetic tests cannot. Random halves pair runs made far apart in
time; `--interleaved` instead splits the runs in file order as `memtrade ab` would have made them (ABBA:
1 -> A, 2 -> B, 3 -> B, 4 -> A, ...), one compare per factor, so that a slow drift of the machine falls on
both sides. Prints the rates; exit 1 when a target
is missed (0 false alarms, >= 95% at 1.25x, >= 80% at 1.10x, 100% of planted memory and verdict changes).

`--paired-rounds DIR` takes instead the lockstep rounds of an `ab` of identical code (DIR/baseline/run-NN.json
and DIR/candidate/run-NN.json, round NN of each side a pair; --runs + --confirm-runs or more rounds) and
judges them as `ab`'s two-stage gate does: each trial draws `--runs` screening rounds and, from the rest,
`--confirm-runs` confirmation rounds; a case is a time regression when the screening rounds flag it at
--screen-alpha and the confirmation rounds, judged alone, at --alpha. It also reports the one-stage gate
(the screening rounds alone at --alpha), per case and per compare (family-wise).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path


def write_half(files, dest: Path, edit=None):
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for i, f in enumerate(files):
        doc = json.loads(Path(f).read_text())
        if edit:
            edit(doc)
        (dest / f"run-{i:02d}.json").write_text(json.dumps(doc))


def scale_times(factor):
    def edit(doc):
        for e in doc["benchmarks"]:
            if e.get("run_type") == "iteration" and e.get("status", "ok") == "ok":
                for k in ("real_time", "cpu_time"):
                    if isinstance(e.get(k), (int, float)):
                        e[k] *= factor
    return edit


def plant(key, fn):
    def edit(doc):
        for e in doc["benchmarks"]:
            if e.get("status", "ok") == "ok" and isinstance(e.get(key), (int, float)):
                e[key] = fn(e[key])
    return edit


COMPARE_ARGS: list[str] = []


def compare(memtrade, base: Path, cur: Path, out: Path, extra=()):
    cp = subprocess.run([memtrade, "compare", str(base), str(cur), "--json", str(out), *COMPARE_ARGS, *extra],
                        capture_output=True, text=True)
    if cp.returncode not in (0, 1):
        sys.exit(f"memtrade compare failed ({cp.returncode}): {cp.stderr}")
    return json.loads(out.read_text())


def rows(doc, metric):
    return [r for r in doc["rows"] if r["metric"] == metric]


def flagged(doc):
    return {r["name"] for r in rows(doc, "time") if r["regression"]}


def paired_main(a, factors) -> int:
    d = Path(a.paired_rounds)
    base_all = sorted((d / "baseline").glob("run-*.json"))
    cand_all = sorted((d / "candidate").glob("run-*.json"))
    if [p.name for p in base_all] != [p.name for p in cand_all]:
        sys.exit(f"{d}: baseline/ and candidate/ must hold the same run-NN.json rounds")
    need = a.screen_runs + a.confirm_runs
    if len(base_all) < need:
        sys.exit(f"{d}: {len(base_all)} rounds, need --runs + --confirm-runs = {need}")
    rng = random.Random(a.seed)
    work = Path(a.workdir)
    alpha = next((c.split("=", 1)[1] for c in COMPARE_ARGS if c.startswith("--alpha=")), "0.01")
    COMPARE_ARGS[:] = [c for c in COMPARE_ARGS if not c.startswith("--alpha=")] + ["--paired"]

    def write(idx, factor):
        write_half([base_all[i] for i in idx], work / "base")
        write_half([cand_all[i] for i in idx], work / "cand", scale_times(factor) if factor != 1 else None)

    def judge(level):
        return compare(a.memtrade, work / "base", work / "cand", work / "cmp.json", ["--alpha", str(level)])

    stats = {f: {"checks": 0, "one": 0, "two": 0, "screened": 0, "one_any": 0, "two_any": 0} for f in [1.0] + factors}
    alarms, one_alarms = {}, {}
    for t in range(a.trials):
        order = list(range(len(base_all)))
        rng.shuffle(order)
        screen, confirm = order[: a.screen_runs], order[a.screen_runs: need]
        for f in stats:
            write(screen, f)
            s = judge(a.screen_alpha)
            checks = [r for r in rows(s, "time") if r["verdict"] != "not_compared"]
            one = flagged(judge(alpha))  # the one-stage gate on the same screening rounds
            suspects = flagged(s)
            two = set()
            if suspects:
                write(confirm, f)
                two = suspects & flagged(judge(alpha))
            st = stats[f]
            st["checks"] += len(checks)
            st["one"] += len(one)
            st["two"] += len(two)
            st["screened"] += len(suspects)
            st["one_any"] += bool(one)
            st["two_any"] += bool(two)
            if f == 1.0:
                for n in two:
                    alarms[n] = alarms.get(n, 0) + 1
                for n in one:
                    one_alarms[n] = one_alarms.get(n, 0) + 1
        z = stats[1.0]
        print(f"trial {t + 1}/{a.trials}: identical code, {z['one']} / {z['two']} false alarm(s) so far "
              f"(one stage / two stages)", flush=True)
    ok = True
    print(f"\n{len(base_all)} paired rounds; {a.trials} trials of {a.screen_runs} screening (p < {a.screen_alpha}) + "
          f"{a.confirm_runs} confirmation rounds (p < {alpha}); trials overlap, so they are not independent")
    for f, st in stats.items():
        n = st["checks"]
        if f == 1.0:
            print(f"identical code: one stage {st['one']} false alarm(s) in {n} time checks "
                  f"({st['one_any']}/{a.trials} compares with any); two stages {st['two']} "
                  f"({st['two_any']}/{a.trials} compares with any; {st['screened']} suspects screened)")
            ok &= st["two"] == 0
        else:
            target = 0.95 if f >= 1.25 else 0.80 if f >= 1.10 else 0.0
            print(f"every case {f:.2f}x slower: one stage {100 * st['one'] / n:.1f}%, two stages "
                  f"{100 * st['two'] / n:.1f}% of {n} time checks (target {100 * target:.0f}%)")
            ok &= st["two"] / n >= target
    for label, found in (("one stage", one_alarms), ("two stages", alarms)):
        for name, k in sorted(found.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {label}: {k}x {name}")
    print("gate-resample:", "pass" if ok else "FAIL")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", help="results files of identical code (10 or more)")
    ap.add_argument("--paired-rounds", metavar="DIR", help="an ab output folder of identical code (two-stage gate)")
    ap.add_argument("--runs", dest="screen_runs", type=int, default=7, help="screening rounds (with --paired-rounds)")
    ap.add_argument("--confirm-runs", type=int, default=14, help="confirmation rounds (with --paired-rounds)")
    ap.add_argument("--screen-alpha", type=float, default=0.05, help="screening level (with --paired-rounds)")
    ap.add_argument("--memtrade", default="build/release/memtrade")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--factors", default="1.10,1.25")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default="build/gate-resample")
    ap.add_argument("--interleaved", action="store_true", help="one ABBA split of the runs in file order")
    ap.add_argument("--compare-arg", action="append", default=[],
                    help="an option passed to memtrade compare (repeatable), e.g. --compare-arg=--min-cpu-share=0")
    a = ap.parse_args()
    COMPARE_ARGS.extend(a.compare_arg)
    if a.paired_rounds:
        return paired_main(a, [float(f) for f in a.factors.split(",")])
    if len(a.runs) < 10:
        sys.exit("need at least 10 runs (two disjoint halves of 5)")
    factors = [float(f) for f in a.factors.split(",")]
    rng = random.Random(a.seed)
    work = Path(a.workdir)
    false_alarms = checks_identical = 0
    alarm_cases = {}
    found = {f: 0 for f in factors}
    total = {f: 0 for f in factors}
    unstable = {f: 0 for f in factors}
    mem_hit = mem_total = ver_hit = ver_total = 0
    trials = 1 if a.interleaved else a.trials
    for t in range(trials):
        if a.interleaved:
            abba = [(i // 2) % 2 == (i % 2) for i in range(len(a.runs))]  # True: baseline (A B B A A B ...)
            base = [f for f, is_a in zip(a.runs, abba) if is_a]
            cand = [f for f, is_a in zip(a.runs, abba) if not is_a]
        else:
            pick = rng.sample(a.runs, 10)
            base, cand = pick[:5], pick[5:]
        write_half(base, work / "base")
        write_half(cand, work / "cand")
        doc = compare(a.memtrade, work / "base", work / "cand", work / "cmp.json")
        time_rows = rows(doc, "time")
        checks_identical += len(time_rows)
        for r in time_rows:
            if r["regression"]:
                false_alarms += 1
                alarm_cases[r["name"]] = alarm_cases.get(r["name"], 0) + 1
        other = [r for r in doc["rows"] if r["regression"] and r["metric"] != "time"]
        if other:
            print(f"trial {t}: identical code, non-time regressions: {[(r['name'], r['metric']) for r in other][:5]}")
            false_alarms += len(other)
        for f in factors:
            write_half(cand, work / "cand", scale_times(f))
            d = compare(a.memtrade, work / "base", work / "cand", work / "cmp.json")
            tr = [r for r in rows(d, "time") if r["verdict"] != "not_compared"]
            total[f] += len(tr)
            found[f] += sum(r["regression"] for r in tr)
            unstable[f] += sum(r["verdict"] == "unstable" for r in tr)
        if t == 0:  # planted memory and verdict changes: deterministic, one trial is enough
            write_half(cand, work / "cand", plant("peak_bytes", lambda v: v + 1))
            d = compare(a.memtrade, work / "base", work / "cand", work / "cmp.json")
            pr = rows(d, "peak_bytes")
            mem_total, mem_hit = len(pr), sum(r["regression"] for r in pr)
            write_half(cand, work / "cand", plant("error_ok", lambda v: 0 if v == 1 else v))
            d = compare(a.memtrade, work / "base", work / "cand", work / "cmp.json")
            vr = [r for r in rows(d, "error_ok") if r["baseline"] == 1]
            ver_total, ver_hit = len(vr), sum(r["regression"] for r in vr)
        print(f"trial {t + 1}/{trials}: {sum(r['regression'] for r in time_rows)} false alarm(s) in "
              f"{len(time_rows)} time checks", flush=True)
    ok = True
    print(f"\nidentical code: {false_alarms} false alarm(s) in {checks_identical} time checks "
          f"({trials} compare(s) of {len(base)} vs {len(cand)} runs; target 0)")
    for name, n in sorted(alarm_cases.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {n}x {name}")
    ok &= false_alarms == 0
    for f in factors:
        rate = found[f] / total[f] if total[f] else 0.0
        target = 0.95 if f >= 1.25 else 0.80 if f >= 1.10 else 0.0
        print(f"every case {f:.2f}x slower: {found[f]}/{total[f]} time checks flagged = {100 * rate:.1f}% "
              f"(target {100 * target:.0f}%; {unstable[f]} unstable)")
        ok &= rate >= target
    print(f"peak_bytes + 1 B: {mem_hit}/{mem_total} flagged; error_ok 1 -> 0: {ver_hit}/{ver_total} flagged")
    ok &= mem_hit == mem_total and ver_hit == ver_total and mem_total > 0
    print("gate-resample:", "pass" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
