#!/usr/bin/env bash
# The Slurm path of docs/scale-out.md on a real single-node Slurm: the test starts munged, slurmctld and slurmd on
# localhost from a configuration it generates in a scratch directory (its own ports, state and sockets; nothing of
# the machine's is touched), submits a sharded analyze and a sharded sweep with scripts/slurm/submit.sh (a job
# array and a merge job that depends on it), waits for them, compares the merged tables with the unsharded ones
# byte for byte, and stops the daemons.
#
#   slurm_test.sh QATTN_BINARY REPO_ROOT
#
# slurmd runs jobs as their user and must start as root: run by another user, the test says so and is skipped
# (exit 77).
source "$(dirname "$0")/lib.sh"

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: slurmd must run as root to start jobs; run the test as root (CI does)"
  exit 77
fi
for tool in munged slurmctld slurmd sbatch squeue scontrol; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (scripts/install-deps.sh installs slurm and munge)"; exit 1; }
done

s="$tmp/slurm"
mkdir -p "$s/munge" "$s/state" "$s/spool" "$s/log" "$s/jobs"
chmod 755 "$tmp" "$s"  # munged wants its socket's directories searchable
chmod 700 "$s/munge"
head -c 1024 /dev/urandom >"$s/munge/munge.key"
chmod 600 "$s/munge/munge.key"
export SLURM_CONF="$s/slurm.conf"

stop_daemons() {
  scontrol shutdown >/dev/null 2>&1 || true
  for pidfile in "$s/slurmctld.pid" "$s/slurmd.pid"; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  munged -s -S "$s/munge/socket" >/dev/null 2>&1 || true
}
trap 'stop_daemons; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT

# ports of our own: a free pair above 20000 picked from the process id
port=$((20000 + ($$ % 20000) * 2))
host=$(hostname -s)
cat >"$SLURM_CONF" <<EOF
ClusterName=qattn-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$s/munge/socket
CredType=cred/munge
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd.pid
SlurmctldLogFile=$s/log/slurmctld.log
SlurmdLogFile=$s/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=qattn-test Nodes=$host Default=YES MaxTime=60 State=UP
EOF

daemon_logs() { tail -n 20 "$s"/log/*.log 2>/dev/null; }
munged -f --key-file="$s/munge/munge.key" --socket="$s/munge/socket" --pid-file="$s/munge/pid" \
  --log-file="$s/log/munged.log" --seed-file="$s/munge/seed" ||
  { echo "FAIL: munged did not start"; daemon_logs; exit 1; }
slurmctld -f "$SLURM_CONF" || { echo "FAIL: slurmctld did not start"; daemon_logs; exit 1; }
slurmd -f "$SLURM_CONF" || { echo "FAIL: slurmd did not start"; daemon_logs; exit 1; }
up=0
for _ in $(seq 100); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qx idle; then up=1; break; fi
  sleep 0.2
done
[ "$up" -eq 1 ] || { echo "FAIL: the node did not come up idle"; sinfo; daemon_logs; exit 1; }
pass=$((pass + 1))

submit="$root/scripts/slurm/submit.sh"
export QATTN="$bin"

# waits for job ids to leave the queue (at most 300 s); then checks each ended COMPLETED
wait_jobs() {
  local id state
  for _ in $(seq 1500); do
    [ -z "$(squeue -h -j "$(IFS=,; echo "$*")" 2>/dev/null)" ] && break
    sleep 0.2
  done
  for id in "$@"; do
    state=$(scontrol show job "$id" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | sort -u | tr '\n' ' ')
    case "$state" in
      "JobState=COMPLETED ") ;;
      *) echo "FAIL: job $id ended $state"; daemon_logs; cat "$tmp"/*/*.log 2>/dev/null | tail -20; return 1 ;;
    esac
  done
}

# run NAME N [SUBMIT_OPTION...] -- ARGS...: the unsharded table, then the dry run (sbatch --test-only) and the
# submission, compared
run() {
  local name=$1 n=$2 opts=()
  shift 2
  while [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  q "$@" >"$tmp/$name.full" 2>/dev/null || { echo "FAIL: $name: the unsharded run failed"; fail=$((fail + 1)); return; }
  if ! "$submit" --dry-run "${opts[@]}" -- "$n" "$tmp/$name" "$tmp/$name.merged" "$@" >"$tmp/$name.dry" 2>&1 ||
    [ "$(grep -c "to start at" "$tmp/$name.dry")" -ne 2 ]; then
    echo "FAIL: $name: sbatch --test-only refused the jobs"; cat "$tmp/$name.dry"; fail=$((fail + 1)); return
  fi
  pass=$((pass + 1))
  local ids
  ids=$("$submit" "${opts[@]}" -- "$n" "$tmp/$name" "$tmp/$name.merged" "$@") || { echo "FAIL: $name: submission failed"; fail=$((fail + 1)); return; }
  read -r array_id merge_id <<<"$ids"
  check "$name: --parsable gave two numeric job ids" grep -qE '^[0-9]+ [0-9]+$' <<<"$ids"
  wait_jobs "$array_id" "$merge_id" || { fail=$((fail + 1)); return; }
  check "$name: $n array tasks wrote their parts" test "$(ls "$tmp/$name"/part-*.json | wc -l)" -eq "$n"
  check "$name: the merge job's table equals the unsharded one byte for byte" cmp "$tmp/$name.full" "$tmp/$name.merged"
}

run analyze 4 -- analyze --method index@paper --method exaq --method turbo:nh=1
run sweep 3 --max-running 2 -- sweep --method index@paper --grid b=4:8 --grid c=8,12 --format md

# One task rerun alone (N from QATTN_SHARDS) writes the same part.
mkdir -p "$tmp/rerun"
id=$(QATTN_SHARDS=4 sbatch --parsable --array=2 --output="$tmp/rerun/%A_%a.log" "$root/scripts/slurm/qattn-shard.sbatch" \
  "$tmp/rerun" analyze --method index@paper --method exaq --method turbo:nh=1)
wait_jobs "${id%%;*}" || fail=$((fail + 1))
check "a task rerun alone with QATTN_SHARDS writes the same part" cmp "$tmp/analyze/part-2.json" "$tmp/rerun/part-2.json"

# A failed shard leaves the merge job unrun (afterok), and the table unwritten.
ids=$("$submit" -- 2 "$tmp/broken" "$tmp/broken.md" analyze --method index@paper --tensors "$tmp/no-such-dump")
read -r array_id merge_id <<<"$ids"
for _ in $(seq 1500); do
  [ -z "$(squeue -h -j "$array_id,$merge_id" 2>/dev/null)" ] && break
  sleep 0.2
done
check "a failed shard: the merge job never runs and no table is written" test ! -e "$tmp/broken.md"

echo "slurm tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
