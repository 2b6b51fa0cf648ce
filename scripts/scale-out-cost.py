#!/usr/bin/python3
"""Measures what one (layer, head) costs `qattn analyze` and one (grid point, head) costs `qattn sweep`, the figures
the cost model of docs/scale-out.md is built on.

For each L it writes a one-head dump of Gaussian Q [L_q, d], K and V [L, d] (seeded; Q with standard deviation
--q-std, default 3, so that logits spread like a trained head's: N(0, 1) logits over 32K keys are flatter than any
real head, and tflite-int8 refuses rows whose sum of exponentials reaches 512; L_q = min(L, --max-queries) query
rows against all L keys, since the work of a head is linear in its query rows for a fixed number of keys) and
times, as separate processes, the median of --reps runs of

    qattn analyze --tensors DUMP [--method M ...]     (one thread; every default method unless --method is given)
    qattn sweep --tensors DUMP --method index@paper --grid b=8 --threads 1     (one grid point)

with their peak resident memory. It prints the CPU, then per L the measured seconds, the seconds scaled to a full
head of L queries (x L / L_q), and the peak RSS.

    scripts/scale-out-cost.py --qattn build-release/qattn --L 4096 32768 --max-queries 1024
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def cpu_line():
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = (s.strip() for s in line.split(":", 1))
                    info.setdefault(k, v)
    except OSError:
        pass
    return "%s (family %s, model %s), %d cores" % (info.get("model name", "unknown CPU"), info.get("cpu family", "?"),
                                                   info.get("model", "?"), os.cpu_count() or 0)


def timed(cmd):
    """Wall seconds and peak RSS (MiB) of one run of cmd as a child process."""
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit("scale-out-cost: %s failed (exit %d): %s" % (" ".join(cmd), child.returncode, stderr.strip()))
    return seconds, usage.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qattn", required=True, help="the qattn program")
    ap.add_argument("--L", type=int, nargs="+", default=[4096, 32768], help="key lengths (default 4096 32768)")
    ap.add_argument("--d", type=int, default=128, help="head dimension (default 128)")
    ap.add_argument("--max-queries", type=int, default=1024, help="query rows per head at most (default 1024)")
    ap.add_argument("--q-std", type=float, default=3.0, help="standard deviation of Q (default 3)")
    ap.add_argument("--reps", type=int, default=3, help="runs per figure; the median is printed (default 3)")
    ap.add_argument("--method", action="append", default=[], help="analyze these methods instead of the defaults")
    a = ap.parse_args()
    print("CPU: %s; 1 thread per process; d = %d; Q std %g; median of %d runs" % (cpu_line(), a.d, a.q_std, a.reps))
    print("| command | L (keys) | query rows run | measured s | s per full head (x L / rows) | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(20261124)
    methods = [x for m in a.method for x in ("--method", m)]
    for L in a.L:
        lq = min(L, a.max_queries)
        with tempfile.TemporaryDirectory() as dump:
            for name, rows, std in (("q", lq, a.q_std), ("k", L, 1.0), ("v", L, 1.0)):
                np.save(os.path.join(dump, "layer0_head0_%s.npy" % name),
                        (std * rng.standard_normal((rows, a.d))).astype(np.float32))
            cases = [("analyze" + (" " + " ".join(a.method) if a.method else " (every default method)"),
                      [a.qattn, "analyze", "--tensors", dump] + methods),
                     ("sweep, one point of index@paper",
                      [a.qattn, "sweep", "--tensors", dump, "--method", "index@paper", "--grid", "b=8", "--threads", "1"])]
            for label, cmd in cases:
                runs = [timed(cmd) for _ in range(a.reps)]
                s = statistics.median(r[0] for r in runs)
                rss = max(r[1] for r in runs)
                print("| %s | %d | %d | %.2f | %.1f | %.0f |" % (label, L, lq, s, s * L / lq, rss), flush=True)


if __name__ == "__main__":
    main()
