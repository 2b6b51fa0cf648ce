#!/usr/bin/env bash
# The package's types (CTest python_types), with Debian's mypy:
#   1. mypy on the package's stubs (pyproject.toml [tool.mypy]): no errors
#   2. mypy.stubtest: every public name of qattn and its submodules against the stubs (.pyi), on the built package
#   3. every ```python block of README.md and python/README.md, each as a module of its own, under the same settings
#      plus --check-untyped-defs: no errors. Errors name the README and its line. A block is a fragment of the
#      user's script: it may use `model` (the user's model) and `inputs` (its inputs) without defining them (both
#      Any); everything else it uses it imports or defines. A block that cannot be checked so is preceded by the line
#      `<!-- mypy: skip (why) -->` (blank lines between allowed); the skipped blocks are listed. Any other
#      `<!-- mypy: ... -->` line, or one that no ```python block follows, is an error.
#
#   check_types.sh SOURCE_DIR BUILD_PYTHON_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
pkg=$(cd "$2" && pwd)
py=/usr/bin/python3
(cd "$src" && $py -m mypy) || { echo "check_types: mypy found errors in the stubs" >&2; exit 1; }
(cd / && PYTHONPATH="$pkg" $py -m mypy.stubtest --mypy-config-file "$src/python/tests/stubtest.ini" qattn) \
  || { echo "check_types: the stubs and the package differ (mypy.stubtest)" >&2; exit 1; }
(cd "$src" && $py - README.md python/README.md <<'EOF'
import os
import re
import subprocess
import sys
import tempfile

PRELUDE = "from typing import Any; model: Any; inputs: Any  # check_types.sh: names a README block may use"
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*mypy:(.*?)-->\s*$")
SKIP = re.compile(r"^\s*skip\s+\((.+)\)\s*$")


def blocks(path):
    """(first line number, dedented lines, skip reason or None) per ```python block; errors for bad directives."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found, errors, pending, i = [], [], None, 0  # pending: (line number, skip reason) of the last directive
    while i < len(lines):
        line = lines[i]
        d = DIRECTIVE.match(line)
        if d:
            if pending:
                errors.append(f"{path}:{pending[0]}: a mypy directive that no ```python block follows")
            m = SKIP.match(d.group(1))
            if not m:
                errors.append(f"{path}:{i + 1}: unknown mypy directive '{d.group(1).strip()}' (known: skip (why))")
            pending = (i + 1, m.group(1) if m else None)
            i += 1
            continue
        f = FENCE.match(line)
        if not f:
            if line.strip() and pending:
                errors.append(f"{path}:{pending[0]}: a mypy directive that no ```python block follows")
                pending = None
            i += 1
            continue
        indent, fence, lang = len(f.group(1)), f.group(2), f.group(3).lower()
        body, start, i = [], i + 2, i + 1
        while i < len(lines) and not re.match(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$", lines[i]):
            text = lines[i]
            body.append(text[min(indent, len(text) - len(text.lstrip(" "))):])
            i += 1
        i += 1
        if lang in ("python", "py"):
            found.append((start, body, pending[1] if pending else None))
        elif pending:
            errors.append(f"{path}:{pending[0]}: a mypy directive that no ```python block follows")
        pending = None
    if pending:
        errors.append(f"{path}:{pending[0]}: a mypy directive that no ```python block follows")
    return found, errors


names, errors, checked = {}, [], 0
with tempfile.TemporaryDirectory() as tmp:
    for readme in sys.argv[1:]:
        if not os.path.exists(readme):
            continue
        found, bad = blocks(readme)
        errors += bad
        for start, body, skip in found:
            if skip is not None:
                print(f"check_types: {readme}:{start}: skipped ({skip})")
                continue
            # line n of the README is line n of the module: mypy's line numbers are the README's
            name = re.sub(r"\W", "_", readme) + f"_L{start}.py"
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as out:
                out.write(PRELUDE + "\n" * (start - 1) + "\n".join(body) + "\n")
            names[name] = readme
            checked += 1
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    if not names:
        print("check_types: no ```python block in " + " or ".join(sys.argv[1:]))
        sys.exit(0)
    run = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--check-untyped-defs",
                          *sorted(os.path.join(tmp, n) for n in names)], capture_output=True, text=True)
    report = run.stdout + run.stderr
    for name, readme in names.items():
        report = report.replace(os.path.join(tmp, name) + ":", readme + ":")
    print(report.replace(tmp + os.sep, ""), end="")
    if run.returncode != 0:
        sys.exit(1)
    print(f"check_types: {checked} ```python block(s) of the READMEs type-check")
EOF
) || { echo "check_types: a README's Python example does not type-check (mypy; lines are the README's)" >&2; exit 1; }
echo "check_types: passed"
