#!/usr/bin/env python3
"""Render test for scripts/report.py: static HTML checks plus a headless-Chromium render.

    python3 tests/report/test_report.py --report-script scripts/report.py \
        [--results R1.json ...] [--workdir DIR]

Without --results, two synthetic fixtures are generated with make_fixture.py
(variants 0 and 1).  A compare JSON is written next to them.  Needs chromium
on PATH (Debian: apt-get install chromium) and Pillow.  Exits non-zero with a
message at the first failing check; prints "report render test: N checks
passed" on success.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHROMIUM_NAMES = ("chromium", "chromium-browser")
CHROMIUM_TIMEOUT_S = 120
WINDOW = "--window-size=1400,3000"
TOP_SCREEN_PX = 1000  # a laptop screen at 1400 px width


class CheckFailed(Exception):
    pass


class Checks:
    def __init__(self):
        self.passed = 0

    def ok(self, cond, what, detail=""):
        if not cond:
            raise CheckFailed(what + (f"\n  {detail}" if detail else ""))
        self.passed += 1
        print(f"  ok: {what}")


def run(cmd, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def find_chromium():
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise CheckFailed("chromium not found on PATH; the render test needs it. "
                      "Install it (Debian/Ubuntu: apt-get install chromium) and rerun.")


def chromium_cmd(chromium, workdir, *extra):
    return [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", "--force-device-scale-factor=1", "--no-first-run",
            f"--user-data-dir={os.path.join(workdir, 'chromium-profile')}",
            "--virtual-time-budget=5000", *extra]


def make_fixtures(workdir):
    paths = []
    for variant in (0, 1):
        out = os.path.join(workdir, f"fixture-v{variant}.json")
        r = run([sys.executable, os.path.join(HERE, "make_fixture.py"), out, "--variant", str(variant)])
        if r.returncode != 0:
            raise CheckFailed(f"make_fixture.py failed (rc={r.returncode}):\n{r.stderr}")
        paths.append(out)
    return paths


def benchmark_names(results_path):
    with open(results_path) as f:
        data = json.load(f)
    return list(dict.fromkeys(e.get("run_name") or e["name"] for e in data["benchmarks"]
                              if e.get("run_type", "iteration") == "iteration"))


def write_compare(path, baseline, current, regressions):
    names = benchmark_names(current) or ["gemm/n=64,dtype=fp32/openblas"]
    names = (names * 4)[:4]
    rows = [
        {"name": names[0], "metric": "peak_bytes", "baseline": 786432, "current": 1048576,
         "change": "+33.3%", "verdict": "regression" if regressions else "ok", "detail": "exceeds 0% tolerance"},
        {"name": names[1], "metric": "time", "baseline": 0.00123, "current": 0.00101, "change": "-17.9%",
         "verdict": "improved", "detail": "p=0.0004 (Mann-Whitney U)"},
        {"name": names[2], "metric": "rel_l2_err", "baseline": 1.1e-6, "current": 1.1e-6, "change": "+0.0%",
         "verdict": "ok", "detail": ""},
        {"name": names[3] + "/gone", "metric": "status", "baseline": "ok", "current": "", "change": "",
         "verdict": "missing", "detail": "not in current"},
    ]
    with open(path, "w") as f:
        json.dump({"baseline": baseline, "current": current, "time_mode": "report",
                   "same_machine_class": True, "rows": rows, "regressions": regressions}, f, indent=1)


def render(checks, report, results, out, what, *extra):
    """report.py on one results file (a path, or a document written to results-<out>.json); its HTML."""
    if not isinstance(results, str):
        stem = os.path.basename(out).removeprefix("report-").removesuffix(".html")
        path = os.path.join(os.path.dirname(out), f"results-{stem}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(results, f)
        results = path
    r = run([sys.executable, report, results, *extra, "-o", out])
    checks.ok(r.returncode == 0, what, r.stderr[-800:])
    with open(out, encoding="utf-8") as f:
        return f.read()


def check_static(checks, html, n_results):
    ext = re.findall(r"""(?:src|href)\s*=\s*["']?\s*https?://[^"'\s>]*""", html, re.I)
    ext += re.findall(r"""url\(\s*["']?https?://""", html, re.I)
    checks.ok(not ext, "no http(s):// src/href/url() references", f"found: {ext[:5]}")
    checks.ok(not re.search(r"<script[^>]+src\s*=|<link[^>]+href\s*=", html, re.I),
              "no external <script src> / <link href>")
    headings = ["Regressions against baseline", "Run context", "Technique: ", "Claims"]
    if n_results >= 2:
        headings.append("Trends")
    missing = [h for h in headings if not re.search(r"<h[1-3][^>]*>" + re.escape(h), html)]
    checks.ok(not missing, "section headings present: " + ", ".join(headings), f"missing: {missing}")
    srcs = re.findall(r'<img class="plot"[^>]*\ssrc="([^"]{0,40})', html)
    checks.ok(len(srcs) >= 4 and all(s.startswith("data:image/png;base64,") for s in srcs),
              f"{len(srcs)} plot <img> elements, all PNG data: URIs")
    checks.ok('<tr class="regression">' in html, "regression row highlighted in the compare table")
    checks.ok(re.search(r"<summary>All \d+ cases of ", html), "every technique's case table is there (folded)")
    return len(srcs)


def check_errors(checks, report, workdir, good_results):
    """Bad inputs: exit code 2, message naming the file, no traceback."""
    bad_json = os.path.join(workdir, "not-json.json")
    with open(bad_json, "w") as f:
        f.write("{ this is not json")
    no_bench = os.path.join(workdir, "no-benchmarks.json")
    with open(no_bench, "w") as f:
        json.dump({"context": {}}, f)
    missing = os.path.join(workdir, "does-not-exist.json")
    out = os.path.join(workdir, "bad.html")
    for bad, what in ((missing, "missing file"), (bad_json, "invalid JSON"), (no_bench, "no benchmarks")):
        r = run([sys.executable, report, good_results, bad, "-o", out])
        checks.ok(r.returncode == 2 and bad in r.stderr and "Traceback" not in r.stderr,
                  f"{what}: exit 2, names the file, no traceback",
                  f"rc={r.returncode} stderr={r.stderr.strip()[-600:]}")


def check_render(checks, chromium, workdir, html_path, n_plots):
    url = "file://" + os.path.abspath(html_path)
    # Same window size as the screenshot so the first plot's rectangle matches its layout.
    r = run(chromium_cmd(chromium, workdir, "--dump-dom", WINDOW, url), timeout=CHROMIUM_TIMEOUT_S)
    body = re.search(r"<body[^>]*>", r.stdout)
    checks.ok(r.returncode == 0 and body, "chromium --dump-dom produced a <body>",
              f"rc={r.returncode} stderr tail: {r.stderr.strip()[-800:]}")
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(0)))
    loaded, total = attrs.get("data-plots-loaded"), attrs.get("data-plots-total")
    checks.ok(loaded is not None and loaded == total and int(total) >= 4 and int(total) == n_plots,
              f"all plots decoded in the browser (data-plots-loaded={loaded}, data-plots-total={total})",
              f"body attributes: {attrs}")
    rect = [int(v) for v in attrs.get("data-first-plot-rect", "0,0,0,0").split(",")]
    width = int(attrs.get("data-page-width", "0") or 0)
    checks.ok(0 < width <= 1400, f"nothing overflows the 1400 px window (page width {width} px)",
              "a table or plot is wider than the window: wrap or shorten it")

    # The top screen answers "what changed, which claims hold": both sections start within it.
    reg_top, claims_top = int(attrs.get("data-regressions-top", "-1")), int(attrs.get("data-claims-top", "-1"))
    checks.ok(0 <= reg_top < TOP_SCREEN_PX and 0 <= claims_top < TOP_SCREEN_PX,
              f"regressions (y={reg_top}) and claims (y={claims_top}) start on the top screen (< {TOP_SCREEN_PX} px)",
              "something above them pushes the summary down")

    shot = os.path.join(workdir, "screenshot.png")
    if os.path.exists(shot):
        os.remove(shot)
    r = run(chromium_cmd(chromium, workdir, f"--screenshot={shot}", WINDOW, url),
            timeout=CHROMIUM_TIMEOUT_S)
    checks.ok(r.returncode == 0 and os.path.isfile(shot), f"chromium screenshot written ({shot})",
              f"rc={r.returncode} stderr tail: {r.stderr.strip()[-800:]}")
    try:
        from PIL import Image
    except ImportError:
        raise CheckFailed("Pillow is not installed (pip install Pillow)") from None
    im = Image.open(shot).convert("RGB")
    sx = im.width / 1400.0
    x, y, w, h = (round(v * sx) for v in rect)
    checks.ok(w > 100 and h > 100 and y + h <= im.height,
              f"first plot lies inside the 1400x3000 screenshot (rect {rect})",
              f"screenshot size {im.size}; move the plots up or enlarge the window")
    top = os.path.join(workdir, "top-screen.png")  # kept as the test's artifact: what a reader sees first
    im.crop((0, 0, im.width, min(im.height, round(TOP_SCREEN_PX * sx)))).save(top)
    print(f"report render test: top screen saved to {top}")
    crop = im.crop((x, y, x + w, y + h))
    coloured = c0 = c1 = 0
    px = crop.tobytes()
    for r_, g_, b_ in zip(px[0::3], px[1::3], px[2::3]):
        if max(r_, g_, b_) - min(r_, g_, b_) >= 80:
            coloured += 1
            if abs(r_ - 31) + abs(g_ - 119) + abs(b_ - 180) < 90:
                c0 += 1
            elif abs(r_ - 255) + abs(g_ - 127) + abs(b_ - 14) < 90:
                c1 += 1
    checks.ok(coloured >= 300 and c0 >= 30,
              f"first plot is not blank ({coloured} coloured px, {c0} C0-blue, {c1} C1-orange)",
              "expected matplotlib line colours inside the first plot's rectangle")


