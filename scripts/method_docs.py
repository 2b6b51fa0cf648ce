#!/usr/bin/python3
"""The docs' method table and softmax-model list, from the registry.

`qattn methods --format md` prints markdown blocks between markers
    <!-- begin: qattn methods --format md, NAME -->  ...  <!-- end: NAME -->
README.md, docs/dumping.md and docs/non-finite.md hold those blocks between the same markers. With --check (the default) this
script exits 1 and names each file whose block differs from the registry's; with --write it replaces them.

    /usr/bin/python3 scripts/method_docs.py --qattn build-release/qattn [--write]
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["README.md", os.path.join("docs", "dumping.md"), os.path.join("docs", "non-finite.md")]
BLOCK = re.compile(r"<!-- begin: qattn methods --format md, (?P<name>[^>]+?) -->\n(?P<body>.*?)<!-- end: (?P=name) -->\n",
                   re.S)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qattn", required=True, help="the qattn binary")
    ap.add_argument("--write", action="store_true", help="replace the blocks instead of checking them")
    ap.add_argument("--root", default=ROOT, help="source root holding README.md and docs/")
    a = ap.parse_args()
    p = subprocess.run([a.qattn, "methods", "--format", "md"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"method_docs: {a.qattn} methods --format md failed: {p.stderr.strip()}")
    blocks = {m.group("name"): m.group(0) for m in BLOCK.finditer(p.stdout)}
    if not blocks:
        sys.exit("method_docs: qattn methods --format md printed no blocks")
    stale = []
    for rel in FILES:
        path = os.path.join(a.root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found = list(BLOCK.finditer(text))
        if not found:
            sys.exit(f"method_docs: {rel}: no '<!-- begin: qattn methods --format md, ... -->' block")
        for m in found:
            if m.group("name") not in blocks:
                sys.exit(f"method_docs: {rel}: block '{m.group('name')}' is not one qattn prints "
                         f"({', '.join(sorted(blocks))})")
        new = BLOCK.sub(lambda m: blocks[m.group("name")], text)
        if new != text:
            stale.append(rel)
            if a.write:
                with open(path + ".tmp", "w", encoding="utf-8") as f:
                    f.write(new)
                os.replace(path + ".tmp", path)
    if stale and not a.write:
        print("method_docs: out of date with the registry: " + ", ".join(stale) +
              " (run /usr/bin/python3 scripts/method_docs.py --qattn BUILD/qattn --write)", file=sys.stderr)
        sys.exit(1)
    for rel in stale:
        print(f"method_docs: rewrote {rel}")


if __name__ == "__main__":
    main()
