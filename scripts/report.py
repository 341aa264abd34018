#!/usr/bin/env python3
"""Render memtrade results (Google Benchmark JSON, extended) as one self-contained HTML page.

    python3 scripts/report.py RESULTS.json [RESULTS2.json ...] [--compare COMPARE.json] -o report.html

Per technique the plots come from the last results file that contains that
technique ("current"); with two or more files containing it, a trend section
plots median time and peak bytes across the files in the order given.
Everything (PNG plots as data: URIs, CSS, the tiny load-check script) is inline.
"""
import argparse
import base64
import datetime
import html
import io
import json
import math
import os
import re
import string
import sys
import textwrap
import warnings
from dataclasses import dataclass, field

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib import ticker
except ImportError as _e:
    sys.exit(f"report.py: error: {_e.name} is required (pip install matplotlib numpy); "
             f"interpreter: {sys.executable}")

NOISY_CV = 0.10  # a case whose repetitions spread more than this is marked noisy in the tables
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
NON_OK_STATUSES = ("oom", "skipped", "error")



def template_dir():
    """The page template, style and script: $MEMTRADE_REPORT_TEMPLATE, else report_template/ beside this
    script (the build copies it beside the binary), else the source tree's reports/template/."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("MEMTRADE_REPORT_TEMPLATE")
    for d in ([env] if env else []) + [os.path.join(here, "report_template"),
                                       os.path.join(here, os.pardir, "reports", "template")]:
        if os.path.isfile(os.path.join(d, "page.html")):
            return d
    raise ReportError("the report template (page.html, style.css, load_check.js) was not found beside "
                      f"{here} nor in the source tree; set MEMTRADE_REPORT_TEMPLATE to its folder")


def render_page(title, body):
    d = template_dir()
    parts = {}
    for name in ("page.html", "style.css", "load_check.js"):
        try:
            with open(os.path.join(d, name), encoding="utf-8") as f:
                parts[name] = f.read()
        except OSError as e:
            raise ReportError(f"cannot read the report template file {os.path.join(d, name)}: {e.strerror}") from None
    return string.Template(parts["page.html"]).substitute(title=esc(title), style=parts["style.css"],
                                                          script=parts["load_check.js"], body=body)



class ReportError(Exception):
    """A user-facing input problem: printed without a traceback, exit code 2."""


# ---------------------------------------------------------------- formatting

def esc(v):
    return html.escape("" if v is None else str(v))


def _isnum(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def plottable(v):
    """True for a finite positive number (usable on a log axis)."""
    return _isnum(v) and math.isfinite(v) and v > 0


def fmt_si(v, unit, digits=3):
    """112e9, 'FLOP/s' -> '112 GFLOP/s'."""
    if not _isnum(v):
        return "—" if v is None else str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.{digits}g} {prefix}{unit}"
    return f"{v:.{digits}g} {unit}"


def fmt_x(x):
    """A sweep value as its case id writes it: integers whole (10485760, not 1.04858e+07)."""
    return str(int(x)) if _isnum(x) and float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def fmt_bytes(v, digits=3):
    """Binary units for memory: 786432 -> '768 KiB'."""
    if not _isnum(v):
        return "—" if v is None else str(v)
    if math.isnan(v):
        return "NaN"
    for scale, unit in ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if abs(v) >= scale:
            return f"{v / scale:.{digits}g} {unit}"
    return f"{v:.0f} B"


def fmt_seconds(v):
    if not _isnum(v):
        return "—" if v is None else str(v)
    if math.isnan(v):
        return "NaN"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v / 1e-9:.3g} ns"


def fmt_num(v, spec=".3g"):
    if v is None:
        return "—"
    if not _isnum(v):
        return str(v)
    if math.isnan(v):
        return "NaN"
    return format(v, spec)


def fmt_ceiling(key, v):
    if key.endswith("_flops"):
        return fmt_si(v, "FLOP/s")
    if key.endswith("bytes_per_s"):
        return fmt_si(v, "B/s")
    if key.endswith("_bytes"):
        return fmt_bytes(v)
    return fmt_num(v, ".4g")


def table(headers, rows, row_classes=None):
    """rows: lists of already-escaped HTML cell strings (a cell may be (html, css_class))."""
    out = ["<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = []
        for c in row:
            text, ccls = c if isinstance(c, tuple) else (c, "")
            cells.append(f'<td class="{ccls}">{text}</td>' if ccls else f"<td>{text}</td>")
        out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


# ---------------------------------------------------------------- loading

def load_json(path, what):
    if not os.path.isfile(path):
        raise ReportError(f"{what} file '{path}' does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportError(f"{what} file '{path}' is not valid JSON: {e}") from None
    except OSError as e:
        raise ReportError(f"cannot read {what} file '{path}': {e.strerror}") from None
    if not isinstance(data, dict):
        raise ReportError(f"{what} file '{path}' does not hold a JSON object")
    return data


def load_results(path):
    data = load_json(path, "results")
    if not isinstance(data.get("benchmarks"), list):
        raise ReportError(f"results file '{path}' has no \"benchmarks\" list "
                          "(is it Google Benchmark / memtrade JSON output?)")
    if not isinstance(data.get("context"), dict):
        data["context"] = {}
    return data


@dataclass
class Case:
    """One benchmark name (all its repetitions) in one results file."""
    name: str
    suite: str
    technique: str
    impl: str
    role: str
    backend: str
    case_id: str
    params: dict
    x: object
    status: str = "ok"
    detail: str = ""
    times: list = field(default_factory=list)   # seconds, one per ok repetition
    cpu_times: list = field(default_factory=list)  # the calling thread's CPU seconds, per repetition
    counters: dict = field(default_factory=dict)

    @property
    def ok(self):
        return self.status == "ok"

    @property
    def median_time(self):
        return float(np.median(self.times)) if self.times else None

    @property
    def timing_noise(self):
        """Why this case's timing should not be trusted ('' when it looks clean): repetitions spread more than
        NOISY_CV, or (CPU) one repetition's CPU/wall share fell below half the best one's (pre-empted)."""
        why = []
        if len(self.times) >= 2 and np.mean(self.times) > 0:
            cv = float(np.std(self.times, ddof=1) / np.mean(self.times))
            if cv > NOISY_CV:
                why.append(f"repetitions spread {100 * cv:.0f}%")
        if self.backend == "cpu" and len(self.cpu_times) == len(self.times) and len(self.times) >= 2:
            shares = [c / t for c, t in zip(self.cpu_times, self.times) if t > 0]
            if shares and min(shares) < 0.5 * max(shares):
                why.append(f"pre-empted (CPU/wall {min(shares):.2f} against {max(shares):.2f})")
        return "; ".join(why)


# A record's numbers that are not counters: Google Benchmark's timing fields and the harness's bookkeeping.
NOT_COUNTERS = {"real_time", "cpu_time", "iterations", "repetitions", "repetition_index", "threads", "x",
                "family_index", "per_family_instance_index"}


def _is_counter(key):
    # Every other number is a counter: figures read some that no table names (held-out output MSE,
    # perplexity standard errors).
    return key not in NOT_COUNTERS


def _entry_status(e):
    st = e.get("status")
    if not st:
        st = "error" if e.get("error_occurred") else ("skipped" if e.get("skipped") else "ok")
    detail = e.get("status_detail") or e.get("error_message") or e.get("skip_message") or ""
    return str(st), str(detail)


def collect_cases(results):
    """Group entries by run_name into Case objects (keeps file order)."""
    suites = results["context"].get("memtrade", {}).get("suites", {}) or {}
    cases, medians = {}, {}
    for e in results["benchmarks"]:
        if not isinstance(e, dict) or "name" not in e:
            continue
        name = e.get("run_name") or e["name"]
        # A record is its name and its backend: CPU and CUDA implementations may share a name (as compare
        # names them: "suite/case/impl (cuda)").
        backend = e.get("backend", "") or ""
        if backend and backend != "cpu":
            name = f"{name} ({backend})"
        c = cases.get(name)
        if c is None:
            parts = (e.get("run_name") or e["name"]).split("/")
            suite = e.get("suite") or parts[0]
            params = e.get("case") if isinstance(e.get("case"), dict) else {}
            if not params and len(parts) >= 3:
                params = dict(kv.split("=", 1) for kv in parts[1].split(",") if "=" in kv)
            xp = (suites.get(suite) or {}).get("x_param")
            x = e.get("x", params.get(xp) if xp else None)
            tech = e.get("technique") or (suites.get(suite) or {}).get("technique") or suite
            case_id = e.get("case_id") or ",".join(f"{k}={v}" for k, v in params.items())
            c = cases[name] = Case(name=name, suite=suite, technique=tech, impl=e.get("impl") or parts[-1],
                                   role=e.get("role", ""), backend=e.get("backend", ""), case_id=case_id,
                                   params=params, x=x if _isnum(x) else None)
        st, detail = _entry_status(e)
        if st != "ok" and c.status == "ok":
            c.status, c.detail = st, detail
        scale = TIME_UNITS.get(e.get("time_unit", "ns"), 1e-9)
        run_type = e.get("run_type", "iteration")
        if run_type == "aggregate":
            if e.get("aggregate_name") == "median":
                if _isnum(e.get("real_time")):
                    medians[name] = e["real_time"] * scale
                for k, v in e.items():
                    if _is_counter(k) and _isnum(v):
                        c.counters.setdefault("_agg_" + k, v)
            continue
        if st == "ok" and _isnum(e.get("real_time")):
            c.times.append(e["real_time"] * scale)
            if _isnum(e.get("cpu_time")):
                c.cpu_times.append(e["cpu_time"] * scale)
        for k, v in e.items():
            if _is_counter(k) and _isnum(v):
                c.counters.setdefault(k, []).append(v)
    for name, c in cases.items():
        if not c.times and name in medians and c.ok:
            c.times = [medians[name]]
        agg = {k[5:]: v for k, v in c.counters.items() if k.startswith("_agg_")}
        reps = {k: float(np.median(v)) for k, v in c.counters.items() if not k.startswith("_agg_")}
        c.counters = {**agg, **reps}
    return list(cases.values())


# ---------------------------------------------------------------- series

def x_info(results, technique, cases):
    """(x_param, x_label) from the suite context, else the case param that always equals x."""
    suites = results["context"].get("memtrade", {}).get("suites", {}) or {}
    for s in suites.values():
        if isinstance(s, dict) and s.get("technique") == technique and s.get("x_param"):
            return s["x_param"], s.get("x_label") or s["x_param"]
    with_x = [c for c in cases if c.x is not None]
    for key in (with_x[0].params if with_x else {}):
        if all(str(c.params.get(key)) == f"{c.x:g}" or c.params.get(key) == c.x for c in with_x):
            return key, key
    return "x", "x"


def build_series(cases, x_param):
    """{label: [Case sorted by x]} for one technique."""
    multi_suite = len({c.suite for c in cases}) > 1
    multi_backend = len({c.backend for c in cases}) > 1
    # Only the parameters that vary across the technique's cases name a series.
    keys = {k for c in cases for k in c.params}
    varying = {k for k in keys if len({json.dumps(c.params.get(k), sort_keys=True) for c in cases}) > 1}
    series = {}
    for c in cases:
        rest = " ".join(f"{k}={v}" for k, v in c.params.items() if k != x_param and k in varying)
        label = " ".join(p for p in (c.suite if multi_suite else "", c.impl, rest,
                                     f"[{c.backend}]" if multi_backend else "") if p)
        series.setdefault(label, []).append(c)
    for lst in series.values():
        lst.sort(key=lambda c: (c.x is None, c.x or 0))
    return series


def series_colors(labels):
    cyc = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {lab: cyc[i % len(cyc)] for i, lab in enumerate(labels)}


def pareto_front(points):
    """points: [(t, m, label)] -> non-dominated subset (minimise both), sorted by t."""
    front = [p for p in points
             if not any(q[0] <= p[0] and q[1] <= p[1] and (q[0] < p[0] or q[1] < p[1]) for q in points)]
    return sorted(front)


def facet_cases(cases, x_param):
    """{facet label: {series label: [Case sorted by x]}}: one panel per combination of the parameters that
    vary (other than x), one line per implementation (and backend, and suite when several)."""
    multi_suite = len({c.suite for c in cases}) > 1
    multi_backend = len({c.backend for c in cases if c.ok}) > 1  # skipped CUDA records do not name lines
    keys = {k for c in cases for k in c.params}
    varying = sorted(k for k in keys if k != x_param
                     and len({json.dumps(c.params.get(k), sort_keys=True) for c in cases}) > 1)
    facets = {}
    for c in cases:
        facet = " ".join(f"{k}={c.params[k]}" for k in varying if k in c.params) or "all cases"
        label = " ".join(p for p in (c.suite if multi_suite else "", c.impl,
                                     f"[{c.backend}]" if multi_backend else "") if p)
        facets.setdefault(facet, {}).setdefault(label, []).append(c)
    for series in facets.values():
        for lst in series.values():
            lst.sort(key=lambda c: (c.x is None, c.x or 0))
    return facets


# Lines of different implementations that coincide (auto dispatching to flash) stay visible: each
# implementation has its own marker, width and dash.
LINE_STYLES = [dict(marker="o", ms=5, lw=2.2, ls="-"), dict(marker="s", ms=3.5, lw=1.4, ls="--"),
               dict(marker="^", ms=3.5, lw=1.2, ls=":"), dict(marker="D", ms=3, lw=1.2, ls="-."),
               dict(marker="v", ms=3.5, lw=1.0, ls="-")]


def impl_colors(labels):
    """One colour per implementation label, the same in every panel (tab10, then tab20's light half)."""
    cyc = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20").colors[1::2])
    return {lab: cyc[i % len(cyc)] for i, lab in enumerate(sorted(labels))}


# ---------------------------------------------------------------- plotting

def fig_to_img(fig, alt, tight=False):
    """tight: the saved image grows to hold artists outside the figure (legends beside the axes)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, **({"bbox_inches": "tight"} if tight else {}))
    plt.close(fig)
    b64 = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="plot" alt="{esc(alt)}" src="data:image/png;base64,{b64}">'


def figure(caption_html, img):
    cap = f"<figcaption>{caption_html}</figcaption>" if caption_html else ""
    return f"<figure>{img}{cap}</figure>"


class DistinctFormatter(ticker.Formatter):
    """Tick labels fmt(value, digits) with the fewest significant digits in `digits` that tell the axis's ticks
    apart: errors spread over a few percent read 5.95e-07, 6e-07, 6.05e-07, not 6e-07 twice, and peaks a few
    KiB apart at 3 MiB read 2.996 MiB, 3 MiB, 3.004 MiB, not 3 MiB five times."""

    def __init__(self, fmt, digits):
        self.fmt, self.digits = fmt, digits

    def format_ticks(self, values):
        for d in self.digits:
            labels = [self.fmt(v, d) for v in values]
            if len(set(labels)) == len(labels):
                break
        return labels

    def __call__(self, v, pos=None):
        return self.fmt(v, 3)


def set_log_axis(ax, which, values, kind):
    """Log axis with human-readable tick labels: kind in bytes|seconds|plain."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    set_scale = ax.set_yscale if which == "y" else ax.set_xscale
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    span = math.log10(max(vals) / min(vals)) if vals else 0
    if kind == "bytes":
        set_scale("log", base=2)
        subs = (1.0, 1.5) if span < math.log10(6) else (1.0,)
        axis.set_major_locator(ticker.LogLocator(base=2, subs=subs, numticks=10))
        axis.set_major_formatter(DistinctFormatter(fmt_bytes, range(3, 8)))
    else:
        set_scale("log")
        # Sub-decade ticks as dense as their labels allow (at 5, 6, 7 they ran into each other over half a decade).
        subs = (tuple(range(1, 10)) if span < 0.3 else (1.0, 2.0, 3.0, 5.0, 7.0) if span < 0.8
                else (1.0, 2.0, 5.0) if span < 1.5 else (1.0,))
        axis.set_major_locator(ticker.LogLocator(base=10, subs=subs, numticks=12))
        if kind == "seconds":
            axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_seconds(v)))
        elif span >= 1.5:
            axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.0e}"))
        else:
            axis.set_major_formatter(DistinctFormatter(lambda v, d: f"{v:.{d}g}", range(2, 7)))
    axis.set_minor_formatter(ticker.NullFormatter())


