#!/usr/bin/python3
"""qattn's fused integer attention against PyTorch attention on the CPU, timed in one run.

PyTorch side (Debian's python3-torch 1.13): softmax(Q K^T / sqrt(d)) V for one head, [L, d] operands, every output
preallocated (matmul(out=...), then an in-place max-subtract, exp, divide on S), at the same thread count:
  - fp32: the two matmuls go to the BLAS that libblas.so.3 resolves to (printed; OpenBLAS is the fair one, the
    reference BLAS is about 20x slower);
  - bf16: the same on bfloat16 tensors (oneDNN's bf16 GEMM where PyTorch dispatches to it).
qattn side: `qattn bench --rows fused --format json` at the same L, d and threads, started from this script so both
run in the same few minutes. Each figure is a median over --reps runs after one warm-up.

Writes a Markdown table of medians and the ratios torch / qattn to stdout (or --out). A program, not a test.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def die(msg):
    print(f"bench_vs_torch: {msg}", file=sys.stderr)
    sys.exit(2)


def blas_name():
    """Where libblas.so.3 points (Debian's alternatives), which is what PyTorch's generic BLAS binding loads."""
    for link in ("/etc/alternatives/libblas.so.3-x86_64-linux-gnu", "/etc/alternatives/libblas.so.3-aarch64-linux-gnu"):
        if os.path.exists(link):
            target = os.path.realpath(link)
            if "openblas-openmp" in target:
                return f"OpenBLAS (OpenMP) via {target}"
            if "openblas-pthread" in target:
                return f"OpenBLAS (pthreads) via {target}"
            if "/blas/" in target:
                return f"reference BLAS via {target} (about 20x slower than OpenBLAS: not a fair baseline)"
            return target
    return "unknown (no libblas.so.3 alternative)"


def median_ms(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_attention(torch, L, d, dtype, threads, reps):
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(L, d, generator=g).to(dtype)
    k = torch.randn(L, d, generator=g).to(dtype)
    v = torch.randn(L, d, generator=g).to(dtype)
    kt = k.t().contiguous()
    s = torch.empty(L, L, dtype=dtype)
    o = torch.empty(L, d, dtype=dtype)
    m = torch.empty(L, 1, dtype=dtype)
    z = torch.empty(L, 1, dtype=dtype)
    scale = 1.0 / d ** 0.5

    def run():
        torch.matmul(q, kt, out=s)
        s.mul_(scale)
        torch.amax(s, dim=1, keepdim=True, out=m)
        s.sub_(m).exp_()
        torch.sum(s, dim=1, keepdim=True, out=z)
        s.div_(z)
        torch.matmul(s, v, out=o)

    with torch.no_grad():
        return median_ms(run, reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qattn", default="build-release/qattn", help="path of the qattn program")
    ap.add_argument("--L", default="4096", help="comma-separated sequence lengths")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--threads", default="1", help="comma-separated thread counts")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", help="write the table here instead of stdout")
    a = ap.parse_args()
    try:
        lengths = [int(x) for x in a.L.split(",")]
        threads = [int(x) for x in a.threads.split(",")]
    except ValueError:
        die("--L and --threads take comma-separated integers")
    if min(lengths) < 1 or min(threads) < 1 or a.d < 1 or a.reps < 1:
        die("--L, --d, --threads and --reps must be >= 1")
    if not os.access(a.qattn, os.X_OK):
        die(f"--qattn {a.qattn}: not an executable (build it first: cmake --build build-release)")
    try:
        import torch
    except ImportError:
        die("PyTorch is not installed: apt-get install python3-torch libopenblas0-openmp")

    proc = subprocess.run([a.qattn, "bench", "--rows", "fused", "--format", "json", "--L", ",".join(map(str, lengths)),
                           "--d", str(a.d), "--threads", ",".join(map(str, threads)), "--reps", str(a.reps)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        die(f"{a.qattn} bench failed ({proc.returncode}): {proc.stderr.strip()}")
    q = json.loads(proc.stdout)
    qattn_ms = {(r["L"], r["threads"], r["pipeline"]): r["median_ms"] for r in q["runs"]}

    lines = [f"bench-vs-torch: {q['cpu']}, {q['hardware_threads']} hardware threads, {platform.machine()}",
             f"PyTorch {torch.__version__}; fp32 matmul BLAS: {blas_name()}; "
             f"oneDNN (mkldnn) available: {torch.backends.mkldnn.is_available()}",
             f"qattn ISA {q['isa']}: {q['kernels']['qk']}, {q['kernels']['softmax']}, {q['kernels']['pv']}; "
             f"{q['index']}",
             f"medians of {a.reps} runs after one warm-up; one head, L_q = L_k = L, d = {a.d}; torch outputs preallocated",
             "",
             "| L | d | threads | torch fp32 ms | torch bf16 ms | qattn intattention ms | qattn quant-only ms | "
             "torch fp32 / intattention | torch bf16 / intattention |",
             "|---|---|---|---|---|---|---|---|---|"]
    for L in lengths:
        for t in threads:
            f32 = torch_attention(torch, L, a.d, torch.float32, t, a.reps)
            bf16 = torch_attention(torch, L, a.d, torch.bfloat16, t, a.reps)
            ia = qattn_ms[(L, t, "intattention fused")]
            qo = qattn_ms[(L, t, "quant-only fused")]
            lines.append(f"| {L} | {a.d} | {t} | {f32:.2f} | {bf16:.2f} | {ia:.2f} | {qo:.2f} | {f32 / ia:.2f} | "
                         f"{bf16 / ia:.2f} |")
            print(f"bench_vs_torch: L {L}, {t} thread(s) done", file=sys.stderr)
    text = "\n".join(lines) + "\n"
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.out)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
