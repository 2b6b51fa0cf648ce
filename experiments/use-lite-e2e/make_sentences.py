#!/usr/bin/env python3
"""Builds sentences.txt, the fixed sentence set of use-lite-e2e, from licence texts Debian ships in
/usr/share/common-licenses (Apache-2.0, MPL-2.0, LGPL-3, GPL-3, in that order): paragraphs split at sentence ends,
whitespace collapsed, sentences of 6 to 60 words kept once each, the first 240. tokenize.js then turns them into the
token ids of sentences.json with the model's own tokenizer."""
import re
import sys

FILES = ["Apache-2.0", "MPL-2.0", "LGPL-3", "GPL-3"]
N = 240


def sentences(text):
    for para in re.split(r"\n\s*\n", text):
        para = re.sub(r"\s+", " ", para).strip()
        for s in re.split(r"(?<=[.;!?])\s+(?=[A-Z(\"])", para):
            if 6 <= len(s.split()) <= 60:
                yield s


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/common-licenses"
    seen, out = set(), []
    for name in FILES:
        for s in sentences(open(f"{root}/{name}", encoding="utf-8").read()):
            if s not in seen:
                seen.add(s)
                out.append((name, s))
    if len(out) < N:
        sys.exit(f"only {len(out)} sentences")
    with open("sentences.txt", "w", encoding="utf-8") as f:
        for name, s in out[:N]:
            f.write(f"{name}\t{s}\n")


main()
