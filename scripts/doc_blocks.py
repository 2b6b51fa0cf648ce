#!/usr/bin/python3
"""The docs' generated blocks: each one is what a qattn command prints, kept in step.

A command prints markdown blocks between markers
    <!-- begin: qattn COMMAND, NAME -->  ...  <!-- end: NAME -->
and the docs hold those blocks between the same markers:
    qattn methods --format md     README.md (method table), docs/dumping.md, docs/non-finite.md (registry)
    qattn bench --list-targets    docs/kernels.md (the targets `qattn bench` checks)
and any markdown file (README.md, docs/, experiments/*/README.md) may hold a table of an experiment's committed
output, so that no figure it quotes from there can go stale:
    <!-- begin: expected EXPERIMENT, tableN[, rows=REGEX] -->  ...  <!-- end: tableN -->
is the N-th markdown table (table1 the first) of experiments/EXPERIMENT/expected.txt, which CTest checks against
the program's output; rows=REGEX keeps the header and the rows REGEX matches (re.search on the row's line).
With --check (the default) this script exits 1 and names each file whose block differs from what the command
prints or the experiment's output holds; with --write it replaces them. Every file listed must hold at least one
`qattn` block, and every block must be one its command prints.

    /usr/bin/python3 scripts/doc_blocks.py --qattn build-release/qattn [--write]
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["README.md", os.path.join("docs", "dumping.md"), os.path.join("docs", "non-finite.md"),
         os.path.join("docs", "kernels.md")]
BLOCK = re.compile(r"<!-- begin: qattn (?P<command>[^,>]+), (?P<name>[^>]+?) -->\n(?P<body>.*?)<!-- end: (?P=name) -->\n",
                   re.S)
EXPECTED = re.compile(r"<!-- begin: expected (?P<exp>[\w.-]+), (?P<name>table\d+)(?:, rows=(?P<rows>[^>]*?))? -->\n"
                      r"(?P<body>.*?)<!-- end: (?P=name) -->\n", re.S)


def expected_block(root, rel, m):
    """The block `m` names, made from experiments/EXP/expected.txt's markdown tables."""
    path = os.path.join(root, "experiments", m.group("exp"), "expected.txt")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        sys.exit(f"doc_blocks: {rel}: block {m.group('name')}: cannot read {path} ({e.strerror})")
    tables, current = [], []
    for line in lines + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    n = int(m.group("name")[len("table"):])
    if not 1 <= n <= len(tables):
        sys.exit(f"doc_blocks: {rel}: {path} has {len(tables)} tables, no {m.group('name')}")
    table = tables[n - 1]
    if m.group("rows"):
        keep = re.compile(m.group("rows"))
        table = table[:2] + [r for r in table[2:] if keep.search(r)]
        if len(table) == 2:
            sys.exit(f"doc_blocks: {rel}: rows={m.group('rows')} matches no row of {path}'s {m.group('name')}")
    head = m.group(0)[:m.group(0).index("-->") + 4]
    return head + "\n".join(table) + "\n" + f"<!-- end: {m.group('name')} -->\n"


def markdown_files(root):
    """README.md and every .md under docs/ and experiments/."""
    out = ["README.md"]
    for top in ("docs", "experiments"):
        for d, _, names in os.walk(os.path.join(root, top)):
            out += [os.path.relpath(os.path.join(d, n), root) for n in sorted(names) if n.endswith(".md")]
    return out


def blocks_of(qattn, command, cache):
    """The blocks `qattn COMMAND` prints, by name (the command is run once)."""
    if command not in cache:
        p = subprocess.run([qattn] + command.split(), capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"doc_blocks: {qattn} {command} failed: {p.stderr.strip()}")
        found = {m.group("name"): m.group(0) for m in BLOCK.finditer(p.stdout)}
        if not found:
            sys.exit(f"doc_blocks: qattn {command} printed no blocks")
        cache[command] = found
    return cache[command]


def qattn_blocks(qattn, rel, text, cache):
    """`text` with each qattn block replaced by what its command prints; exits naming `rel` when it holds no block,
    or a block its command does not print."""
    found = list(BLOCK.finditer(text))
    if not found:
        sys.exit(f"doc_blocks: {rel}: no '<!-- begin: qattn COMMAND, NAME -->' block")
    for m in found:
        printed = blocks_of(qattn, m.group("command"), cache)
        if m.group("name") not in printed:
            sys.exit(f"doc_blocks: {rel}: block '{m.group('name')}' is not one `qattn {m.group('command')}` prints "
                     f"({', '.join(sorted(printed))})")
    return BLOCK.sub(lambda m: blocks_of(qattn, m.group("command"), cache)[m.group("name")], text)


def renew(path, blocks, write):
    """Whether blocks(text) differs from the text of `path`; with `write`, the file is replaced by it. One file at a
    time: README.md is in both passes, and its second reads what the first wrote."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = blocks(text)
    if new != text and write:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(path + ".tmp", path)
    return new != text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qattn", required=True, help="the qattn binary")
    ap.add_argument("--write", action="store_true", help="replace the blocks instead of checking them")
    ap.add_argument("--root", default=ROOT, help="source root holding README.md and docs/")
    a = ap.parse_args()
    cache = {}
    stale = []
    for rel in FILES:
        if renew(os.path.join(a.root, rel), lambda text: qattn_blocks(a.qattn, rel, text, cache), a.write):
            stale.append(rel)
    for rel in markdown_files(a.root):
        if renew(os.path.join(a.root, rel), lambda text: EXPECTED.sub(lambda m: expected_block(a.root, rel, m), text),
                 a.write):
            stale.append(rel)
    if stale and not a.write:
        print("doc_blocks: out of date with what qattn prints or an experiment's expected.txt holds: " + ", ".join(stale) +
              " (run /usr/bin/python3 scripts/doc_blocks.py --qattn BUILD/qattn --write)", file=sys.stderr)
        sys.exit(1)
    for rel in stale:
        print(f"doc_blocks: rewrote {rel}")


if __name__ == "__main__":
    main()
