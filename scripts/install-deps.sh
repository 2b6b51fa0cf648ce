#!/usr/bin/env bash
# Installs every build, test and analysis dependency of qattn from Debian 12's apt (libdnnl-dev: oneDNN, only for
# the anchor rows of `qattn bench`; the library never links it. parallel, slurm*, munge: the scale-out tests. ccache:
# scripts/test.sh, so that the Python package's build reuses the native build's objects).
# Idempotent: packages already present are skipped by apt; the arm64 architecture is added once.
#
#   scripts/install-deps.sh            native build, tests, analysis (Python plots)
#   scripts/install-deps.sh --cross    also the aarch64 cross toolchain, qemu-user and arm64 RapidCheck
#   scripts/install-deps.sh --torch    also PyTorch and OpenBLAS (the dump-writer test, experiments/bench-vs-torch)
set -euo pipefail

want_cross=0
want_torch=0
for arg in "$@"; do
  case "$arg" in
    --cross) want_cross=1 ;;
    --torch) want_torch=1 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg' (valid: --cross, --torch)" >&2; exit 2 ;;
  esac
done

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps.sh: run as root or install sudo" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive

native_pkgs=(
  build-essential cmake ninja-build pkg-config git time ccache
  libeigen3-dev libboost-dev librapidcheck-dev catch2 libbenchmark-dev
  libmpfr-dev libgmp-dev nlohmann-json3-dev libzip-dev libcli11-dev
  clang libclang-rt-14-dev
  python3-numpy python3-matplotlib python3-pandas
  pybind11-dev python3-dev python3-pytest python3-hypothesis
  python3-pip python3-venv python3-setuptools python3-wheel python3-mypy
  libdnnl-dev libssl-dev
  parallel slurmctld slurmd slurm-client munge
)
cross_pkgs=(qemu-user g++-aarch64-linux-gnu)
torch_pkgs=(python3-torch libopenblas0-openmp)

missing() {  # prints the packages of "$@" that dpkg does not report as installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

todo=($(missing "${native_pkgs[@]}"))
if [ "$want_cross" -eq 1 ]; then
  todo+=($(missing "${cross_pkgs[@]}"))
fi
if [ "$want_torch" -eq 1 ]; then
  todo+=($(missing "${torch_pkgs[@]}"))
fi
if [ "$want_cross" -eq 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo_cmd[@]}" dpkg --add-architecture arm64
fi
if [ "$want_cross" -eq 1 ]; then
  todo+=($(missing librapidcheck-dev:arm64))
fi

if [ "${#todo[@]}" -eq 0 ]; then
  echo "install-deps.sh: all dependencies present"
  exit 0
fi
echo "install-deps.sh: installing ${todo[*]}"
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${todo[@]}" >/dev/null
echo "install-deps.sh: done"