def set_x_axis(ax, xs, x_label):
    xs = sorted({x for x in xs if x is not None})
    if xs and xs[0] > 0:
        ax.set_xscale("log", base=2)
        if len(xs) <= 8:
            ax.set_xticks(xs)
        else:
            ax.xaxis.set_major_locator(ticker.LogLocator(base=2, numticks=8))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel(f"{x_label} (log)")


def place_legend(fig, ax, n):
    """Inside the axes for a few entries; below the axes (figure grows) for many."""
    if n <= 6:
        ax.legend(fontsize=8)
        return
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.set_size_inches(fig.get_figwidth(), fig.get_figheight() + 0.15 * math.ceil(n / 2))


def tradeoff_plot(facets, colors, x_param):
    """Memory-vs-time scatter at the largest x with >= 2 usable points, with the Pareto front; colour =
    implementation, marker = panel (the varying parameters)."""
    by_x, impls_at = {}, {}
    for facet, series in facets.items():
        for label, lst in series.items():
            for c in lst:
                if c.ok and c.x is not None and c.median_time and _isnum(c.counters.get("peak_bytes")):
                    by_x.setdefault(c.x, []).append((c.median_time, c.counters["peak_bytes"], label, facet))
                    impls_at.setdefault(c.x, set()).add(c.impl)
    usable = [x for x, pts in by_x.items() if len(pts) >= 2]
    if not usable:
        return None, "No value of the sweep has two or more ok cases with both time and peak memory; no trade-off plot."
    # The largest size at which the most implementations ran ok (an oom leaves a size with fewer).
    x = max(usable, key=lambda v: (len(impls_at[v]), v))
    pts = by_x[x]
    front = pareto_front([(t, m, f"{lab} | {facet}") for t, m, lab, facet in pts])
    on_front = {p[2] for p in front}
    facet_names = sorted({p[3] for p in pts})
    markers = dict(zip(facet_names, "os^Dv<>pP*hX" * 4))
    fig, ax = plt.subplots(figsize=(7.4, 4.4))
    for t, m, label, facet in pts:
        on = f"{label} | {facet}" in on_front
        ax.scatter([t], [m], s=70 if on else 36, color=colors[label], marker=markers[facet],
                   edgecolors="black" if on else "none", linewidths=1.2, zorder=3)
    if len(front) > 1:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#444",
                linestyle="--", linewidth=1.0, zorder=2)
    set_log_axis(ax, "x", [p[0] for p in pts], "seconds")
    set_log_axis(ax, "y", [p[1] for p in pts], "bytes")
    ax.margins(0.15)
    ax.set_xlabel("median time per iteration (log)")
    ax.set_ylabel("peak memory (log2)")
    ax.set_title(f"memory vs time at {x_param}={fmt_x(x)}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    from matplotlib.lines import Line2D
    impls = sorted({p[2] for p in pts})
    h1 = [Line2D([], [], color=colors[k], marker="o", ls="", label=k) for k in impls]
    panels, h2 = "", None
    if len(facet_names) > 1:
        short = distinguishing(facet_names)
        if max(len(v) for v in short.values()) > 40:  # too long for a legend: numbered, named in the caption
            panels = " Panels: " + "; ".join(f"{i + 1} = {esc(k)}" for i, k in enumerate(facet_names)) + "."
            short = {k: f"panel {i + 1}" for i, k in enumerate(facet_names)}
        h2 = [Line2D([], [], color="#555", marker=markers[k], ls="", label=short[k]) for k in facet_names]
    side_legends(fig, ax, h1, h2, marker_fontsize=7)
    with warnings.catch_warnings():  # legends wider than the figure: the saved image grows to hold them
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    names = ", ".join(p[2] for p in front)
    cap = (f"Every case at {esc(x_param)}={fmt_x(x)} (the largest value at which the most implementations ran ok); "
           f"colour = implementation, marker = panel. Outlined points are Pareto-optimal (no other point is "
           f"both faster and smaller): {esc(names)}.{panels}")
    return fig_to_img(fig, f"trade-off {x_param}={fmt_x(x)}", tight=True), cap


def side_legends(fig, ax, colour, marker=None, marker_fontsize=7.5):
    """The colour legend beside the axes at the top, the marker legend (if any) beside them at the bottom. The
    colour one is a figure legend, which a saved image's tight box holds (an axes legend kept with add_artist
    beside the second one falls outside that box and is cut); save with fig_to_img(..., tight=True)."""
    fig.legend(handles=colour, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), bbox_transform=ax.transAxes,
               frameon=False)
    if marker:
        ax.legend(handles=marker, fontsize=marker_fontsize, loc="lower left", bbox_to_anchor=(1.01, 0.0), frameon=False)


