#!/usr/bin/env bash
# The package as pip installs it, offline, into fresh virtual environments in a temporary directory (CTest
# python_pip_install; README "Python"):
#   1. a copy of the source tree; python3 -m venv --system-site-packages; pip install -v --no-build-isolation .
#      shows the build's progress: setup.py's line per phase and Ninja's "[n/m]" per compiled file
#   2. the installed qattn is the venv's, its __version__ is CMakeLists.txt's
#   3. the command qattn that pip installed: `qattn --version` is "qattn " + qattn.__version__; run from elsewhere
#      with no QATTN_* variables, it reads the embedded sample from the package's data files (the same bytes as the
#      build tree's program), takes its arguments as given, draws a plot, and exits with the program's status
#   4. the package's tests pass on the installed package, with the installed command as QATTN_CLI
#   5. pip wheel --no-build-isolation --no-deps . builds a wheel; a second fresh venv installs it and runs a check
#      (the package and its command)
#   6. pip uninstall qattn leaves no file of the package in the venv, the command included
#
#   pip_install.sh SOURCE_DIR
# Debian's /usr/bin/python3 throughout (its numpy, pytest and, where installed, torch come in through the system
# site packages; nothing is downloaded).
set -euo pipefail
src=$(cd "$1" && pwd)
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "pip_install: $*" >&2; exit 1; }

version=$(sed -n 's/^project(qattn VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "no project(qattn VERSION ...) in $src/CMakeLists.txt"

echo "== copy of the source tree (build directories left out)"
mkdir "$tmp/src"
tar -C "$src" --exclude='./build*' --exclude='./.git' --exclude='*/__pycache__' -cf - . | tar -C "$tmp/src" -xf -

# where a compiler cache runs (scripts/test.sh), paths under the copy are rewritten relative to it, as the native
# build's are relative to the source tree, so the copy's compiles find the native build's objects
export CCACHE_BASEDIR=$tmp/src
echo "== pip install -v --no-build-isolation . into a fresh venv"
$py -m venv --system-site-packages "$tmp/venv"
(cd "$tmp/src" && "$tmp/venv/bin/python" -m pip install -v --no-build-isolation --no-index . ) 2>&1 \
  | tee "$tmp/pip-install.log" || fail "pip install --no-build-isolation . failed"
for phase in "1/4 configuring" "2/4 building the extension _qattn" "3/4 building the program qattn" "4/4 installing"; do
  grep -q "setup.py \[[0-9]* s\]: $phase" "$tmp/pip-install.log" || fail "pip install -v showed no line '$phase'"
done
grep -Eq '^ *\[[0-9]+/[0-9]+\] ' "$tmp/pip-install.log" || fail "pip install -v showed no [n/m] progress of the build"
if [ -n "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ] && command -v ccache >/dev/null; then
  ccache --show-stats | sed -n '1,8p'  # how much of the build the cache served (scripts/test.sh)
fi

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

echo "== the command qattn that pip installed"
qcmd="$tmp/venv/bin/qattn"
[ -x "$qcmd" ] || fail "pip install did not install the command qattn ($qcmd)"
mkdir "$tmp/work"
as_user() { (cd "$tmp/work" && env -u PYTHONPATH -u QATTN_SHARE_DIR -u QATTN_PLOTS_DIR -u QATTN_PYTHON -u QATTN_CLI "$@"); }
got=$(as_user "$qcmd" --version) || fail "qattn --version failed"
want=$(as_user "$tmp/venv/bin/python" -c "import qattn; print(qattn.__version__)")
[ "$got" = "qattn $want" ] && [ "$want" = "$version" ] \
  || fail "qattn --version printed '$got', qattn.__version__ is '$want', CMakeLists.txt has $version"
as_user "$qcmd" analyze --method fp32 >"$tmp/work/analyze.md" || fail "qattn analyze --method fp32 failed"
# without --tensors: the embedded sample, the package's own copy; the report is the installed package's, byte for byte
sample=$(as_user "$tmp/venv/bin/python" -c \
  "import os, qattn; print(os.path.join(os.path.dirname(qattn.__file__), '_cli_prefix/share/qattn/data/use-lite'))")
case "$sample" in "$tmp/venv/"*) ;; *) fail "the package's sample $sample is not in the venv" ;; esac
as_user "$tmp/venv/bin/python" -c "import sys, qattn; sys.stdout.write(qattn.analyze(sys.argv[1], 'fp32', format='md'))" \
  "$sample" >"$tmp/work/analyze-python.md"
cmp "$tmp/work/analyze.md" "$tmp/work/analyze-python.md" \
  || fail "qattn analyze on the embedded sample differs from qattn.analyze('$sample', 'fp32', format='md')"
as_user "$qcmd" sweep --method index@paper --grid b=3,4 --grid c=4,6 --out "$tmp/work/a sweep.csv" \
  || fail "qattn sweep --out 'a sweep.csv' failed"
as_user "$qcmd" plot heatmap "$tmp/work/a sweep.csv" -o "$tmp/work/a heatmap.png" || fail "qattn plot heatmap failed"
[ "$(head -c 4 "$tmp/work/a heatmap.png" | tail -c 3)" = PNG ] || fail "qattn plot heatmap wrote no PNG"
rc=0
as_user "$qcmd" analyze --method no-such-method >/dev/null 2>"$tmp/work/error.txt" || rc=$?
[ "$rc" -eq 2 ] && grep -q "unknown method 'no-such-method'" "$tmp/work/error.txt" \
  || fail "qattn analyze --method no-such-method: exit $rc (expected the program's 2), $(cat "$tmp/work/error.txt")"
echo "qattn $want: the command runs the package's program on its own data"

echo "== the package's tests on the installed package and its command"
(cd "$tmp" && env -u PYTHONPATH QATTN_CLI="$qcmd" QATTN_SOURCE="$src" \
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
got=$(as_user "$tmp/venv2/bin/qattn" --version) && [ "$got" = "qattn $version" ] \
  || fail "the wheel's command: qattn --version printed '$got'"

echo "== pip uninstall qattn"
"$tmp/venv/bin/python" -m pip uninstall -y qattn || fail "pip uninstall failed"
left=$(find "$tmp/venv" -iname '*qattn*' -print)
[ -z "$left" ] || fail "pip uninstall left files behind: $left"
echo "pip_install: passed (qattn $version)"
