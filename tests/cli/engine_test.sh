#!/usr/bin/env bash
# The engine as the CLI exposes it: --engine auto|fast|reference and --verbose on attention, analyze, sweep and
# reproduce, and QATTN_ISA honoured (or refused, exit 2) by every command. The fused path and the reference model
# must write byte-identical files and tables; every ISA this build and CPU run must agree byte for byte.
#
#   engine_test.sh QATTN_BINARY REPO_ROOT [EMULATOR...]
set -uo pipefail
source "$(dirname "$0")/lib.sh" "$@"

sample=$root/experiments/data/use-lite
s=$sample/layer0_head0
att=(attention --q "${s}_q.npy" --k "${s}_k.npy" --v "${s}_v.npy")

# QATTN_ISA: an unknown or unavailable value is a usage error for every command, before any work, listing the
# valid ones.
for cmd in "methods" "info ${s}_q.npy" "analyze --method fp32" "sweep --method index --grid b=4,5"; do
  out=$(QATTN_ISA=bogus q $cmd 2>&1); rc=$?
  if [ "$rc" -eq 2 ] && grep -q "QATTN_ISA: unknown ISA 'bogus'.*available here: scalar" <<<"$out"; then pass=$((pass + 1))
  else echo "FAIL: QATTN_ISA=bogus $cmd: exit $rc"; echo "$out" | head -3; fail=$((fail + 1)); fi
done
out=$(QATTN_ISA=bogus q "${att[@]}" --method intattention --out "$tmp/no.npy" 2>&1); rc=$?
check "QATTN_ISA=bogus attention: exit 2, nothing written" [ "$rc" -eq 2 -a ! -e "$tmp/no.npy" ]
for isa in avx512 amx neon-i8mm; do  # absent on one architecture or CPU or another
  out=$(QATTN_ISA=$isa q methods 2>&1); rc=$?
  if [ "$rc" -eq 0 ] || { [ "$rc" -eq 2 ] && grep -q "cannot run it (available: scalar" <<<"$out"; }; then pass=$((pass + 1))
  else echo "FAIL: QATTN_ISA=$isa methods: exit $rc: $out"; fail=$((fail + 1)); fi
done
isas=$(QATTN_ISA=bogus q methods 2>&1 | sed -n 's/.*available here: //p' | tr -d ',')
check "available ISAs listed" [ -n "$isas" ]

# --engine: a bad value is a usage error; fast refuses a method without a fused path, naming why.
expect 2 "engine" "--engine bogus" -- analyze --method fp32 --engine bogus
expect 2 "engine=fast: quant-only:softmax=ref has no fused path: softmax=ref" "--engine fast, quant-only" -- \
  analyze --method quant-only --engine fast
expect 2 "engine=fast: intattention.*q-group=4: the fused kernels take one Q scale" "--engine fast, q-group" -- \
  "${att[@]}" --method intattention:q-group=4 --engine fast --out "$tmp/no.npy"
check "nothing written on a refused engine" [ ! -e "$tmp/no.npy" ]
expect 0 "intattention:.*: fused kernels \(.*qk_s8s8_s32__" "--verbose names the fused kernels" -- \
  "${att[@]}" --method intattention --verbose --out "$tmp/v.npy"
expect 0 "q-group=4,k-group=0,group-max=global,v-group=tensor,qround=rne: reference model \(q-group=4" "--verbose names the fallback and why" -- \
  "${att[@]}" --method intattention:q-group=4 --verbose --out "$tmp/v.npy"
expect 0 "k-group=32,.*: fused kernels \(.*index_exp_s32_u8__[a-z0-9_]+ per key block \+ index_normalise_u8" \
  "--verbose names the group-wise kernels" -- "${att[@]}" --method intattention:k-group=32 --engine fast --verbose --out "$tmp/v.npy"

# attention: O and raw P, causal, both batch entries: fast == reference byte for byte, on every ISA.
for spec in intattention@upstream-neon intattention@upstream-sim intattention@paper:p=s8 quant-only:softmax=lanes16 \
    intattention:k-group=32,group-max=offset; do
  q "${att[@]}" --method "$spec" --causal --engine reference --out "$tmp/ref_o.npy" --probs "$tmp/ref_p.npy" --raw
  for isa in $isas; do
    rm -f "$tmp/o.npy" "$tmp/p.npy"
    QATTN_ISA=$isa q "${att[@]}" --method "$spec" --causal --engine fast --threads 2 --out "$tmp/o.npy" \
      --probs "$tmp/p.npy" --raw
    check "attention $spec, $isa: O equals the reference model's" cmp -s "$tmp/o.npy" "$tmp/ref_o.npy"
    check "attention $spec, $isa: P equals the reference model's" cmp -s "$tmp/p.npy" "$tmp/ref_p.npy"
  done
done

# analyze and sweep: the same table from both engines.
methods=(--method intattention@upstream-neon --method intattention@upstream-sim --method quant-only:softmax=lanes16)
q analyze "${methods[@]}" --engine reference --format csv --out "$tmp/a_ref.csv"
q analyze "${methods[@]}" --engine fast --format csv --out "$tmp/a_fast.csv"
check "analyze: fast == reference" cmp -s "$tmp/a_ref.csv" "$tmp/a_fast.csv"
q sweep --method intattention@paper --grid b=3,6 --grid c=4,7.5 --engine reference --out "$tmp/s_ref.csv" 2>/dev/null
q sweep --method intattention@paper --grid b=3,6 --grid c=4,7.5 --engine fast --out "$tmp/s_fast.csv" 2>/dev/null
check "sweep: fast == reference" cmp -s "$tmp/s_ref.csv" "$tmp/s_fast.csv"
check "sweep wrote a table" [ "$(wc -l < "$tmp/s_fast.csv")" -ge 5 ]

echo "engine_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