def distinguishing(names):
    """{facet name: the name with only the k=v parts that differ between the names}: a legend of a few
    points needs what tells them apart, not every parameter of the technique's sweep."""
    parts = {n: n.split(" ") for n in names}
    if any(not all("=" in p for p in ps) for ps in parts.values()):
        return {n: n for n in names}
    vals = [dict(p.split("=", 1) for p in ps) for ps in parts.values()]
    keys = {k for v in vals for k in v}
    differ = {k for k in keys if len({v.get(k) for v in vals}) > 1}
    return {n: " ".join(p for p in ps if p.split("=", 1)[0] in differ) or n for n, ps in parts.items()}


def facet_figure(facets, colors, x_label, value_fn, title, ylabel, kind, errbars=None, max_panels=12):
    """Small multiples: one panel per facet (shared axes), one line per implementation, one legend.
    Returns (img_html or None, caption note)."""
    usable = {}
    for facet, series in facets.items():
        pts = {lab: [(c.x, value_fn(c), c) for c in lst if c.ok and c.x is not None and plottable(value_fn(c))]
               for lab, lst in series.items()}
        pts = {lab: p for lab, p in pts.items() if p}
        if pts:
            usable[facet] = pts
    if not usable:
        return None, ""
    note = ""
    if len(usable) > max_panels:
        note = f"{len(usable) - max_panels} more panel(s) not drawn; see the table."
        usable = dict(list(usable.items())[:max_panels])
    n = len(usable)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.3 * ncols, 2.7 * nrows + 1.0), squeeze=False,
                             sharex=True, sharey=True)
    styles = {lab: st for lab, st in zip(sorted(colors), LINE_STYLES * 4)}
    allv, allx = [], []
    for ax, (facet, series) in zip(axes.flat, usable.items()):
        # In the styles' order, widest line first: a series equal to another (attention's auto where it
        # picks flash) is drawn under the thinner, dashed one, which stays visible.
        for lab, pts in sorted(series.items()):
            xs, vs = [p[0] for p in pts], [p[1] for p in pts]
            allv += vs
            allx += xs
            if errbars:
                lo = [v - min(errbars(c)) for _, v, c in pts]
                hi = [max(errbars(c)) - v for _, v, c in pts]
                allv += [min(errbars(c)) for *_, c in pts] + [max(errbars(c)) for *_, c in pts]
                ax.errorbar(xs, vs, yerr=[lo, hi], capsize=2, label=lab, color=colors[lab], **styles[lab])
            else:
                ax.plot(xs, vs, label=lab, color=colors[lab], **styles[lab])
        ax.set_title(facet, fontsize=8.5)
        ax.grid(True, which="major", alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    first = axes.flat[0]
    set_x_axis(first, allx, x_label)
    set_log_axis(first, "y", allv, kind)
    for ax in axes.flat:
        ax.tick_params(labelsize=8)
        ax.set_xlabel("")
        ax.set_ylabel("")
    fig.supxlabel(f"{x_label} (log)", fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    labels = sorted(handles)
    h = fig.get_figheight()
    fig.suptitle(title, fontsize=11, y=1 - 0.05 / h, va="top")
    fig.legend([handles[lab] for lab in labels], labels, loc="upper center", ncol=min(6, len(labels)),
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, 1 - 0.3 / h))
    fig.tight_layout(rect=[0, 0, 1, 1 - 0.6 / h])
    return fig_to_img(fig, title), note


def scatter_labelled(points, title, xlabel, ylabel, ylog=True, yerr=None, dodge=False, colour_keys=None):
    """points: [(x, y, colour_key, marker_key)]; colour = one legend, marker = the other. yerr: [(lo, hi)].
    dodge: colour keys that share an x are drawn side by side, 1.5% of the x range apart (a key's markers
    still coincide). colour_keys: every key of a set of figures, so that a key has one colour in all of them."""
    ckeys = sorted({p[2] for p in points})
    mkeys = sorted({p[3] for p in points})
    colors = impl_colors(set(colour_keys or ()) | set(ckeys))
    markers = dict(zip(mkeys, "os^Dv<>pP*hX"))
    if dodge:
        xs = [p[0] for p in points]
        step = 0.015 * ((max(xs) - min(xs)) or 1.0)
        at = {}
        for x, _, ck, _ in points:
            at.setdefault(float("%.6g" % x), set()).add(ck)
        def shift(x, ck):
            keys = sorted(at[float("%.6g" % x)])
            return x + (keys.index(ck) - (len(keys) - 1) / 2) * step
        points = [(shift(x, ck), y, ck, mk) for x, y, ck, mk in points]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (x, y, ck, mk) in enumerate(points):
        kw = dict(color=colors[ck], marker=markers.get(mk, "o"), s=46, zorder=3, edgecolors="black", linewidths=0.4)
        ax.scatter([x], [y], **kw)
        if yerr:
            ax.errorbar([x], [y], yerr=[[yerr[i][0]], [yerr[i][1]]], color=colors[ck], capsize=2, lw=1, zorder=2)
    if ylog:
        set_log_axis(ax, "y", [p[1] for p in points], "plain")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    from matplotlib.lines import Line2D
    h1 = [Line2D([], [], color=colors[k], marker="o", ls="", label=k) for k in ckeys]
    h2 = [Line2D([], [], color="#555", marker=markers.get(k, "o"), ls="", label=k) for k in mkeys]
    side_legends(fig, ax, h1, h2)
    fig.tight_layout()
    return fig_to_img(fig, title, tight=True)


def binary_ticks(axis, top, most=6):
    """Ticks at multiples of a power of two bytes, about most / 2 to `most` up to `top` (4 MiB, 8 MiB, ...,
    not 1.91 MiB)."""
    if top > 0:
        axis.set_major_locator(ticker.MultipleLocator(2.0 ** max(0, math.ceil(math.log2(top / most)))))


def bars(groups, stack_keys, title, ylabel, kind="bytes", notes=None):
    """Stacked bars: groups = [(label, {stack key: value})]. Upright for a few short labels; lying, with the
    labels on the axis, for many or long ones (rotated under the axis they ran into each other), or with
    `notes` (one text per group, written at the end of its bar; no legend then: the axis names the one key)."""
    labels = [g[0] for g in groups]
    lying = notes is not None or len(groups) > 8 or max((len(lab) for lab in labels), default=0) > 24
    wrapped = [textwrap.fill(lab, 40) for lab in labels]
    tall = 1.3 + sum(0.16 + 0.12 * (w.count("\n") + 1) for w in wrapped)
    fig, ax = plt.subplots(figsize=(7.4, tall) if lying else (6.4, 4.2))
    colors = dict(zip(stack_keys, plt.get_cmap("tab10").colors))
    base = np.zeros(len(groups))
    pos = range(len(groups))
    for k in stack_keys:
        vals = np.array([g[1].get(k, 0) or 0 for g in groups], dtype=float)
        if vals.any():
            if lying:
                ax.barh(pos, vals, left=base, label=k, color=colors[k], height=0.65)
            else:
                ax.bar(pos, vals, bottom=base, label=k, color=colors[k], width=0.6)
        base += vals
    if lying:
        ax.set_yticks(pos)
        ax.set_yticklabels(wrapped, fontsize=7.5)
        ax.invert_yaxis()
    else:
        ax.set_xticks(pos)
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    texts = [(v, ax.text(v, y, " " + note, va="center", fontsize=7.5, in_layout=False))
             for y, v, note in zip(pos, base, notes or []) if note]
    if texts and base.max() > 0:
        # room for every note: a note of w pixels from x = v ends inside an axis W pixels wide when the axis
        # reaches v W / (W - w) (the widths measured by the renderer once the layout is set)
        fig.tight_layout()
        renderer = fig.canvas.get_renderer()
        W = ax.get_window_extent(renderer).width
        need = [v * W / max(W - t.get_window_extent(renderer).width, 0.2 * W) for v, t in texts]
        ax.set_xlim(0, max(base.max(), *need) * 1.03)
    axis = ax.xaxis if lying else ax.yaxis
    if kind == "bytes":
        binary_ticks(axis, float(base.max()) if len(base) else 0.0, 4 if lying else 6)
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_bytes(v)))
    elif kind == "rate":
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_si(v, "B/s", 2)))
    (ax.set_xlabel if lying else ax.set_ylabel)(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x" if lying else "y", alpha=0.3)
    if notes is None:
        ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig_to_img(fig, title)


def largest_cases(cases, key_params):
    """The ok case of each (impl, key params) with the largest x: one point per variant."""
    best = {}
    for c in cases:
        if not c.ok:
            continue
        k = (c.impl,) + tuple(str(c.params.get(p)) for p in key_params)
        if k not in best or (c.x or 0) > (best[k].x or 0):
            best[k] = c
    return list(best.values())


def quant_calibration(c):
    """(shared_factors, calib_rows) of a quant case: the calibration data its GPTQ / AWQ saw."""
    return int(c.params.get("shared_factors", 0) or 0), int(c.params.get("calib_rows", 256) or 256)


def quant_figures(cases):
    """Bits per weight against the weights' and the outputs' error (one held-out figure per calibration
    setting: independent or correlated channels, calibration rows), and the kernels' bandwidth per format."""
    figs = []
    refs = [c for c in cases if c.impl == "reference"]
    quantizers = {c.params.get("quantizer", c.impl) for c in refs}  # one colour each in every figure
    default = [c for c in refs if quant_calibration(c) == (0, 256)]
    pts = [(c.counters["bits_per_weight"], c.counters["weight_rel_l2_err"], c.params.get("quantizer", c.impl),
            c.params.get("format", "?"))
           for c in largest_cases(default, ("format", "quantizer"))
           if _isnum(c.counters.get("bits_per_weight")) and plottable(c.counters.get("weight_rel_l2_err"))]
    if pts:
        figs.append(figure("Storage per weight (codes, scales, zero points) against the weights' relative L2 "
                           "reconstruction error, at the largest shape; colour = quantizer, marker = format.",
                           scatter_labelled(pts, "quant: bits per weight vs weight error", "bits per weight",
                                            "weight relative L2 error (log)", colour_keys=quantizers)))
    for setting in sorted({quant_calibration(c) for c in refs}):
        factors, rows = setting
        pts = [(c.counters["bits_per_weight"], c.counters["heldout_output_mse"], c.params.get("quantizer", c.impl),
                c.params.get("format", "?"))
               for c in largest_cases([c for c in refs if quant_calibration(c) == setting], ("format", "quantizer"))
               if _isnum(c.counters.get("bits_per_weight")) and plottable(c.counters.get("heldout_output_mse"))]
        if not pts:
            continue
        channels = (f"channels correlated through {factors} shared factors" if factors else "independent channels")
        figs.append(figure(f"Output error on held-out inputs (not the calibration rows GPTQ/AWQ fit): {channels}, "
                           f"{rows} calibration rows. With independent channels GPTQ has only the sample's noise to "
                           "fit; correlated channels give its error feedback something to use.",
                           scatter_labelled(pts, f"quant: held-out output MSE, {channels}, {rows} calibration rows",
                                            "bits per weight", "held-out output MSE (log)", colour_keys=quantizers)))
    matvec = [c for c in cases if c.ok and str(c.params.get("m")) == "1" and _isnum(c.counters.get("gbytes_per_s"))
              and c.params.get("quantizer", "rtn") == "rtn"]
    if matvec:
        biggest = max(c.x or 0 for c in matvec)
        sel = sorted([c for c in matvec if (c.x or 0) == biggest], key=lambda c: (c.params.get("format", ""), c.impl))
        def note(c):
            f, g = c.counters.get("frac_of_copy_ceiling"), c.counters.get("frac_of_flush_read")
            return ", ".join(([f"{f:.2f} of copy"] if _isnum(f) else []) + ([f"{g:.2f} of flush read"] if _isnum(g) else []))
        key = "weight bytes read per second"
        img = bars([(f"{c.params.get('format')} {c.impl}", {key: c.counters["gbytes_per_s"] * 1e9}) for c in sel], [key],
                   f"quant: matvec (m=1) bandwidth at n={fmt_x(biggest)}", key, kind="rate",
                   notes=[note(c) for c in sel])
        figs.append(figure("Weight bytes (codes, scales) read per second of the batch-1 matvec, RTN weights; beside each "
                           "bar, the fraction of this machine's copy bandwidth probed at the start of the run "
                           "(frac_of_copy_ceiling) and of the read rate of the cache flushes just before the calls "
                           "(frac_of_flush_read: memory's rate at the same moment).", img))
    return figs


QUANT_MODEL_NAMES = {"trained": "the trained small model", "smollm2": "SmolLM2-135M"}


def quant_model_figures(cases):
    """One bits-vs-perplexity scatter per model (the small trained model, SmolLM2): their perplexity
    changes differ by orders of magnitude and must not share an axis."""
    figs = []
    for model in sorted({c.params.get("model", "trained") for c in cases}):
        pts, err = [], []
        for c in cases:
            v, b = c.counters.get("perplexity_rel_delta"), c.counters.get("bits_per_weight")
            if c.params.get("model", "trained") == model and c.ok and _isnum(v) and _isnum(b):
                # GPTQ calibrated layer by layer is its own colour beside the same quantizer on fp32 activations.
                label = c.impl + (" sequential" if c.params.get("sequential") is True else "")
                pts.append((b, 100 * v, label, c.params.get("format", "?")))
                se = c.counters.get("perplexity_rel_delta_se")
                err.append((100 * se, 100 * se) if _isnum(se) else (0, 0))
        if not pts:
            continue
        name = QUANT_MODEL_NAMES.get(model, model)
        img = scatter_labelled(pts, f"quant_model ({name}): bits per weight vs perplexity change",
                               "bits per weight (projections)", "perplexity vs fp32 (%)", ylog=False, yerr=err)
        figs.append(figure(f"{esc(name)}: validation perplexity relative to its fp32 model, +- one standard error "
                           "over the evaluation batches; colour = quantizer (GPTQ calibrated layer by layer: sequential), "
                           "marker = format.", img))
    return figs


def kvcache_model_figures(cases):
    """The model through the cache: per KV storage type, bytes per token against the perplexity change;
    per weight format, the weight bytes each decoded token reads against tokens per second (batch 1)."""
    figs = []
    kv = [c for c in cases if c.ok and "weights" not in c.params and "host_layers" not in c.params
          and _isnum(c.counters.get("perplexity_rel_delta")) and _isnum(c.counters.get("kv_bytes_per_token"))]
    if len({c.params.get("kv_dtype") for c in kv}) >= 2:
        pts, err = [], []
        for c in kv:
            pts.append((c.counters["kv_bytes_per_token"] / 1024, 100 * c.counters["perplexity_rel_delta"],
                        str(c.params.get("kv_dtype")), c.impl))
            se = c.counters.get("perplexity_rel_delta_se")
            err.append((100 * se, 100 * se) if _isnum(se) else (0, 0))
        img = scatter_labelled(pts, "kvcache_model: KV bytes per token vs perplexity change",
                               "KV cache KiB per token (all layers)", "perplexity vs the fp32 cache (%)", ylog=False,
                               yerr=err, dodge=True)
        figs.append(figure("Validation perplexity through the cache relative to the fp32 cache on the same windows, "
                           "+- one standard error over the windows; colour = KV storage type, marker = layout (both "
                           "layouts store the same records, so their points coincide); types of equal bytes per "
                           "token are drawn side by side.", img))
    wf = [c for c in cases if c.ok and "weights" in c.params and _isnum(c.counters.get("tokens_per_s"))
          and _isnum(c.counters.get("weight_bytes_read"))]
    if len(wf) >= 2:
        pts = [(c.counters["weight_bytes_read"] / 2 ** 20, c.counters["tokens_per_s"],
                str(c.params["weights"]) + (" a8" if c.params.get("activations") == "int8" else ""), c.impl) for c in wf]
        img = scatter_labelled(pts, "kvcache_model: weight bytes per token vs decode speed", "weight MiB read per token",
                               "tokens per second (batch 1)", ylog=False)
        figs.append(figure("Batch-1 decode: the bytes of every projection and lm_head each token reads, against tokens "
                           "per second; colour = weight format (a8: int8 activations), marker = layout.", img))
    return figs


TAG_ORDER = ["weights", "master", "grads", "optimizer", "activations", "workspace", "io", "kv", "other"]


def tag_figures(tech):
    """Each training step's peak bytes per tag, one bar per implementation and case; the host pool's tags
    (offload) as a second bar beside the device's."""
    def figures(cases):
        ok = [c for c in cases if c.ok and any(k.startswith("peak_bytes_") for k in c.counters)]
        if not ok:
            return []
        varying = varying_params(ok)
        groups = []
        for c in ok:
            label = " ".join([f"{k}={c.params[k]}" for k in varying if k in c.params] + [c.impl])
            groups.append((label, {t: c.counters.get("peak_bytes_" + t, 0) for t in TAG_ORDER}))
            if any(k.startswith("host_peak_bytes_") for k in c.counters):
                groups.append((label + " (host)", {t: c.counters.get("host_peak_bytes_" + t, 0) for t in TAG_ORDER}))
        img = bars(groups, TAG_ORDER, f"{tech}: peak bytes per tag", "peak bytes held per tag")
        return [figure("Each tag's own peak during one training step, from the tracked allocator (tags peak at "
                       "different moments, so a stack can exceed the step's peak_bytes); bars marked (host) are the "
                       "host pool's.", img)]
    return figures


def bandwidth_figures(cases):
    """GB/s of each implementation and case, for kernels that declare the bytes they must move."""
    ok = [c for c in cases if c.ok and _isnum(c.counters.get("gbytes_per_s"))]
    if not ok:
        return []
    varying = varying_params(ok)
    groups = [(" ".join([f"{k}={c.params[k]}" for k in varying if k in c.params] + [c.impl]),
               {"bytes moved per second": c.counters["gbytes_per_s"] * 1e9}) for c in ok]
    img = bars(groups, ["bytes moved per second"], "bytes a call must move, per second", "bytes/s", kind="rate")
    return [figure("The bytes each call must read and write over its median time (frac_of_copy_ceiling in the "
                   "table: the share of this machine's copy bandwidth).", img)]


SERVING_KEYS = {"token states": "kv_budget_utilization", "reserved, unused (internal)": "kv_internal_frag",
                "free while requests wait (external)": "kv_external_frag"}


def serving_figures(cases):
    """The KV budget split as the vLLM paper's Fig. 2 draws it, per trace and layout."""
    ok = [c for c in cases if c.ok and "kv_budget_utilization" in c.counters]
    if not ok:
        return []
    varying = [k for k in sorted({k for c in ok for k in c.params}) if len({str(c.params.get(k)) for c in ok}) > 1]
    groups = [(" ".join([f"{k}={c.params[k]}" for k in varying if k in c.params] + [c.impl]),
               {label: c.counters.get(key, 0) for label, key in SERVING_KEYS.items()}) for c in ok]
    img = bars(groups, list(SERVING_KEYS), "kvcache_serving: the KV budget, mean over decode steps",
               "share of the KV budget", kind="plain")
    figures = [figure("Bytes of the running requests' tokens, bytes reserved for them but unused, and bytes free "
                      "while requests wait, as shares of the KV budget (mean over decode steps).", img)]
    # A budget in bytes (budget_mib): each KV storage type holds its own number of tokens.
    typed = [c for c in ok if "kv_dtype" in c.params and "kv_budget_tokens" in c.counters]
    if typed:
        varying = [k for k in sorted({k for c in typed for k in c.params} - {"kv_dtype"})
                   if len({str(c.params.get(k)) for c in typed}) > 1]
        rows = [(" ".join([f"{k}={c.params[k]}" for k in varying if k in c.params] + [str(c.params["kv_dtype"]), c.impl]),
                 {"decode tokens per step": c.counters.get("decode_tokens_per_step", 0)},
                 f"{c.counters['kv_budget_tokens'] / 1024:.1f}K tokens"
                 + (f" ({c.counters['kv_residual_tokens']:.0f} a request for its residual)" if "kv_residual_tokens" in c.counters else "")
                 + f", batch <= {c.counters.get('max_concurrency', 0):.0f}, {c.counters.get('preemptions', 0):.0f} preempted")
                for c in typed]
        img = bars([r[:2] for r in rows], ["decode tokens per step"],
                   "kvcache_serving: one byte budget, per KV storage type", "decode tokens per step (mean running requests)",
                   kind="plain", notes=[r[2] for r in rows])
        figures.append(figure("The same KV budget in bytes holds as many tokens as each storage type's bytes per token "
                              "allow (scales included): the running requests per decode step, with the tokens the budget "
                              "holds (KIVI types: less each running request's fp16 residual), the largest batch and the "
                              "preemptions at the end of each bar. Steps of the "
                              "simulation: a real step's time also grows with the batch.", img))
    return figures


# Techniques whose tracked bytes and time are a simulation's (kvcache_serving: a cache of 16 bytes per token,
# whose ratios are what it measures): no memory-against-time plot.
SIMULATED = {"kvcache_serving"}

SPECIAL_FIGURES = {"quant": quant_figures, "quant_model": quant_model_figures, "kvcache_model": kvcache_model_figures,
                   "precision": tag_figures("precision"), "checkpoint": tag_figures("checkpoint"),
                   "accum": tag_figures("accum"), "offload": tag_figures("offload"), "lora": tag_figures("lora"),
                   "cpu_adam": bandwidth_figures, "kvcache_serving": serving_figures}


# ---------------------------------------------------------------- sections

def context_table(idx, path, results, is_current):
    ctx = results["context"]
    mt = ctx.get("memtrade", {}) or {}
    suites = mt.get("suites", {}) or {}
    commit = mt.get("git_commit") or "—"
    if mt.get("git_dirty"):
        commit += " (dirty)"
    cpu = mt.get("cpu_model") or "—"
    cores = mt.get("cpu_cores") or ctx.get("num_cpus")
    if cores:
        cpu += f", {cores} cores"
    if ctx.get("mhz_per_cpu"):
        cpu += f", {ctx['mhz_per_cpu']} MHz"
    gpu = mt.get("gpu_name")
    gpu = (f"{gpu}, driver {mt.get('gpu_driver') or '?'}, CUDA {mt.get('cuda_runtime') or '?'}"
           if gpu else "none")
    cap = mt.get("capacity_bytes")
    cap = (f"{fmt_bytes(cap)} ({cap} B)" if _isnum(cap) else
           "per suite (see suites)" if any(_isnum((v or {}).get("capacity_bytes")) for v in suites.values())
           else "not limited")
    ceil = mt.get("ceilings") or {}
    ceil_html = "<br>".join(f"{esc(k)}: <b>{esc(fmt_ceiling(k, v))}</b>" for k, v in ceil.items()) or "—"
    reps = {}
    for e in results["benchmarks"]:
        if isinstance(e, dict) and _isnum(e.get("repetitions")) and e.get("repetitions"):
            reps.setdefault(e.get("suite", "?"), set()).add(int(e["repetitions"]))

    def suite_line(k, v):
        v = v or {}
        bits = [f"{'/'.join(str(r) for r in sorted(reps[k]))} repetitions"] if k in reps else []
        if _isnum(v.get("capacity_bytes")):
            bits.append(f"capacity {fmt_bytes(v['capacity_bytes'])}")
        return f"<b>{esc(k)}</b>" + (f" <span class='muted'>({esc(', '.join(bits))})</span>" if bits else "")
    suite_html = "<br>".join(suite_line(k, v) for k, v in suites.items()) or "—"
    rows = [("file", esc(path) + (" <b>(current)</b>" if is_current else "")),
            ("suite(s)", suite_html), ("profile", esc(mt.get("profile", "—"))),
            ("backend", esc(mt.get("backend", "—"))), ("commit", esc(commit)),
            ("date", esc(ctx.get("date", "—"))), ("host", esc(ctx.get("host_name", "—"))),
            ("machine class", esc(fmt_machine_class(mt.get("machine_class")))),
            ("compiler", esc(mt.get("compiler", "—"))), ("build type", esc(mt.get("build_type", "—"))),
            ("CXX flags", esc(mt.get("cxx_flags", "—"))), ("CPU", esc(cpu)), ("GPU", esc(gpu)),
            ("CPU settings", esc(", ".join(f"{k} {mt[k]}" for k in ("simd_target", "blas_core", "huge_pages")
                                           if mt.get(k)) or "—")
             + (f"<div class='warn'>{esc(mt['blas_note'])}</div>" if mt.get("blas_note") else "")),
            ("memory capacity", esc(cap)),
            ("ceilings", ceil_html), ("entries", esc(len(results["benchmarks"])))]
    warn = ('<p class="synthetic">SYNTHETIC DATA: this results file was generated for testing; '
            'its numbers are not measurements.</p>' if mt.get("synthetic") else "")
    return (f"<div><h3>#{idx + 1}: {esc(os.path.basename(path))}</h3>{warn}"
            + table(["field", "value"], [[esc(k), v] for k, v in rows]) + "</div>")


def fmt_machine_class(mc):
    if isinstance(mc, dict):
        return "; ".join(f"{k}: {v}" for k, v in mc.items()) or "—"
    return "—" if mc is None else str(mc)


def glance_table(current, cur_path, baseline, base_path):
    """Where the current run and the baseline come from, side by side."""
    def fields(res):
        ctx = res["context"]
        mt = ctx.get("memtrade", {}) or {}
        commit = (mt.get("git_commit") or "—")[:12] + (" (dirty)" if mt.get("git_dirty") else "")
        gpu = mt.get("gpu_name") or "none"
        return [commit, str(ctx.get("date", "—")), fmt_machine_class(mt.get("machine_class")),
                f"{mt.get('cpu_model') or '—'}, {mt.get('cpu_cores') or ctx.get('num_cpus') or '?'} cores", gpu,
                f"{mt.get('profile', '—')} / {mt.get('backend', '—')}", f"{mt.get('build_type', '—')}, "
                f"{mt.get('compiler', '—')}", ", ".join((mt.get("suites") or {}).keys()) or "—"]
    names = ["commit", "date", "machine class", "CPU", "GPU", "profile / backend", "build", "suites"]
    cur = fields(current)
    if baseline is None:
        return table(["", "current: " + os.path.basename(cur_path)], [[esc(n), esc(v)] for n, v in zip(names, cur)])
    base = fields(baseline)
    rows = [[esc(n), esc(c), (esc(b), "differs") if b != c else esc(b)] for n, c, b in zip(names, cur, base)]
    return table(["", "current: " + esc(os.path.basename(cur_path)), "baseline: " + esc(os.path.basename(base_path))],
                 rows)


def short_name(name):
    """A case name for tables: parameter values longer than 16 characters (checksums) cut to 8."""
    return re.sub(r"=([^,/]{17,})", lambda m: "=" + m.group(1)[:8] + "...", str(name or ""))


def compare_section(cmp, path):
    rows = [r for r in cmp.get("rows", []) if isinstance(r, dict)]
    nreg = cmp.get("regressions")
    if not _isnum(nreg):
        nreg = sum(1 for r in rows if r.get("verdict") == "regression")
    out = ['<section id="regressions"><h2>Regressions against baseline</h2>',
           f"<p class='muted'>baseline: {esc(cmp.get('baseline', '?'))} &nbsp; current: "
           f"{esc(cmp.get('current', '?'))} &nbsp; time mode: {esc(cmp.get('time_mode', '?'))}</p>"]
    if cmp.get("same_machine_class") is False:
        out.append('<p class="warn">Baseline and current ran on different machine classes; '
                   'time comparisons are not meaningful.</p>')
    if cmp.get("time_mode") == "report":
        out.append('<p class="note">Time mode "report": time changes are informational and do not gate.</p>')
    out.append(f'<p class="big-bad">{int(nreg)} regression{"s" if nreg != 1 else ""}</p>' if nreg
               else '<p class="big-ok">No regressions: 0 regressions against baseline.</p>')
    notok = [r for r in rows if r.get("verdict") != "ok"]
    counts = {}
    for r in rows:
        counts[r.get("verdict", "?")] = counts.get(r.get("verdict", "?"), 0) + 1
    out.append("<p>" + esc(", ".join(f"{v}: {n}" for v, n in sorted(counts.items())) or "no rows") + "</p>")
    if notok:
        order = {"regression": 0, "improved": 1, "unstable": 2, "verdict_changed": 3, "missing": 4}
        notok.sort(key=lambda r: order.get(r.get("verdict"), 9))

        def val(r, k):
            v = r.get(k)
            return esc(fmt_bytes(v) if "bytes" in str(r.get("metric", "")) and _isnum(v) else fmt_num(v, ".4g"))

        def rows_table(rs):
            return table(["case", "metric", "baseline", "current", "change", "verdict", "detail"],
                         [[f'<span title="{esc(r.get("name"))}">{esc(short_name(r.get("name")))}</span>',
                           esc(r.get("metric")), (val(r, "baseline"), "num"),
                           (val(r, "current"), "num"), (esc(r.get("change", "")), "num"),
                           esc(r.get("verdict")), esc(r.get("detail", ""))] for r in rs],
                         [str(r.get("verdict", "")) for r in rs])
        # What got worse or changed comes first; improvements fold under a count per metric (many at once,
        # e.g. a thread count that allocates less, would push the claims off the first screen); what is
        # only listed (not compared, new, order-dependent errors) folds last.
        first = [r for r in notok if r.get("verdict") in order and r.get("verdict") != "improved"]
        better = [r for r in notok if r.get("verdict") == "improved"]
        rest = [r for r in notok if r.get("verdict") not in order]
        out.append(rows_table(first) if first else "<p>No regressions or changed verdicts.</p>")
        if better:
            per = {}
            for r in better:
                per[r.get("metric", "?")] = per.get(r.get("metric", "?"), 0) + 1
            what = ", ".join(f"{m}: {n}" for m, n in sorted(per.items(), key=lambda kv: -kv[1]))
            out.append(f"<details{' open' if len(better) <= 5 else ''}><summary>{len(better)} improvement"
                       f"{'s' if len(better) != 1 else ''} ({esc(what)})</summary>" + rows_table(better) + "</details>")
        if rest:
            out.append(f"<details><summary>{len(rest)} more rows listed but not gated (new cases and metrics, "
                       "not compared, order-dependent errors)</summary>" + rows_table(rest) + "</details>")
    else:
        out.append("<p>All compared rows are ok.</p>")
    out.append("</section>")
    return "\n".join(out)


def throughput_cell(c):
    if _isnum(c.counters.get("tflops")):
        s = fmt_si(c.counters["tflops"] * 1e12, "FLOP/s")
        if _isnum(c.counters.get("tokens_per_s")):
            s += f", {fmt_num(c.counters['tokens_per_s'], '.4g')} tokens/s"
    elif _isnum(c.counters.get("gbytes_per_s")):
        s = fmt_si(c.counters["gbytes_per_s"] * 1e9, "B/s")
    else:
        return "—"
    def above(k):
        # A memory ceiling is passed when the bytes did not all come from DRAM (no cache flush before the
        # call: the working set fits a large last-level cache) or when the probe ran under load.
        if k in ("frac_of_copy_ceiling", "frac_of_read_ceiling") and c.counters.get("cold_cache") != 1:
            return " (above the ceiling: some bytes came from cache, or the probe ran under load)"
        return " (above the ceiling: it was probed under load)"
    def frac_label(k):
        return "the flushes' read rate" if k == "frac_of_flush_read" else k[len('frac_of_'):].replace('_ceiling', '') + " ceiling"
    fracs = [f"{fmt_num(v * 100)}% of {frac_label(k)}" + (above(k) if v > 1.05 and k != "frac_of_flush_read" else "")
             for k, v in c.counters.items() if k.startswith("frac_of_") and _isnum(v)]
    return esc(s) + "".join(f"<br><span class='muted nowrap'>{esc(f)}</span>" for f in fracs)


def err_cell(c, key):
    s = fmt_num(c.counters.get(key), ".2e")
    if key == "rel_l2_err":
        for k in ("nan_count", "inf_count"):
            if c.counters.get(k):
                s += f" ({c.counters[k]:g} {k.split('_')[0]})"
    return (esc(s), "num")


def varying_params(cases):
    keys = {k for c in cases for k in c.params}
    return [k for k in sorted(keys) if len({json.dumps(c.params.get(k), sort_keys=True) for c in cases}) > 1]


def case_label(c, varying):
    """The parameters that vary within the technique (short); the full case id on hover."""
    short = " ".join(f"{k}={c.params[k]}" for k in varying if k in c.params)
    if not short:  # one case: its first parameters
        short = short_name(c.case_id)
        short = short if len(short) <= 40 else short[:40] + "…"
    return f'<span title="{esc(c.case_id)}">{esc(short)}</span>'


def cases_table(series, varying):
    rows = []
    for label, lst in series.items():
        for c in lst:
            st = esc(c.status) + (f": {esc(c.detail)}" if c.detail else "")
            t = c.median_time
            t_html = esc(fmt_seconds(t)) + (f" <span class='muted'>(n={len(c.times)})</span>" if t else "")
            noise = c.timing_noise
            if noise:
                t_html = f'<span class="noisy" title="{esc(noise)}">{t_html} noisy</span>'

            rows.append([case_label(c, varying), esc(c.impl), esc(c.role), esc(c.backend), (st, f"st-{esc(c.status)}"),
                         (esc(fmt_bytes(c.counters.get("peak_bytes"))), "num"),
                         (esc(fmt_bytes(c.counters.get("peak_extra_bytes"))), "num"),
                         (esc(fmt_bytes(c.counters.get("untracked_bytes"))), "num"),
                         (t_html, "num"), throughput_cell(c),
                         err_cell(c, "max_abs_err"), err_cell(c, "rel_l2_err")])
    return table(["case", "impl", "role", "backend", "status", "peak bytes", "extra bytes",
                  "untracked heap", "median time", "throughput", "max_abs_err", "rel_l2_err"], rows)


# Technique-specific figures shown in a second table when any case of the technique has them.
DOMAIN_COUNTERS = [
    ("tokens_per_s", "tokens/s", ".4g"), ("val_loss", "val loss", ".5g"),
    ("val_loss_pretrained", "val loss before fine-tuning", ".5g"), ("trainable_params", "trainable params", "g"),
    ("base_decode_s", "base decode s/step", ".3g"),
    ("val_loss_rel_delta_vs_fp32", "val loss vs fp32", "+.3%"), ("perplexity", "perplexity", ".5g"),
    ("perplexity_rel_delta", "perplexity vs fp32", "+.3%"),
    ("model_state_bytes_per_param", "state B/param", ".3g"), ("skipped_steps", "skipped steps", "g"),
    ("loss_scale_final", "final loss scale", "g"), ("grad_underflow_fp16", "fp16 underflow", ".2e"),
    ("diverged", "diverged", "g"), ("bits_per_weight", "bits/weight", ".4g"), ("weight_bytes", "weight bytes", "bytes"),
    ("weight_rel_l2_err", "weight rel L2", ".2e"), ("calib_output_mse", "calib. output MSE", ".3e"),
    ("frac_of_copy_ceiling", "of copy bandwidth", ".1%"), ("frac_of_read_ceiling", "of read bandwidth", ".1%"),
    ("frac_of_flush_read", "of the flushes' read rate", ".1%"),
    ("kv_bytes_per_token", "KV bytes/token", "bytes"), ("weight_bytes_read", "weight bytes/token", "bytes"),
    ("memory_at_2k_tokens", "memory at 2K tokens", "bytes"), ("memory_at_8k_tokens", "memory at 8K tokens", "bytes"),
    ("kv_utilization", "KV utilization", ".1%"), ("kv_budget_utilization", "budget holding tokens", ".1%"),
    ("kv_internal_frag", "internal frag.", ".1%"), ("kv_external_frag", "external frag.", ".1%"),
    ("mean_concurrency", "mean batch", ".3g"), ("max_concurrency", "max batch", "g"),
    ("preemptions", "preemptions", "g"), ("decode_tokens_per_step", "tokens/step", ".4g"),
    ("peak_bytes_activations", "activations peak", "bytes"), ("recomputed_layers", "recomputed layers", "g"),
    ("recompute_flops_fraction", "recompute FLOPs", ".1%"),
    ("grad_values_differ_vs_reference", "grad values != reference", "g"),
    ("grad_rel_diff_vs_reference", "grad rel. diff", ".2e"),
    ("mean_of_means_grad_rel_err", "mean-of-means grad err", ".2e"),
    ("host_model_state_bytes_per_param", "host state B/param", ".3g"),
    ("offload_bytes_to_host", "to host/step", "bytes"), ("offload_bytes_to_device", "to device/step", "bytes"),
    ("offload_host_optimizer_s", "host optimizer s", ".3g"),
    ("offload_modelled_pcie4_s", "copies at 25 GB/s (modelled) s", ".3g"),
]


def figures_table(series, varying):
    cases = [c for lst in series.values() for c in lst if c.ok]
    keys = [k for k in DOMAIN_COUNTERS if any(_isnum(c.counters.get(k[0])) for c in cases)]
    if not keys:
        return ""

    def cell(c, key, spec):
        v = c.counters.get(key)
        if not _isnum(v):
            return ("—", "num")
        return (esc(fmt_bytes(v) if spec == "bytes" else format(v, spec)), "num")

    rows = [[case_label(c, varying), esc(c.impl), esc(c.backend)] + [cell(c, k, spec) for k, _, spec in keys]
            for c in cases]
    return table(["case", "impl", "backend"] + [label for _, label, _ in keys], rows)


def curves_plot(series, colors, tech, prefix, title, ylabel, log):
    """Per-step curves stored as counters <prefix><step> (e.g. the training loss), one line per case."""
    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    n = 0
    for label, lst in series.items():
        for c in lst:
            pts = sorted((int(k[len(prefix):]), v) for k, v in c.counters.items()
                         if k.startswith(prefix) and _isnum(v))
            if len(pts) < 2:
                continue
            lab = label if len(lst) == 1 else f"{label} {c.case_id}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=lab, color=colors.get(label))
            n += 1
    if n == 0:
        plt.close(fig)
        return None
    if log:
        ax.set_yscale("log", base=2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{tech}: {title}")
    ax.grid(True, alpha=0.3)
    place_legend(fig, ax, n)
    return fig_to_img(fig, f"{tech} {title}")


def technique_section(tech, path, results, cases):
    x_param, x_label = x_info(results, tech, cases)
    # Two suites of one technique may sweep different parameters (quant_model's trained model over dim,
    # SmolLM2 over seq): a case whose suite sweeps another one has no place on this x axis.
    suites = results["context"].get("memtrade", {}).get("suites", {}) or {}
    for c in cases:
        xp = (suites.get(c.suite) or {}).get("x_param") if isinstance(suites.get(c.suite), dict) else None
        if xp and xp != x_param:
            c.x = None
    series = build_series(cases, x_param)
    colors = series_colors(list(series))
    facets = facet_cases(cases, x_param)
    icolors = impl_colors({lab for f in facets.values() for lab in f})
    nonok = [c for c in cases if not c.ok]
    figs, wide = [], []
    n_x = len({c.x for c in cases if c.x is not None})
    # A sweep needs a panel with a line: some implementation ok at two or more values of x in one panel
    # (kvcache_model's quick cases run each configuration at one length: eleven panels of single points).
    lines = any(len({c.x for c in lst if c.ok and c.x is not None}) >= 2 for f in facets.values() for lst in f.values())
    if n_x >= 2 and lines and len(facets) <= 12:
        # Sweeps: memory, time and error against x, one panel per combination of the other parameters.
        for fn, title, ylabel, kind, cap, eb in (
                (lambda c: c.counters.get("peak_bytes"), f"{tech}: peak memory", "peak memory (log2)", "bytes",
                 "Peak bytes held during one iteration (io + workspace), from the tracked allocator.", None),
                (lambda c: c.median_time, f"{tech}: median time", "median time per iteration (log)", "seconds",
                 "Median real time over repetitions; bars span min..max.", lambda c: c.times),
                (lambda c: c.counters.get("rel_l2_err"), f"{tech}: numeric error", "relative L2 error vs the "
                 "float64 reference (log)", "plain", "rel_l2_err against the float64 oracle (0 and NaN are not "
                 "drawn on a log axis; see the table).", None)):
            img, note = facet_figure(facets, icolors, x_label, fn, title, ylabel, kind, errbars=eb)
            if img:
                wide.append(figure(esc(cap + (" " + note if note else "")), img))
    if tech not in SIMULATED and len(facets) <= 12 and (n_x >= 2 or len({c.impl for c in cases if c.ok}) >= 2):
        # Memory against time where there is a sweep, or several implementations of one size.
        img, cap = tradeoff_plot(facets, icolors, x_param)
        figs.append(figure(cap, img) if img else f"<p class='note'>{esc(cap)}</p>")
    figs += SPECIAL_FIGURES.get(tech, lambda _: [])(cases)
    img = curves_plot(series, colors, tech, "curve_loss_step_", "training loss", "training loss (nats per byte)", False)
    if img:
        figs.append(figure("Training loss of the step's batch, sampled at 40 points of the run.", img))
    img = curves_plot(series, colors, tech, "curve_scale_step_", "loss scale", "loss scale (log2)", True)
    if img:
        figs.append(figure("Dynamic loss scale (1 where the policy does not scale).", img))
    desc = "; ".join(esc((s or {}).get("description", "")) for s in
                     (results["context"].get("memtrade", {}).get("suites", {}) or {}).values()
                     if (s or {}).get("technique") == tech)
    out = [f'<section id="tech-{esc(tech)}"><h2>Technique: {esc(tech)}</h2>',
           f"<p class='muted'>{desc} &nbsp; data: {esc(path)} &nbsp; x = {esc(x_param)}</p>"]
    if nonok:
        out.append(f"<p class='note'>{len(nonok)} case(s) did not produce measurements "
                   f"({esc(', '.join(sorted({c.status for c in nonok})))}); they are omitted from "
                   "plots and listed in the table.</p>")
    if not any(c.ok for c in cases):
        out.append("<p class='warn'>No ok cases for this technique; nothing to plot.</p>")
    out.append('<div class="plots wide">' + "\n".join(wide) + "</div>" if wide else "")
    out.append('<div class="plots">' + "\n".join(f for f in figs if f) + "</div>")
    out.append(peers_table(cases))
    varying = varying_params(cases)
    noisy = [c for c in cases if c.ok and c.timing_noise]
    if noisy:
        out.append(f"<p class='warn'>{len(noisy)} of {sum(c.ok for c in cases)} timings are noisy (repetitions "
                   f"spread over {100 * NOISY_CV:.0f}% or a repetition was pre-empted); they are marked in the "
                   "table. Compare times only across runs (memtrade ab).</p>")
    out.append(f"<details><summary>All {len(cases)} cases of {esc(tech)}: status, memory, time, throughput, "
               f"error</summary>" + cases_table(series, varying) + "</details>")
    extra = figures_table(series, varying)
    if extra:
        out.append(f"<details{' open' if len(cases) <= 12 else ''}><summary>{esc(tech)}'s own figures per case"
                   "</summary>" + extra + "</details>")
    out.append("</section>")
    return "\n".join(out)


def claims_section(all_results, paths):
    merged = {}
    for i, res in enumerate(all_results):
        for cl in res.get("claims") or []:
            if isinstance(cl, dict):
                band = cl.get("band")
                form = cl.get("quantity", "") or ""
                if isinstance(band, list) and len(band) == 2:
                    lo, hi = band
                    form += (f"; band [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]")
                if cl.get("conditions"):
                    form += f"; {cl['conditions']}"
                key = tuple(str(cl.get(k, "")) for k in ("id", "statement", "source", "measured",
                                                          "expected", "verdict", "note")) + (form,)
                merged.setdefault(key, []).append(f"#{i + 1}")
    out = ['<section id="claims"><h2>Claims</h2>']
    if not merged:
        out.append("<p>The suites run carry no claims.</p></section>")
        return "\n".join(out)
    multi = len(paths) > 1
    rows = []
    for key, files in merged.items():
        cid, stmt, src, meas, exp, verdict, note, form = key
        how = (f"<details><summary class='muted'>how it is decided</summary><p>{esc(form or exp)}</p>"
               + (f"<p class='muted'>{esc(note)}</p>" if note else "") + "</details>")
        # Nothing measured (out of scope, or a check that failed): the reason is what the reader needs here.
        shown = esc(meas) if meas else f"<span class='muted'>{esc(note)}</span>"
        row = [esc(cid), esc(stmt) + how, esc(src), shown, (esc(verdict.replace("_", " ")), f"v-{esc(verdict)}")]
        rows.append(row + ([esc(", ".join(files))] if multi else []))
    out.insert(1, "<p class='muted'>Each claim is decided on its measurable form: reproduced when the measured "
                  "interval lies inside the band, not reproduced when it lies outside, inconclusive when it "
                  "straddles an edge (noise, or a model too small to show the effect); out of scope is what "
                  "memtrade does not measure, error a check that failed.</p>")
    counts = {}
    for key in merged:
        counts[key[5]] = counts.get(key[5], 0) + 1
    out.insert(1, "<p><b>" + esc(", ".join(f"{n} {v.replace('_', ' ')}" for v, n in sorted(counts.items()))) + "</b></p>")
    out.append(table(["claim", "statement", "source", "measured", "verdict"]
                     + (["results file"] if multi else []), rows) + "</section>")
    return "\n".join(out)


def trend_label(results, idx):
    ctx = results["context"]
    mt = ctx.get("memtrade", {}) or {}
    commit = (mt.get("git_commit") or "?")[:7] + ("+" if mt.get("git_dirty") else "")
    return f"#{idx + 1} {commit}\n{str(ctx.get('date', '?'))[:10]}"


def trend_plot(names, per_file, labels, value_fn, title, ylabel, kind):
    fig, ax = plt.subplots(figsize=(6.2, 5.2))
    allv = []
    xs = list(range(len(labels)))
    for name in names:
        vals = []
        for cases in per_file:
            c = cases.get(name)
            v = value_fn(c) if c is not None and c.ok else None
            vals.append(v if _isnum(v) and v > 0 else np.nan)
        allv += [v for v in vals if not np.isnan(v)]
        ax.plot(xs, vals, marker="o", ms=4, label=name)
    if not allv:
        plt.close(fig)
        return None
    set_log_axis(ax, "y", allv, kind)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlim(-0.3, len(labels) - 0.7)
    ax.set_xlabel("results file (commit, date) in the order given")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    fig.tight_layout()
    return fig_to_img(fig, title)


def trends_section(tech_files, all_results, all_cases, max_series=8):
    out = ['<section id="trends"><h2>Trends</h2>',
           "<p class='note'>Across results files in the order given; gaps mean the case was absent or not ok. "
           f"Up to {max_series} benchmarks per technique, those at the largest x.</p>"]
    any_plot = False
    for tech, idxs in tech_files.items():
        if len(idxs) < 2:
            continue
        per_file = [{c.name: c for c in all_cases[i] if c.technique == tech} for i in idxs]
        current = sorted(per_file[-1].values(), key=lambda c: (not c.ok, -(c.x or 0), c.name))
        names = [c.name for c in current[:max_series]]
        labels = [trend_label(all_results[i], i) for i in idxs]
        out.append(f"<h3>{esc(tech)}</h3><div class='plots'>")
        metrics = ((lambda c: c.median_time, "median time", "median time per iteration (log)", "seconds"),
                   (lambda c: c.counters.get("peak_bytes"), "peak memory", "peak memory (bytes, log2)", "bytes"))
        for fn, title, ylabel, kind in metrics:
            img = trend_plot(names, per_file, labels, fn, f"{tech}: {title} across runs", ylabel, kind)
            if img:
                out.append(figure("", img))
                any_plot = True
        out.append("</div>")
    if not any_plot:
        out.append("<p>No technique appears in two or more results files with ok measurements.</p>")
    out.append("</section>")
    return "\n".join(out)


# ---------------------------------------------------------------- main

def is_peer_file(results):
    """A results file of other libraries on memtrade's cases (scripts/peers.py)."""
    return bool((results["context"].get("memtrade") or {}).get("peers"))


def peers_table(cases):
    """memtrade's median time per case beside the fastest peer's (a ratio below 1: memtrade is faster)."""
    by_case = {}
    for c in cases:
        if c.ok and c.median_time:
            by_case.setdefault((c.suite, c.case_id, c.backend), []).append(c)
    rows = []
    for (_, case_id, backend), cs in by_case.items():
        peers = [c for c in cs if c.role == "peer"]
        if not peers:
            continue
        best = min(peers, key=lambda c: c.median_time)
        for c in cs:
            if c.role != "peer":
                r = c.median_time / best.median_time
                rows.append((r, [esc(case_id), esc(backend), esc(c.impl), fmt_seconds(c.median_time), esc(best.impl),
                                 fmt_seconds(best.median_time), f"{r:.2f}"]))
    if not rows:
        return ""
    faster = sum(1 for r, _ in rows if r < 1)
    return (f"<details open><summary>Against peers: {faster} of {len(rows)} implementation-cases faster than the "
            "fastest peer</summary><p class='note'>Median time per call, memtrade's implementation over the "
            "fastest peer on the same case (below 1: memtrade is faster). Peers come from scripts/peers.py on the "
            "same machine; compare ratios only within one machine.</p>"
            + table(["case", "backend", "implementation", "median time", "fastest peer", "peer time", "ratio"],
                    [cells for _, cells in rows]) + "</details>")


def build_report(paths, all_results, compare=None, compare_path=None, baseline=None, baseline_path=None):
    # Peer files (other libraries on the same cases) join the technique sections of the other files.
    peer_cases = []
    if any(not is_peer_file(r) for r in all_results):
        peer_cases = [c for r in all_results if is_peer_file(r) for c in collect_cases(r)]
        keep = [i for i, r in enumerate(all_results) if not is_peer_file(r)]
        paths, all_results = [paths[i] for i in keep], [all_results[i] for i in keep]
    all_cases = [collect_cases(r) for r in all_results]
    tech_files = {}  # technique -> indices of files containing it (given order)
    for i, cases in enumerate(all_cases):
        for t in dict.fromkeys(c.technique for c in cases):
            tech_files.setdefault(t, []).append(i)
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    nav = ['<a href="#summary">Summary</a>', '<a href="#claims">Claims</a>', '<a href="#context">Run context</a>']
    nav += [f'<a href="#tech-{esc(t)}">{esc(t)}</a>' for t in tech_files]
    nav += ['<a href="#trends">Trends</a>'] if len(paths) > 1 else []
    if compare is not None:
        nav.insert(1, '<a href="#regressions">Regressions</a>')
    body = [f"<h1>memtrade report</h1><p class='muted'>Generated {esc(now)} from {len(paths)} results "
            f"file(s). Per-technique plots use the last file containing the technique.</p>",
            "<nav>" + "".join(nav) + "</nav>",
            '<section id="summary">' + glance_table(all_results[-1], paths[-1], baseline, baseline_path) + "</section>"]
    if compare is not None:
        body.append(compare_section(compare, compare_path))
    # Claims belong to the top screen: what changed, then which claims hold.
    body.append(claims_section(all_results, paths))
    cur_idx = {t: idxs[-1] for t, idxs in tech_files.items()}
    body.append('<section id="context"><h2>Run context</h2><div class="ctx-wrap">'
                + "".join(context_table(i, p, r, i == len(paths) - 1 or i in cur_idx.values())
                          for i, (p, r) in enumerate(zip(paths, all_results))) + "</div></section>")
    if not tech_files:
        body.append("<p class='warn'>The results contain no benchmark entries.</p>")
    for tech, i in cur_idx.items():
        cases = [c for c in all_cases[i] if c.technique == tech]
        backends = {c.backend for c in cases}
        cases += [c for c in peer_cases if c.technique == tech and c.backend in backends]
        body.append(technique_section(tech, paths[i], all_results[i], cases))
    if len(paths) > 1:
        body.append(trends_section(tech_files, all_results, all_cases))
    return render_page("memtrade report", "\n".join(body))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Render memtrade results JSON as a self-contained HTML report.")
    ap.add_argument("results", nargs="+", help="results JSON file(s); the last is 'current'")
    ap.add_argument("--compare", help="JSON from `memtrade compare --json`")
    ap.add_argument("--baseline-results", help="the baseline's results file (its run context is shown beside the current one)")
    ap.add_argument("-o", "--output", required=True, help="output HTML path")
    args = ap.parse_args(argv)
    try:
        all_results = [load_results(p) for p in args.results]
        compare = load_json(args.compare, "compare") if args.compare else None
        if compare is not None and not isinstance(compare.get("rows", []), list):
            raise ReportError(f"compare file '{args.compare}' has a \"rows\" field that is not a list")
        baseline = load_results(args.baseline_results) if args.baseline_results else None
        page = build_report(args.results, all_results, compare, args.compare, baseline, args.baseline_results)
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(page)
        except OSError as e:
            raise ReportError(f"cannot write output '{args.output}': {e.strerror}") from None
    except ReportError as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        return 2
    nplots = page.count('<img class="plot"')
    print(f"report.py: wrote {args.output} ({len(page) / 1024:.0f} KiB, {nplots} plots)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
