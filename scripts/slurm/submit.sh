#!/usr/bin/env bash
# Submits a sharded qattn analyze or sweep to Slurm: a job array of N shards (qattn-shard.sbatch), then a merge job
# that starts when every shard has succeeded (--dependency=afterok) and writes the table the unsharded run writes.
# Prints the two job ids ("ARRAY_ID MERGE_ID"). docs/scale-out.md has the walk-through.
#
#   scripts/slurm/submit.sh [--dry-run] [--max-running M] [SBATCH_OPTION...] -- N PARTS_DIR OUT analyze|sweep ARGS...
#
#   SBATCH_OPTION   passed to both sbatch calls (--partition=..., --account=..., --time=...)
#   N               number of shards (array tasks 0..N-1)
#   PARTS_DIR       where the parts (part-K.json) and the Slurm logs go; created if missing
#   OUT             the merged table (its format is the one ARGS give, default md for analyze, csv for sweep)
#   --dry-run       sbatch --test-only for both jobs: checks the scripts and options, submits nothing
#   --max-running M at most M array tasks at a time (--array=0-(N-1)%M)
#
# QATTN names the program (default: qattn on PATH; exported to the jobs).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

dry=0
throttle=
sbatch_opts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --max-running)
      case "${2:-}" in ''|*[!0-9]*|0) echo "submit.sh: --max-running needs a positive integer" >&2; exit 2 ;; esac
      throttle="%$2"
      shift ;;
    *) sbatch_opts+=("$1") ;;
  esac
  shift
done
if [ $# -lt 5 ] || [ "$1" != "--" ]; then
  sed -n '5,14p' "$0" >&2
  exit 2
fi
shift
n=$1 parts_dir=$2 out=$3
shift 3
case "$n" in
  ''|*[!0-9]*|0) echo "submit.sh: N must be a positive integer, got '$n'" >&2; exit 2 ;;
esac
case "$1" in
  analyze|sweep) ;;
  *) echo "submit.sh: the command must be analyze or sweep, got '$1'" >&2; exit 2 ;;
esac
qattn_bin=$(command -v "${QATTN:-qattn}" || true)
[ -n "$qattn_bin" ] || { echo "submit.sh: ${QATTN:-qattn} not found (set QATTN)" >&2; exit 2; }
mkdir -p "$parts_dir"
parts_dir=$(cd "$parts_dir" && pwd)
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

merge_cmd="$(printf '%q' "$qattn_bin") merge $(printf '%q' "$parts_dir")/part-*.json --out $(printf '%q' "$out")"
if [ "$dry" -eq 1 ]; then
  sbatch --test-only "${sbatch_opts[@]}" --array="0-$((n - 1))$throttle" --output="$parts_dir/shard-%A_%a.log" \
    --export=ALL,QATTN="$qattn_bin",QATTN_SHARDS="$n" "$here/qattn-shard.sbatch" "$parts_dir" "$@"
  sbatch --test-only "${sbatch_opts[@]}" --job-name=qattn-merge --output="$parts_dir/merge-%j.log" \
    --wrap "$merge_cmd"
  exit 0
fi
array_id=$(sbatch --parsable "${sbatch_opts[@]}" --array="0-$((n - 1))$throttle" --output="$parts_dir/shard-%A_%a.log" \
  --export=ALL,QATTN="$qattn_bin",QATTN_SHARDS="$n" "$here/qattn-shard.sbatch" "$parts_dir" "$@")
array_id=${array_id%%;*}  # --parsable prints "id" or "id;cluster"
merge_id=$(sbatch --parsable "${sbatch_opts[@]}" --job-name=qattn-merge --dependency="afterok:$array_id" \
  --kill-on-invalid-dep=yes --output="$parts_dir/merge-%j.log" \
  --wrap "$merge_cmd")
echo "${array_id} ${merge_id%%;*}"
