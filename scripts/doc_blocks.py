#!/usr/bin/python3
"""The docs' generated blocks: each one is what a qattn command prints, kept in step.

A command prints markdown blocks between markers
    <!-- begin: qattn COMMAND, NAME -->  ...  <!-- end: NAME -->
and the docs hold those blocks between the same markers:
    qattn methods --format md     README.md (method table), docs/dumping.md, docs/non-finite.md (registry)
    qattn bench --list-targets    docs/kernels.md (the targets `qattn bench` checks)
With --check (the default) this script exits 1 and names each file whose block differs from what the command
prints; with --write it replaces them. Every file listed must hold at least one block, and every block must be one
its command prints.

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qattn", required=True, help="the qattn binary")
    ap.add_argument("--write", action="store_true", help="replace the blocks instead of checking them")
    ap.add_argument("--root", default=ROOT, help="source root holding README.md and docs/")
    a = ap.parse_args()
    cache = {}
    stale = []
    for rel in FILES:
        path = os.path.join(a.root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found = list(BLOCK.finditer(text))
        if not found:
            sys.exit(f"doc_blocks: {rel}: no '<!-- begin: qattn COMMAND, NAME -->' block")
        for m in found:
            printed = blocks_of(a.qattn, m.group("command"), cache)
            if m.group("name") not in printed:
                sys.exit(f"doc_blocks: {rel}: block '{m.group('name')}' is not one `qattn {m.group('command')}` prints "
                         f"({', '.join(sorted(printed))})")
        new = BLOCK.sub(lambda m: blocks_of(a.qattn, m.group("command"), cache)[m.group("name")], text)
        if new != text:
            stale.append(rel)
            if a.write:
                with open(path + ".tmp", "w", encoding="utf-8") as f:
                    f.write(new)
                os.replace(path + ".tmp", path)
    if stale and not a.write:
        print("doc_blocks: out of date with what qattn prints: " + ", ".join(stale) +
              " (run /usr/bin/python3 scripts/doc_blocks.py --qattn BUILD/qattn --write)", file=sys.stderr)
        sys.exit(1)
    for rel in stale:
        print(f"doc_blocks: rewrote {rel}")


if __name__ == "__main__":
    main()
