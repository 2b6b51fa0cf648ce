#!/usr/bin/python3
"""Nothing outside the registry and a method's own files switches on a method's name.

Takes every method name from `qattn methods --format json` and searches the program's code outside reference/ (the
registry and the methods' own files live there): the C++ of cli/, eval/, engine/, core/, kernels/, python/, fuzz/ and tests/. A comparison of a string with
a method's name (`== "exaq"`, `"exaq" !=`, `case ...`) is a switch on that name: the entry should carry what the
code wanted to know (MethodEntry, MethodTraits in core/include/qattn/method.h).

One table is keyed by name on purpose and is not a comparison: the engine's kFusedPlans (engine/src/engine.cc),
the kernels' own list of the methods they run (the registry lives in reference/, which must not depend on the
kernels). It is the one place that names the methods the fused kernels take.

    method_names_test.py QATTN_BINARY SOURCE_ROOT
"""
import json
import os
import re
import subprocess
import sys


def main():
    qattn, root = sys.argv[1], sys.argv[2]
    out = subprocess.run([qattn, "methods", "--format", "json"], capture_output=True, text=True, check=True).stdout
    # methods, not the quantizers. A method reached by a bare value (file:PATH, its entry's positional_key) is left
    # out: its name is the word InputError uses for a file's field ("file"), compared throughout the tests.
    names = [e["name"] for e in json.loads(out) if "kind" in e and "positional_key" not in e]
    if len(names) < 4:
        sys.exit(f"method_names_test: only {names} from qattn methods --format json")
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    comparison = re.compile(r'(==|!=)\s*"(' + alternatives + r')"|"(' + alternatives + r')"\s*(==|!=)'
                            r'|\bcase\s+"(' + alternatives + r')"')
    this = os.path.abspath(__file__)
    bad = []
    scanned = 0
    for top in ("cli", "eval", "engine", "core", "kernels", "python", "fuzz", "tests"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                if os.path.abspath(path) == this:
                    continue
                scanned += 1
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for no, line in enumerate(fh, 1):
                        if comparison.search(line):
                            bad.append(f"{os.path.relpath(path, root)}:{no}: {line.strip()}")
    if scanned < 20:
        sys.exit(f"method_names_test: scanned only {scanned} files under {root}")
    if bad:
        print("method_names_test: a method's name compared outside the registry (describe it in its entry instead):",
              file=sys.stderr)
        print("\n".join(bad), file=sys.stderr)
        sys.exit(1)
    print(f"method_names_test: {len(names)} method names, {scanned} files, no comparison")


if __name__ == "__main__":
    main()