def check_single_file(checks, report, workdir, results):
    """One results file + a compare with zero regressions: 'No regressions', no trends."""
    cmp0 = os.path.join(workdir, "compare-clean.json")
    write_compare(cmp0, results, results, regressions=0)
    html = render(checks, report, results, os.path.join(workdir, "report-single.html"),
                  "single-file report with a clean compare runs", "--compare", cmp0)
    checks.ok("No regressions" in html and 'id="trends"' not in html,
              "clean compare says 'No regressions'; single file has no Trends section")


def check_shared_names(checks, report, workdir, results):
    """CPU and CUDA records with one name (a --backend auto run without a GPU: every CUDA case skipped)
    are two records: the CPU plots and rows stay, beside the skipped CUDA rows."""
    with open(results, encoding="utf-8") as f:
        doc = json.load(f)
    plain = render(checks, report, results, os.path.join(workdir, "report-cpu.html"), "report of the CPU records runs")
    cuda = []
    for e in doc["benchmarks"]:
        if e.get("run_type", "iteration") == "iteration" and e.get("repetition_index", 0) == 0:
            cuda.append({k: v for k, v in e.items() if k in ("name", "run_name", "suite", "technique", "impl", "role",
                                                               "case_id", "case", "x")}
                        | {"backend": "cuda", "run_type": "iteration", "repetitions": 0, "status": "skipped",
                           "status_detail": "no CUDA device: test", "error_occurred": True})
    doc["benchmarks"] += cuda
    html = render(checks, report, doc, os.path.join(workdir, "report-shared-names.html"),
                  "report with CUDA records sharing the CPU names runs")
    n_plain = len(re.findall(r'<img class="plot"', plain))
    n_both = len(re.findall(r'<img class="plot"', html))
    ok_rows = len(re.findall(r'class="st-ok"', html))
    checks.ok(n_both >= n_plain > 0 and ok_rows == len(re.findall(r'class="st-ok"', plain)),
              f"CUDA records sharing CPU names keep every CPU plot ({n_both} >= {n_plain}) and ok row ({ok_rows})",
              f"plots {n_plain} -> {n_both}, ok rows -> {ok_rows}")


