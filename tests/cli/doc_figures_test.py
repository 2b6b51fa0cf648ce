#!/usr/bin/python3
"""No figure an experiment's README (or docs/experiments.md, README.md) quotes from an experiment's output can go
stale: every CosSim-like figure 0.9xxxx (5 to 9 decimals) and every error in e-notation there must be the rounding
(half up or half even) of a number some experiments/*/expected*.txt holds, or of 1 minus one (an error quoted as
1 - CosSim). CTest checks expected*.txt against the programs, so a figure that stops matching fails here. Tables
generated from expected.txt (scripts/doc_blocks.py) are skipped; so are sections about the full dump (they name
../shared or "full dump": runs on data the repository does not hold), and the figures ALLOWED lists, each with why.

    doc_figures_test.py REPO_ROOT
"""
import glob
import os
import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, getcontext

getcontext().prec = 60
root = sys.argv[1]

ALLOWED = {
    # the per-product FP22 model's values before the accumulator was rebuilt on the H100 data (history)
    ("experiments/sage2-tables/README.md", "0.99158862"),
    ("experiments/sage2-tables/README.md", "0.99158788"),
    # the model check's threshold and its measured margin (python/tests/test_use_lite.py), not an experiment's output
    ("experiments/use-lite-e2e/README.md", "0.99999999"),
    ("experiments/use-lite-e2e/README.md", "2.4e-7"),
}

values = set()
for f in glob.glob(os.path.join(root, "experiments", "*", "expected*.txt")):
    for x in re.findall(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?", open(f, encoding="utf-8").read()):
        v = abs(Decimal(x))
        if 0 < v < Decimal("1e100"):
            values.add(v)
            if v < 1:
                values.add(1 - v)


def rounds_to(v, quoted):
    mantissa, _, exponent = quoted.lower().partition("e")
    places = len(mantissa.split(".")[1]) if "." in mantissa else 0
    scaled = v.scaleb(-int(exponent)) if exponent else v
    quant = Decimal(1).scaleb(-places)
    return any(scaled.quantize(quant, rounding=r) == Decimal(mantissa) for r in (ROUND_HALF_UP, ROUND_HALF_EVEN))


files = sorted(glob.glob(os.path.join(root, "experiments", "*", "README.md")))
files += [os.path.join(root, "docs", "experiments.md"), os.path.join(root, "README.md")]
stale, checked = [], 0
for path in files:
    rel = os.path.relpath(path, root)
    text = re.sub(r"<!-- begin: .*?<!-- end: [^>]*-->", "", open(path, encoding="utf-8").read(), flags=re.S)
    full_dump = False
    for line in text.splitlines():
        if line.startswith("#") or line.startswith("**"):
            full_dump = False
        if "../shared" in line or "full dump" in line.lower():
            full_dump = True
        if full_dump:
            continue
        for m in re.finditer(r"(?<![\w.])(0\.9\d{4,8}|\d\.\d{1,3}e-\d+)(?!\d)", line):
            checked += 1
            if (rel, m.group(1)) not in ALLOWED and not any(rounds_to(v, m.group(1)) for v in values):
                stale.append(f"{rel}: {m.group(1)} is no rounding of any experiment's output: {line.strip()[:120]}")
for s in stale:
    print("FAIL:", s)
unused = [a for a in ALLOWED if not os.path.exists(os.path.join(root, a[0])) or a[1] not in open(os.path.join(root, a[0])).read()]
for a in unused:
    print("FAIL: allowed figure no longer quoted (drop it from ALLOWED):", a)
print(f"doc_figures_test: {checked} figures checked, {len(stale)} stale")
sys.exit(1 if stale or unused or checked < 200 else 0)
