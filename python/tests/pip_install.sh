#!/usr/bin/env bash
# The package as pip installs it, offline, into fresh virtual environments in a temporary directory (CTest
# python_pip_install; README "Python"):
#   1. a copy of the source tree; python3 -m venv --system-site-packages; pip install --no-build-isolation .
#   2. the installed qattn is the venv's, its __version__ is CMakeLists.txt's, and the package's tests pass on it
#   3. pip wheel --no-build-isolation --no-deps . builds a wheel; a second fresh venv installs it and runs a check
#   4. pip uninstall qattn leaves no file of the package in the venv
#
#   pip_install.sh SOURCE_DIR QATTN_CLI
# Debian's /usr/bin/python3 throughout (its numpy, pytest and, where installed, torch come in through the system
# site packages; nothing is downloaded).
set -euo pipefail
src=$(cd "$1" && pwd)
cli=$2
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "pip_install: $*" >&2; exit 1; }

version=$(sed -n 's/^project(qattn VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no project(qattn VERSION ...) in $src/CMakeLists.txt"

echo "== copy of the source tree (build directories left out)"
mkdir "$tmp/src"
tar -C "$src" --exclude='./build*' --exclude='./.git' --exclude='*/__pycache__' -cf - . | tar -C "$tmp/src" -xf -

echo "== pip install --no-build-isolation . into a fresh venv"
$py -m venv --system-site-packages "$tmp/venv"
(cd "$tmp/src" && "$tmp/venv/bin/python" -m pip install --no-build-isolation --no-index . ) \
  || fail "pip install --no-build-isolation . failed"

echo "== the venv's qattn"
(cd "$tmp" && "$tmp/venv/bin/python" - "$tmp/venv" "$version" <<'EOF'
import sys, os
import numpy as np
import qattn
venv, version = sys.argv[1], sys.argv[2]
assert os.path.realpath(qattn.__file__).startswith(os.path.realpath(venv)), f"qattn imported from {qattn.__file__}"
assert qattn.__version__ == version, (qattn.__version__, version)
p = qattn.softmax(np.array([[0.0, 1.0, 2.0]]), "fp64")
assert abs(p.sum() - 1) < 1e-15 and p[0, 2] > p[0, 1] > p[0, 0], p
print("qattn", qattn.__version__, "from", os.path.dirname(qattn.__file__))
EOF
) || fail "the installed package does not import or compute"

echo "== the package's tests on the installed package"
(cd "$tmp" && env -u PYTHONPATH QATTN_CLI="$cli" QATTN_SOURCE="$src" \
  "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider "$src/python/tests") || fail "the package's tests failed"

echo "== pip wheel, and the wheel in a second venv"
(cd "$tmp/src" && "$tmp/venv/bin/python" -m pip wheel --no-build-isolation --no-deps --no-index -w "$tmp/wheels" .) \
  || fail "pip wheel failed"
wheel=$(ls "$tmp"/wheels/qattn-"$version"-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || fail "no qattn-$version wheel in $tmp/wheels: $(ls "$tmp/wheels")"
$py -m venv --system-site-packages "$tmp/venv2"
"$tmp/venv2/bin/python" -m pip install --no-index "$wheel" || fail "the wheel does not install"
(cd "$tmp" && "$tmp/venv2/bin/python" -c "
import qattn, os, sys
assert os.path.realpath(qattn.__file__).startswith(os.path.realpath('$tmp/venv2')), qattn.__file__
assert qattn.__version__ == '$version'
assert 'sage2' in {m['name'] for m in qattn.methods()}
import qattn.testing, qattn.models
print('wheel', os.path.basename('$wheel'), 'imports in a second venv')
") || fail "the wheel's package does not import"

echo "== pip uninstall qattn"
"$tmp/venv/bin/python" -m pip uninstall -y qattn || fail "pip uninstall failed"
left=$(find "$tmp/venv" -iname '*qattn*' -print)
[ -z "$left" ] || fail "pip uninstall left files behind: $left"
echo "pip_install: passed (qattn $version)"