def check_ceiling_notes(checks, report, workdir, results):
    """A fraction of a memory ceiling above 1 says why: cache (no flush before the call) or a loaded probe."""
    with open(results, encoding="utf-8") as f:
        doc = json.load(f)
    warm, cold = benchmark_names(results)[:2]
    for e in doc["benchmarks"]:
        n = e.get("run_name") or e["name"]  # aggregates name their run
        if n in (warm, cold):
            e["frac_of_read_ceiling"] = 1.3
            if n == cold:
                e["cold_cache"] = 1
    html = render(checks, report, doc, os.path.join(workdir, "report-above-ceiling.html"),
                  "report with fractions above a memory ceiling runs")
    checks.ok("130% of read ceiling (above the ceiling: some bytes came from cache, or the probe ran under load)" in html
              and "130% of read ceiling (above the ceiling: it was probed under load)" in html,
              "above a memory ceiling: cache named for a call without a flush, the loaded probe for a flushed one")


def check_domain_figures(checks, report, workdir):
    """A technique's own figures get the counters they read, whatever their name: quant's held-out output
    MSE (dropped while only the counters of the tables and a few prefixes were read), and kvcache_model's
    perplexity against bytes per token."""
    def entry(suite, technique, impl, params, counters):
        case_id = ",".join(f"{k}={v}" for k, v in params.items())
        return {"name": f"{suite}/{case_id}/{impl}", "run_name": f"{suite}/{case_id}/{impl}", "suite": suite,
                "technique": technique, "impl": impl, "role": "reference", "backend": "cpu", "case_id": case_id,
                "case": params, "run_type": "iteration", "repetitions": 1, "repetition_index": 0, "iterations": 1,
                "real_time": 1e6, "cpu_time": 1e6, "time_unit": "ns", "status": "ok", **counters}
    bench = [entry("quant", "quant", "reference", {"n": 64, "k": 64, "format": f, "quantizer": "rtn"},
                   {"bits_per_weight": b, "weight_rel_l2_err": e, "heldout_output_mse": e * e, "peak_bytes": 4096})
             for f, b, e in (("int8", 8.25, 0.01), ("int4-g128", 4.13, 0.1))]
    # the same layer on correlated channels: a held-out figure of its own, not points mixed into the first
    bench += [entry("quant", "quant", "reference", {"n": 64, "k": 64, "format": f, "quantizer": "gptq",
                                                    "calib_rows": 4096, "shared_factors": 32},
                    {"bits_per_weight": b, "weight_rel_l2_err": e, "heldout_output_mse": e * e / 10, "peak_bytes": 4096})
              for f, b, e in (("int8", 8.25, 0.02), ("int4-g128", 4.13, 0.2))]
    bench += [entry("kvcache_model", "kvcache_model", "paged", {"kv_dtype": t, "seq": 64},
                    {"perplexity_rel_delta": d, "perplexity_rel_delta_se": d / 4, "kv_bytes_per_token": b,
                     "peak_bytes": 1 << 20})
              for t, d, b in (("fp32", 0.0, 46080), ("int8", 0.003, 12240), ("int4", 0.33, 6480))]
    doc = {"context": {"date": "2026-01-01", "memtrade": {"suites": {
        "quant": {"technique": "quant", "x_param": "n"}, "kvcache_model": {"technique": "kvcache_model",
                                                                            "x_param": "seq"}}}},
           "benchmarks": bench}
    html = render(checks, report, doc, os.path.join(workdir, "report-domain.html"), "report of domain counters runs")
    for alt in ("quant: held-out output MSE, independent channels, 256 calibration rows",
                "quant: held-out output MSE, channels correlated through 32 shared factors, 4096 calibration rows",
                "kvcache_model: KV bytes per token vs perplexity change"):
        checks.ok(f'alt="{alt}"' in html, f"figure '{alt}' drawn from its counters")
    checks.ok(html.count('alt="quant: bits per weight vs weight error"') == 1,
              "one weight-error figure, of the default calibration's cases")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Render test for the memtrade HTML report.")
    ap.add_argument("--report-script", required=True, help="path to scripts/report.py")
    ap.add_argument("--results", nargs="+", help="results JSON files (default: two synthetic fixtures)")
    ap.add_argument("--workdir", help="scratch directory (default: a new temp dir, kept for inspection)")
    args = ap.parse_args(argv)

    checks = Checks()
    try:
        report = os.path.abspath(args.report_script)
        if not os.path.isfile(report):
            raise CheckFailed(f"report script '{args.report_script}' does not exist")
        chromium = find_chromium()
        workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="memtrade-report-test-"))
        os.makedirs(workdir, exist_ok=True)
        print(f"report render test: workdir {workdir}")
        synthetic = not args.results
        results = make_fixtures(workdir) if synthetic else [os.path.abspath(p) for p in args.results]

        cmp_path = os.path.join(workdir, "compare.json")
        write_compare(cmp_path, results[0], results[-1], regressions=1)
        html_path = os.path.join(workdir, "report.html")
        r = run([sys.executable, report, *results, "--compare", cmp_path, "-o", html_path])
        checks.ok(r.returncode == 0 and os.path.isfile(html_path), "report.py exits 0 and writes the HTML",
                  f"rc={r.returncode}\n{r.stdout[-400:]}{r.stderr[-1500:]}")
        with open(html_path, encoding="utf-8") as f:
            html = f.read()
        n_plots = check_static(checks, html, len(results))
        if synthetic:
            checks.ok(re.search(r"<td[^>]*>NaN", html) and "SYNTHETIC DATA" in html,
                      "NaN error rendered as 'NaN'; synthetic data flagged")
            checks.ok(html.count("<div class='warn'>OpenBLAS runs its Haswell kernels") == 1,
                      "the run context flags OpenBLAS kernels narrower than the CPU (the run that has the note)")
        check_render(checks, chromium, workdir, html_path, n_plots)
        check_errors(checks, report, workdir, results[-1])
        check_single_file(checks, report, workdir, results[-1])
        check_shared_names(checks, report, workdir, results[-1])
        check_ceiling_notes(checks, report, workdir, results[-1])
        check_domain_figures(checks, report, workdir)
    except CheckFailed as e:
        print(f"report render test: FAILED after {checks.passed} passed check(s): {e}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as e:
        print(f"report render test: FAILED: timed out after {e.timeout}s: {' '.join(e.cmd[:3])} ...",
              file=sys.stderr)
        return 1
    print(f"report render test: {checks.passed} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
