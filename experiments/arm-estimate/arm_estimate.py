#!/usr/bin/python3
"""Throughput estimates of qattn's NEON inner loops on Arm cores this machine does not have, by llvm-mca.

Each NEON kernel file is compiled as the library compiles it (aarch64-linux-gnu-g++ -std=c++20 -O3 -DNDEBUG
-ffp-contract=off and the file's -march), the assembly is split into loops (a label and the last backward branch
to it), and the innermost loop that holds the most of the kernel's key instruction is handed to llvm-mca for each
CPU model. The simulated cycles per iteration become:
  GEMM loops:      MACs per cycle (sdot / usdot .4s: 16 MACs each) and GMAC/s at the assumed clock;
  IndexSoftmax:    cycles per logit (16 logits per iteration of the index / table loop).
Then a whole-head estimate at L = 4096, d = 128, one core: the two GEMMs at the loop rate plus the softmax loop over
L^2 logits (the normalisation pass, the maximum, the packing and P.V's flip of P are left out: a lower bound on time).

These are estimates from LLVM's scheduling models, not measurements: no cache misses, no front-end stalls beyond
the model, and LLVM 14's model for a given -mcpu may be a stand-in (the script prints whether two CPUs' models give
identical timings).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "kernels", "src")

# (kernel, source file, -march, the key instruction, kind, which loops qualify). The i8mm kernel
# (pv_u8s8_s32__neon_i8mm_4x16, usdot) is left out: neither core has FEAT_I8MM (the Cortex-A76 is Armv8.2, the M1's
# Firestorm lacks it too), and LLVM 14's models give usdot no resources at all (1 cycle for 12 usdot).
KERNELS = [
    ("qk_s8s8_s32__neon_dotprod_4x16 (4-row tile)", "gemm_neon_dotprod.cc", "armv8.2-a+dotprod", "sdot", "mac",
     lambda body: count(body, "eor") == 0),
    # P is flipped to s8 once per call (P ^ 0x80, 1 eor per 16 bytes, outside the tile), so P.V runs Q.K^T's loop.
    ("pv_u8s8_s32__neon_dotprod_4x16 (4-row tile, P flipped once per call)", "gemm_neon_dotprod.cc",
     "armv8.2-a+dotprod", "sdot", "mac", lambda body: count(body, "eor") == 0),
    ("mac_loop__neon_dotprod (the bench's peak loop: 16 independent sdot, registers only)", "gemm_neon_dotprod.cc",
     "armv8.2-a+dotprod", "sdot", "mac", lambda body: count(body, "sdot") == 16 and count(body, "ldr") == 0),
    ("index_softmax_s32_u8__neon E pass, Q26 index rules (@upstream-neon)", "index_softmax_neon.cc", "armv8-a", "tbl",
     "softmax", lambda body: count(body, "fdiv") == 0),
    ("index_softmax_s32_u8__neon E pass, floor/round index rules (@paper)", "index_softmax_neon.cc", "armv8-a", "tbl",
     "softmax", lambda body: count(body, "fdiv") > 0),
]
# Cores and the clocks assumed for GMAC/s (the RK3588's Cortex-A76 cluster; Apple M1's Firestorm cores).
CPUS = [("cortex-a76", 2.4, "RK3588 big core"), ("apple-m1", 3.2, "M1 Firestorm")]


def die(msg):
    print(f"arm_estimate: {msg}", file=sys.stderr)
    sys.exit(2)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed: {p.stderr.strip()[:2000]}")
    return p.stdout


def loops(asm_lines):
    """(label, body) for each label with a later backward branch to it; body = instruction lines in between.

    Labels are the compiler's (.L5) or an inline-assembly local label (1:, branched to as 1b)."""
    labels = {}
    out = []
    cond = "eq|ne|lt|le|gt|ge|lo|ls|hi|hs|cc|cs|mi|pl|vs|vc|al"
    branch = re.compile(r"^\s+(b(\.?(?:" + cond + r"))?|cbn?z|tbn?z)\s+.*?(\.L\w+|\d+b)\s*$")
    label_line = re.compile(r"^\s*(\.L\w+|\d+):")
    for i, line in enumerate(asm_lines):
        m = label_line.match(line)
        if m:
            labels[m.group(1)] = i
            continue
        b = branch.match(line)
        target = b.group(3).rstrip("b") if b and b.group(3)[0].isdigit() else (b.group(3) if b else None)
        if target in labels:
            start = labels[target]
            body = [l.strip() for l in asm_lines[start + 1:i + 1]
                    if l.startswith("\t") and not l.strip().startswith(".") and not label_line.match(l)]
            out.append((start, i, target, body))
    # innermost loops only: no other loop inside their span
    return [(label, body) for (s, e, label, body) in out
            if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for (s2, e2, _, _) in out)]


def count(body, mnemonic):
    return sum(1 for l in body if l.split()[0] == mnemonic)


