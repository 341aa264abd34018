#!/usr/bin/env python3
"""PyTorch on memtrade's cases: a results file with the same case names and a `peer` role.

    scripts/peers.py --suite attention,gemm,quant --profile quick --out build/peers.json \\
        [--against results.json]

The cases are the ones `memtrade run --list` names for the suite and profile (so the names match), timed
as memtrade times them: the suite profile's repetitions, each running the call until min_time_s has
passed, real time per call. Implementations (each a `peer` record; cases they do not cover get none):
  attention  torch-sdpa-<backend> for every SDPA backend this build has on the device (flash, math, on the
             CPU; flash, efficient, cudnn, math on CUDA), forward or forward + backward as the case says
  gemm       torch-mm
  quant      torch-mv (fp32 and bf16 weights: torch.mv / torch.mm), torch-dynamic-int8 (int8 weights:
             torch.ao dynamic quantization, fbgemm's int8 Linear), with cold caches as memtrade times them
  precision  torch-fp32, torch-bf16-autocast: one training step of the same Llama configuration through
             transformers' LlamaForCausalLM (SDPA attention, torch.optim.AdamW), from a fresh model
  cpu_adam   torch-adamw-fused, torch-adamw-foreach: torch.optim.AdamW's step over the n fp32 parameters (cold);
             with a 16-bit grad_dtype the gradient widened into fp32 first and the weights narrowed after
  kvcache    torch-sdpa-<backend>: one decode step (a query token per request and head; a KV head's query heads
             folded into the query length) over the context's keys and values in the cache's dtype (fp32, bf16,
             fp16), contiguous, cold
Not covered: the 4- and 8-bit float formats and the quantized KV caches (PyTorch has no CPU kernel for them).
--against prints memtrade's median time over the peer's for every case both ran. `memtrade report
results.json peers.json` plots the peers beside memtrade's implementations. PyTorch is an optional
dependency: scripts/install_peers.sh.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PeerError(Exception):
    pass


def parse_value(v):
    if v in ("true", "false"):
        return v == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def list_cases(memtrade, suites_dir, suite, profile, backend):
    """(case_id, params) of every case memtrade would run, in its order."""
    cmd = [memtrade, "run", "--suites-dir", suites_dir, "--suite", suite, "--profile", profile, "--backend", backend,
           "--list"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise PeerError(f"cannot list the cases of suite '{suite}' with {memtrade}: {e}") from None
    cases = {}
    for line in out.splitlines():
        parts = line.strip().split("/")
        if len(parts) < 3 or line.endswith(")") != (backend != "cpu"):
            continue
        cases.setdefault(parts[1], {k: parse_value(v) for k, v in (kv.split("=", 1) for kv in parts[1].split(","))})
    return list(cases.items())


def suite_file(suites_dir, suite):
    path = os.path.join(suites_dir, suite + ".json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PeerError(f"cannot read suite file {path}: {e}") from None


COLD_CALLS = 10  # memtrade's runner: cold-cache repetitions time a fixed number of calls


def llc_bytes():
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            v = f.read().strip()
        return int(v[:-1]) * {"K": 1 << 10, "M": 1 << 20}[v[-1]] if v[-1] in "KM" else int(v)
    except (OSError, ValueError, KeyError, IndexError):
        return 32 << 20


def time_call(torch, fn, repetitions, min_time_s, sync, cold=False, gpu=False):
    """(calls per repetition, per-call real and CPU time of each repetition in ns, flush read rate in bytes/s
    or None), as memtrade's harness measures them: with `cold`, each of COLD_CALLS calls per repetition
    follows a read of twice the last-level cache (on the GPU: of twice the L2, and the call timed by CUDA
    events), outside the timed region (memtrade's Work::cold_cache, for the memory-bound kernels). On the
    CPU the reads are timed, as memtrade's CacheFlush times its own: their median rate says how fast memory
    delivered around the calls, which on some machines changes from one second to the next."""
    fn()
    sync()
    if cold and gpu:
        # On the GPU as memtrade's CudaDevice does it: read (not write: no dirty lines to drain inside the
        # timed call) a device buffer of twice the L2 size, then time each call with CUDA events.
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (64 << 20)
        scratch = torch.ones(2 * l2 // 4, device="cuda")
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = []
        for _ in range(repetitions):
            real = cpu = 0.0
            for _ in range(COLD_CALLS):
                scratch.sum()
                sync()
                c = time.thread_time()
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                real, cpu = real + start.elapsed_time(stop) * 1e-3, cpu + time.thread_time() - c
            reps.append((real / COLD_CALLS * 1e9, cpu / COLD_CALLS * 1e9))
        return COLD_CALLS, reps, None
    if cold:
        floats = 2 * llc_bytes() // 4
        scratch = torch.ones(floats)
        reps, rates = [], []
        for _ in range(repetitions):
            real = cpu = 0.0
            for _ in range(COLD_CALLS):
                f = time.perf_counter()
                scratch.sum()  # read, not written: no dirty lines to drain inside the timed call
                sync()
                rates.append(4 * floats / max(time.perf_counter() - f, 1e-12))
                t, c = time.perf_counter(), time.thread_time()
                fn()
                sync()
                real, cpu = real + time.perf_counter() - t, cpu + time.thread_time() - c
            reps.append((real / COLD_CALLS * 1e9, cpu / COLD_CALLS * 1e9))
        return COLD_CALLS, reps, statistics.median(rates)
    iters = 1
    while True:  # calls per repetition: enough for min_time_s
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        dt = time.perf_counter() - t
        if dt >= min_time_s or iters >= 1 << 20:
            break
        iters = max(iters * 2, int(iters * min_time_s / max(dt, 1e-9) * 1.2))
    reps = []
    for _ in range(repetitions):
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(iters):
            fn()
        sync()
        reps.append(((time.perf_counter() - t) / iters * 1e9, (time.thread_time() - c) / iters * 1e9))
    return iters, reps, None


# ---------------------------------------------------------------- the peers of each technique

def sdpa_backends(device):
    """(record name, backend) of every SDPA backend the device has: flash and math on the CPU; flash,
    efficient, cuDNN and math on CUDA."""
    from torch.nn.attention import SDPBackend
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    if device == "cuda":
        backends[1:1] = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    return [("torch-sdpa-" + be.name.lower().replace("_attention", ""), be) for be in backends]


def attention_peers(torch, p, device, dtype_of):
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F
    b, h, n, d = p.get("b", 1), p["h"], p["n"], p["d"]
    h_kv, n_kv = p.get("h_kv", h), p.get("n_kv", n)
    causal, backward = p.get("causal", False), p.get("pass", "fwd") == "fwd_bwd"
    dt = dtype_of(p.get("dtype", "fp32"))
    flops = 4.0 * b * h * n * n_kv * d * (0.5 if causal else 1.0) * (3.5 if backward else 1.0)
    if causal and n != n_kv:
        return [], "torch aligns the causal mask top left, memtrade bottom right: not the same computation"
    g = torch.Generator(device="cpu").manual_seed(1)
    q, k, v, dout = (torch.randn(*shape, generator=g).to(device=device, dtype=dt)
                     for shape in ((b, h, n, d), (b, h_kv, n_kv, d), (b, h_kv, n_kv, d), (b, h, n, d)))
    for t in (q, k, v):
        t.requires_grad_(backward)
    out = []
    for name, be in sdpa_backends(device):
        def call(be=be):
            with sdpa_kernel(be):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h_kv != h)
            if backward:
                for t in (q, k, v):
                    t.grad = None
                o.backward(dout)
        out.append((name, call, {"flops": flops}))
    return out, ""


def gemm_peers(torch, p, device, dtype_of):
    n = p["n"]
    dt = dtype_of(p.get("dtype", "fp32"))
    g = torch.Generator(device="cpu").manual_seed(1)
    a, bm = (torch.randn(n, n, generator=g).to(device=device, dtype=dt) for _ in range(2))
    return [("torch-mm", lambda: torch.mm(a, bm), {"flops": 2.0 * n ** 3})], ""


def quant_peers(torch, p, device, dtype_of):
    n, k, m, fmt = p["n"], p["k"], p.get("m", 1), p["format"]
    g = torch.Generator(device="cpu").manual_seed(1)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    x = torch.randn(m, k, generator=g)
    flops = 2.0 * n * k * m
    if fmt in ("fp32", "bf16"):
        dt = dtype_of(fmt)
        wd, xd = w.to(device=device, dtype=dt), x.to(device=device, dtype=dt)
        fn = (lambda: torch.mv(wd, xd[0])) if m == 1 else (lambda: torch.mm(xd, wd.t()))
        return [("torch-mv", fn, {"flops": flops, "weight_bytes": n * k * (4 if fmt == "fp32" else 2), "cold": True,
                                  "read_stream": True})], ""
    if fmt == "int8" and device == "cpu":
        lin = torch.nn.Linear(k, n, bias=False)
        with torch.no_grad():
            lin.weight.copy_(w)
        qlin = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
        with torch.no_grad():
            qlin(x)

        def call():
            with torch.no_grad():
                qlin(x)
        return [("torch-dynamic-int8", call, {"flops": flops, "weight_bytes": n * k + 4 * n, "cold": True,
                                              "read_stream": True})], ""
    return [], f"no PyTorch {device} kernel for format {fmt}"


def train_peers(torch, p, device, dtype_of):
    """One training step (forward, cross-entropy, backward, AdamW) of the same Llama through transformers."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return [], "transformers is not installed (scripts/install_peers.sh)"
    torch.manual_seed(p.get("seed", 1))
    cfg = LlamaConfig(vocab_size=p.get("vocab", 256), hidden_size=p["dim"], intermediate_size=p["ffn"],
                      num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
                      num_key_value_heads=p.get("kv_heads", p["heads"]), max_position_embeddings=p["context"],
                      rms_norm_eps=p.get("norm_eps", 1e-5), rope_theta=p.get("rope_theta", 10000.0),
                      tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    model = LlamaForCausalLM(cfg).to(device)
    model.config._attn_implementation = "sdpa"
    opt = torch.optim.AdamW(model.parameters(), lr=p.get("lr", 1e-3), weight_decay=0.1)
    ids = torch.randint(0, cfg.vocab_size, (p["batch"], p["context"]), device=device)
    params = sum(x.numel() for x in model.parameters())
    tokens = p["batch"] * (p["context"] - 1)
    flops = 6.0 * params * tokens  # the dense count; memtrade's own counter adds attention's

    def step(dtype):
        def call():
            with torch.autocast(device_type=device, dtype=dtype, enabled=dtype is not None):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return call
    return [("torch-fp32", step(None), {"flops": flops}),
            ("torch-bf16-autocast", step(torch.bfloat16), {"flops": flops})], ""


def adam_peers(torch, p, device, dtype_of):
    """ZeRO-Offload's host optimizer step: PyTorch's AdamW over one tensor of n fp32 parameters. With a 16-bit
    grad_dtype the 16-bit gradient is widened into the fp32 one first and the updated weights narrowed into a
    16-bit copy after: the work memtrade's cpu_adam fuses into one pass."""
    n, gname = p["n"], p.get("grad_dtype", "fp32")
    narrow = gname != "fp32"
    g = torch.Generator(device="cpu").manual_seed(1)
    param = torch.nn.Parameter(torch.randn(n, generator=g).to(device))
    param.grad = (torch.randn(n, generator=g) * 1e-3).to(device)
    g16 = param.grad.to(dtype_of(gname)) if narrow else None
    w16 = torch.empty(n, dtype=dtype_of(gname), device=device) if narrow else None
    # bytes moved, counted as memtrade's cpu_adam counts them: master, m and v read and written, the gradient
    # read and the working weights written, in grad_dtype
    gb = 2 if narrow else 4
    moved = n * (3 * 8 + 2 * gb)

    def make(**kw):
        opt = []

        def call():
            if not opt:  # built at the first call, so that an unsupported variant is a skipped record
                opt.append(torch.optim.AdamW([param], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **kw))
            with torch.no_grad():
                if narrow:
                    param.grad.copy_(g16)
                opt[0].step()
                if narrow:
                    w16.copy_(param)
        return call
    # cold, as memtrade times cpu_adam: in training the forward and backward evict the optimizer state
    return [("torch-adamw-fused", make(fused=True), {"weight_bytes": moved, "cold": True}),
            ("torch-adamw-foreach", make(foreach=True), {"weight_bytes": moved, "cold": True})], ""


def kvcache_peers(torch, p, device, dtype_of):
    """One decode step's attention over a cache: a query token per request and head against the request's
    context of keys and values, through scaled_dot_product_attention with each SDPA backend of the device,
    the K/V tensors in the cache's dtype, laid out as a contiguous cache is. The query heads that share a KV
    head (GQA) are folded into the query length, [batch, kv_heads, group, head_dim]: for one decode token
    (no mask) the same computation, without the copies of K and V per query head that enable_gqa makes on
    the CPU. Cold, as memtrade times the kvcache suite: at a decode step the cache comes from memory."""
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F
    kv_dtype = p.get("kv_dtype", "fp32")
    if kv_dtype not in ("fp32", "bf16", "fp16"):
        return [], f"PyTorch has no {kv_dtype} KV cache attention kernel"
    b, n, h, h_kv, d = p["batch"], p["context"], p["heads"], p["kv_heads"], p["head_dim"]
    dt = dtype_of(kv_dtype)
    g = torch.Generator(device="cpu").manual_seed(1)
    q = torch.randn(b, h_kv, h // h_kv, d, generator=g).to(device=device, dtype=dt)
    k, v = (torch.randn(b, h_kv, n, d, generator=g).to(device=device, dtype=dt) for _ in range(2))
    counters = {"flops": 4.0 * b * h * n * d, "weight_bytes": 2 * b * h_kv * n * d * k.element_size(), "cold": True,
                "read_stream": True}
    out = []
    for name, be in sdpa_backends(device):
        def call(be=be):
            with torch.no_grad(), sdpa_kernel(be):
                F.scaled_dot_product_attention(q, k, v)
        out.append((name, call, counters))
    return out, ""


PEERS = {"attention": attention_peers, "gemm": gemm_peers, "quant": quant_peers, "precision": train_peers,
         "cpu_adam": adam_peers, "kvcache": kvcache_peers}


# ---------------------------------------------------------------- records

def records(torch, suite, technique, x_param, case_id, params, impl, fn, counters, backend, reps_n, min_time_s, sync):
    base = {"name": f"{suite}/{case_id}/{impl}", "run_name": f"{suite}/{case_id}/{impl}", "suite": suite,
            "technique": technique, "impl": impl, "role": "peer", "backend": backend, "case_id": case_id,
            "case": params, "x": params.get(x_param), "time_unit": "ns", "threads": 1}
    try:
        iters, reps, flush_rate = time_call(torch, fn, reps_n, min_time_s, sync, cold=counters.get("cold", False),
                                gpu=backend == "cuda")
    except Exception as e:  # a backend that does not take the case (dtype, GQA, head dim) is a result
        return [{**base, "status": "skipped", "status_detail": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                 "run_type": "iteration", "repetitions": 1, "repetition_index": 0, "iterations": 0,
                 "real_time": 0.0, "cpu_time": 0.0}]
    out = []
    for i, (real, cpu) in enumerate(reps):
        e = {**base, "status": "ok", "status_detail": "", "run_type": "iteration", "repetitions": len(reps),
             "repetition_index": i, "iterations": iters, "real_time": real, "cpu_time": cpu}
        if "flops" in counters:
            e["flops"] = counters["flops"]
            e["tflops"] = counters["flops"] / (real * 1e-9) / 1e12
        if "weight_bytes" in counters:
            e["gbytes_per_s"] = counters["weight_bytes"] / (real * 1e-9) / 1e9
        if counters.get("cold"):
            e["cold_cache"] = 1
        if flush_rate:  # as memtrade's runner records them (report-only counters)
            e["flush_read_gbytes_per_s"] = flush_rate * 1e-9
            if counters.get("read_stream") and "weight_bytes" in counters:
                e["frac_of_flush_read"] = counters["weight_bytes"] / (real * 1e-9) / flush_rate
        out.append(e)
    med = statistics.median(r for r, _ in reps)
    out.append({**out[-1], "name": base["name"] + "_median", "run_type": "aggregate", "aggregate_name": "median",
                "real_time": med, "cpu_time": statistics.median(c for _, c in reps),
                **({"tflops": counters["flops"] / (med * 1e-9) / 1e12} if "flops" in counters else {})})
    return out


def against_table(peer_results, memtrade_path):
    """memtrade median / peer median per case both ran (below 1: memtrade is faster)."""
    with open(memtrade_path) as f:
        mt = json.load(f)

    def medians(res):
        times = {}
        for e in res["benchmarks"]:
            if e.get("run_type", "iteration") == "iteration" and e.get("status", "ok") == "ok" and e.get("real_time"):
                times.setdefault((e["suite"], e["case_id"], e["impl"], e.get("backend", "cpu")), []).append(e["real_time"])
        return {k: statistics.median(v) for k, v in times.items()}
    m, p = medians(mt), medians(peer_results)
    rows = []
    for (suite, case_id, impl, be), t in sorted(m.items()):
        for (ps, pc, pi, pb), pt in sorted(p.items()):
            if (ps, pc, pb) == (suite, case_id, be):
                rows.append((f"{suite}/{case_id}", impl, pi, t / pt))
    print(f"\nmemtrade / PyTorch, median time per call (below 1: memtrade faster), {len(rows)} pairs")
    w = max((len(r[0]) for r in rows), default=10)
    for case, impl, peer, ratio in rows:
        print(f"  {case:<{w}}  {impl:<10} / {peer:<20} {ratio:6.2f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True, help="comma-separated: " + ", ".join(PEERS))
    ap.add_argument("--profile", default="quick")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--memtrade", default=os.path.join(ROOT, "build", "release", "memtrade"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: OMP_NUM_THREADS, else all cores)")
    ap.add_argument("--suites-dir", default=os.path.join(ROOT, "suites"), help="where the suite files are")
    ap.add_argument("--filter", default="", help="run only cases whose id contains this text")
    ap.add_argument("--out", required=True)
    ap.add_argument("--against", help="a memtrade results file: print the memtrade / PyTorch time ratios")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("peers.py: PyTorch is not installed (scripts/install_peers.sh installs it)", file=sys.stderr)
        return 2
    try:
        if args.backend == "cuda" and not torch.cuda.is_available():
            raise PeerError("--backend cuda, but PyTorch sees no CUDA device")
        threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count()
        torch.set_num_threads(threads)
        device = "cuda" if args.backend == "cuda" else "cpu"
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

        def dtype_of(name):
            if name not in dtypes:
                raise PeerError(f"unknown dtype {name}")
            return dtypes[name]
        benchmarks, suites = [], {}
        for suite in args.suite.split(","):
            spec = suite_file(args.suites_dir, suite)
            tech = spec.get("technique", suite)
            if tech not in PEERS:
                raise PeerError(f"no peers for technique '{tech}' (suite '{suite}'); peers exist for {', '.join(PEERS)}")
            prof = (spec.get("profiles") or {}).get(args.profile)
            if prof is None:
                raise PeerError(f"suite '{suite}' has no profile '{args.profile}'")
            suites[suite] = {"technique": tech, "x_param": spec.get("x_param"), "x_label": spec.get("x_label")}
            for case_id, params in list_cases(args.memtrade, args.suites_dir, suite, args.profile, args.backend):
                if args.filter and args.filter not in case_id:
                    continue
                impls, why = PEERS[tech](torch, params, device, dtype_of)
                if not impls:
                    print(f"  {suite}/{case_id}: no peer ({why})")
                for impl, fn, counters in impls:
                    recs = records(torch, suite, tech, spec.get("x_param"), case_id, params, impl, fn, counters,
                                   args.backend, prof.get("repetitions", 5), prof.get("min_time_s", 0.02), sync)
                    benchmarks += recs
                    med = [r for r in recs if r.get("aggregate_name") == "median"]
                    shown = f"{med[0]['real_time'] / 1e6:9.3f} ms" if med else recs[0]["status_detail"]
                    print(f"  {suite}/{case_id}/{impl}: {shown}", flush=True)
        ctx = {"date": datetime.datetime.now().astimezone().isoformat(), "host_name": platform.node(),
               "num_cpus": os.cpu_count(), "executable": "scripts/peers.py",
               "memtrade": {"peers": True, "peer": f"torch {torch.__version__}", "threads": threads,
                            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "profile": args.profile,
                            "backend": args.backend, "suites": suites,
                            "gpu": torch.cuda.get_device_name() if device == "cuda" else None}}
        result = {"context": ctx, "benchmarks": benchmarks}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"peers.py: wrote {args.out} ({sum(1 for b in benchmarks if b.get('run_type') == 'iteration')} entries)")
        if args.against:
            against_table(result, args.against)
    except PeerError as e:
        print(f"peers.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