def mca(body, cpu, iterations=1000):
    # a branch to an inline-assembly local label (b.ne 1b) names a label outside the body: give it a symbol, as the
    # compiler's own loops have (.L5), so that llvm-mca accepts it
    body = [re.sub(r"\s(\d+)b\s*$", r" .Llocal\1", line) if re.match(r"(b\.|cbn?z|tbn?z|b\s)", line) else line
            for line in body]
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write("\n".join(body) + "\n")
        path = f.name
    try:
        p = subprocess.run(["llvm-mca", "-mtriple=aarch64", f"-mcpu={cpu}", f"-iterations={iterations}", path],
                           capture_output=True, text=True)
        if p.returncode != 0 or p.stderr.strip():  # llvm-mca reports a bad line on stderr and may still exit 0
            die(f"llvm-mca -mcpu={cpu} failed: {p.stderr.strip()[:2000]}")
        text = p.stdout
    finally:
        os.unlink(path)
    total = int(re.search(r"Total Cycles:\s+(\d+)", text).group(1))
    rthru = float(re.search(r"Block RThroughput:\s+([\d.]+)", text).group(1))
    return total / iterations, rthru


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cxx", default="aarch64-linux-gnu-g++")
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--out", help="write the report here instead of stdout")
    a = ap.parse_args()
    for tool in (a.cxx, "llvm-mca"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            die(f"{tool} not found (apt-get install g++-aarch64-linux-gnu llvm-14)")
    version = run(["llvm-mca", "--version"]).strip().splitlines()
    lines = ["arm-estimate: llvm-mca " + " ".join(v.strip() for v in version if "version" in v.lower())[:80],
             f"compiler: {run([a.cxx, '--version']).splitlines()[0]}, -std=c++20 -O3 -DNDEBUG -ffp-contract=off",
             "", "| kernel | loop | key instr / iter | CPU (clock) | cycles / iter (simulated) | block RThroughput | "
             "estimate |", "|---|---|---|---|---|---|---|"]
    rates = {}
    models = {}
    for name, src, march, key, kind, qualifies in KERNELS:
        asm = run([a.cxx, "-std=c++20", "-O3", "-DNDEBUG", "-ffp-contract=off", f"-march={march}",
                   "-I", os.path.join(ROOT, "core", "include"),
                   "-I", os.path.join(ROOT, "kernels", "include"), "-S", "-o", "-", os.path.join(SRC, src)])
        candidates = [(count(body, key), label, body) for label, body in loops(asm.splitlines())]
        candidates = [c for c in candidates if c[0] > 0 and qualifies(c[2])]
        if not candidates:
            die(f"{src}: no loop with {key}")
        # the most key instructions per iteration (the full tile), then the shortest such loop (the innermost)
        n_key, label, body = max(candidates, key=lambda c: (c[0], -len(c[2])))
        if label.isdigit():
            label = f"asm {label}:"
        for cpu, ghz, what in CPUS:
            cycles, rthru = mca(body, cpu)
            models.setdefault(cpu, []).append(cycles)
            if kind == "mac":
                macs_per_cycle = 16 * n_key / cycles
                est = f"{macs_per_cycle:.1f} MAC/cycle = {macs_per_cycle * ghz:.1f} GMAC/s"
                rates[(name, cpu)] = macs_per_cycle * ghz
            else:
                per_logit = cycles / 16
                est = f"{per_logit:.2f} cycles / logit"
                rates[(name, cpu)] = per_logit
            lines.append(f"| {name} | {label}, {len(body)} instr | {n_key} {key} | {cpu} ({ghz} GHz, {what}) | "
                         f"{cycles:.2f} | {rthru:.2f} | {est} |")
    same = models["cortex-a76"] == models["apple-m1"]
    lines += ["", f"The two CPU models give {'identical' if same else 'different'} cycle counts on these loops."]
    L, d = a.L, a.d
    lines += ["", f"Whole head, L = {L}, d = {d}, one core (GEMM loops at their simulated rate, the softmax loop over "
              f"L^2 logits; everything else left out, so a lower bound on time):", "",
              "| CPU | Q.K^T ms | P.V ms | softmax E pass ms, Q26 rules | total ms | softmax share |",
              "|---|---|---|---|---|---|"]
    for cpu, ghz, _ in CPUS:
        qk = L * L * d / (rates[(KERNELS[0][0], cpu)] * 1e9) * 1e3
        pv = L * L * d / (rates[(KERNELS[1][0], cpu)] * 1e9) * 1e3
        sm = L * L * rates[(KERNELS[3][0], cpu)] / (ghz * 1e9) * 1e3
        total = qk + pv + sm
        lines.append(f"| {cpu} | {qk:.1f} | {pv:.1f} | {sm:.1f} | {total:.1f} | {sm / total * 100:.0f} % |")
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            f.write(text)
        os.replace(a.out + ".tmp", a.out)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
