#!/usr/bin/env bash
# Kernels as descriptions (docs/kernels-as-data.md): `qattn kernel show` prints a kernel as a file that `--method
# file:PATH` runs to the same numbers as the method it came from, and that `kernel show` prints back unchanged; a
# spec's key=value changes one field (also as a sweep's grid axis); `qattn kernel check` exits 1 on a violated
# contract (FlashAttention-4's FP8 P path with max_offset 8 and rescale_threshold 4) and 0 once it holds; bad files
# and values are refused naming the file or key, with nothing written.
#
#   kernel_test.sh QATTN_BINARY REPO_ROOT [EMULATOR...]
set -uo pipefail
source "$(dirname "$0")/lib.sh" "$@"

sample=$root/experiments/data/use-lite

# the table's numbers without its method column (a quoted spec may hold commas)
numbers() { sed -E 's/^([^,]*,[^,]*),("[^"]*"|[^,]*),/\1,/' <<<"$1"; }

# ---- show, run, show again: the same numbers, the same file ------------------------------------------------------
# Every preset natively; under an emulator or a sanitizer (20-70x slower) three, since the loop's bits are the digest
# test's and this test's subject is the file's round trip.
specs=(fa3-fp8 fa3-fp8@paper sage2@sm90 sage2@sm89 sage2@sm89-int4 "sage2@sm89:acc=ada-single" sage1
  "sage1:acc=fp32,pad=upstream" sage2 sage2@paper-4b "sage2:acc=mma" "sage2:acc=two-level,p=e5m2" turbo turbo@paper
  "turbo:exp=exact,br=32,bc=16,int8-max=126" "turbo:poly=lsq,nr=-4")
if [ ${#emu[@]} -gt 0 ] || sanitized; then specs=(fa3-fp8@paper sage2@sm90 "sage1:acc=fp32,pad=upstream" turbo@paper); fi
for m in "${specs[@]}"; do
  f=$tmp/k.json
  if ! q kernel show "$m" > "$f"; then echo "FAIL: kernel show $m"; fail=$((fail + 1)); continue; fi
  want=$(q analyze --tensors "$sample" --method "$m" --format csv)
  got=$(q analyze --tensors "$sample" --method "file:$f" --format csv)
  check "$m: file:k.json gives the same numbers" [ "$(numbers "$want")" == "$(numbers "$got")" ]
  check "$m: the rows are labelled by the spec given" [ -n "$(grep -F ",file:$f," <<<"$got")" ]
  check "$m: kernel show of the file prints it back" [ "$(q kernel show "$f")" == "$(cat "$f")" ]
  check "$m: a path alone is file:PATH" [ "$(q kernel show "file:$f")" == "$(cat "$f")" ]
done

# ---- the P V units of MMA-Sim's models: named in a spec, refused with P in another format ---------------------------
q kernel show "sage2:acc=mma" > "$tmp/mma.json"
for unit in ada-mma-e4m3 b200-tcgen05-e4m3; do
  expect 0 "file:$tmp/mma.json,pv.unit=$unit" "pv.unit=$unit runs" -- analyze --tensors "$sample" --method \
    "file:$tmp/mma.json,pv.unit=$unit" --summary --columns O_one_minus_cossim
done
expect 2 "pv.unit: an FP8 E4M3 instruction takes E4M3 P and V" "an FP8 unit with fp16 P (a spec's value: usage)" -- analyze --tensors "$sample" \
  --method "file:$tmp/mma.json,pv.unit=ada-mma-e4m3,p.format=fp16"

# ---- one field changed: by the spec, and as a sweep's grid ------------------------------------------------------
q kernel show fa3-fp8 > "$tmp/fa3.json"
check "file:PATH,key=value changes that field" \
  [ -n "$(q kernel show "file:$tmp/fa3.json,p.offset=6" | grep -F '"offset": 6.0')" ]
a=$(q analyze --tensors "$sample" --method "file:$tmp/fa3.json,p.offset=6" --format csv)
check "a changed field changes the numbers" [ "$(numbers "$a")" != "$(numbers "$(q analyze --tensors "$sample" --method fa3-fp8 --format csv)")" ]
sw=$(q sweep --tensors "$sample" --method "file:$tmp/fa3.json" --grid p.offset=4:8 --format csv 2>/dev/null)
check "sweep --grid p.offset=4:8: five points" [ "$(cut -d, -f1 <<<"$sw" | sort -u | grep -c '^[0-9.]*$')" -eq 5 ]
check "sweep: a row for the point p.offset=8" \
  [ -n "$(grep '^8,' <<<"$sw")" ]

# ---- kernel check -----------------------------------------------------------------------------------------------
expect 0 "0 violated" "kernel check fa3-fp8" -- kernel check fa3-fp8
expect 0 "0 violated" "kernel check sage1" -- kernel check sage1
# sage2@sm89's FP16 accumulator: V scaled to 2.25 keeps 64 keys of P~ <= 448 within binary16; V at 448 does not
expect 0 "64 keys x largest P~ code 448 x largest V code 2.25 = 64512 \| 65504 \| holds" "kernel check sage2@sm89" -- \
  kernel check sage2@sm89
q kernel show sage2@sm89 > "$tmp/sm89.json"
expect 1 "FP16 accumulator within binary16 .*violated" "kernel check: sm89 with V scaled to 448" -- \
  kernel check "file:$tmp/sm89.json,v.max=0"
expect 1 "violated: P V's FP16 accumulator within binary16: change v.max <= 2.28" "kernel check names v.max" -- \
  kernel check "file:$tmp/sm89.json,v.max=0"
expect 2 "v.max: at most v.format's largest, 448" "v.max beyond E4M3's largest" -- analyze --method "file:$tmp/sm89.json,v.max=500"
expect 2 "v.max: 0, or at least v.format's smallest normal, 0.015625" "v.max below E4M3's smallest normal" -- \
  analyze --method "file:$tmp/sm89.json,v.max=1e-50"
# the bound takes the codes as the unit reads them: v.max 3.998 is the E4M3 code 4, and with p.offset 8 64 x 256 x 4
# = 65536 overflows binary16
expect 1 "largest V code 4 = 65536 .*violated" "kernel check: v.max rounded to its E4M3 code" -- \
  kernel check "file:$tmp/sm89.json,p.offset=8,v.max=3.998"
expect 1 "FP16 accumulator within binary16 .*violated" "kernel check: V per tensor on the f16 accumulator" -- \
  kernel check "file:$tmp/sm89.json,v.scale=tensor,v.max=0,output.finalize=reciprocal"
expect 1 "largest P~ within p.format .*4096.*violated" "kernel check: max_offset 8 + rescale_threshold 4" -- \
  kernel check "file:$tmp/fa3.json,softmax.rescale_threshold=4"
expect 1 "change p.offset \+ softmax.rescale_threshold <= log_2\(448 / p.scale\) = 8.80735" "kernel check names the fields" -- \
  kernel check "file:$tmp/fa3.json,softmax.rescale_threshold=4"
expect 0 "0 violated" "kernel check: 8 + 0.75 fits E4M3" -- kernel check "file:$tmp/fa3.json,softmax.rescale_threshold=0.75"
expect 1 "diffuse mass kept .*violated" "kernel check: P in (0, 1] cast to E4M3" -- kernel check "file:$tmp/fa3.json,p.offset=0"
expect 0 '"verdict": "holds"' "kernel check --format json" -- kernel check fa3-fp8 --format json
expect 2 "not a flash kernel" "kernel show of a method that is not a kernel" -- kernel show intattention
expect 2 "turbo's decode cache is an input of the call" "turbo's decode is not a description" -- kernel show turbo@decode
expect 0 "S on b200-nvf4: MMA-Sim's model, not measured here" "qattn methods marks the parts no measured vector validates" -- \
  methods
expect 0 '"not_validated"' "methods --format json lists them" -- methods --format json

# ---- refusals -----------------------------------------------------------------------------------------------------
sed 's/"offset": 8.0/"ofset": 8.0/' "$tmp/fa3.json" > "$tmp/bad.json"
expect 3 "bad.json.*p.ofset.*no such field" "an unknown field names the file and the field" -- \
  analyze --tensors "$sample" --method "file:$tmp/bad.json"
grep -v '"offset"' "$tmp/fa3.json" > "$tmp/missing.json"
expect 3 "missing.json.*p.offset.*missing" "a missing field" -- kernel show "$tmp/missing.json"
sed 's/"format": "bf16"/"format": "fp8"/' "$tmp/fa3.json" > "$tmp/value.json"
expect 3 "output.format.*one of int4, int8, e4m3" "a value not allowed lists the allowed ones" -- kernel show "$tmp/value.json"
sed '/"pv"/,/}/ s/"unit": "h100-wgmma-e4m3",/"unit": "h100-hmma-f16-acc16",/' "$tmp/fa3.json" > "$tmp/combo.json"  # pv.unit
expect 3 "combo.json.*pv.unit.*binary16 P and V" "an impossible combination names the field" -- kernel show "$tmp/combo.json"
sed '/"qk"/,/"max"/ s/"unit": "h100-wgmma-e4m3",/"unit": "exact",/' "$tmp/fa3.json" > "$tmp/sunit.json"  # qk.unit
expect 3 "sunit.json.*qk.unit.*e4m3 Q/K: h100-wgmma-e4m3 or b200-tcgen05-e4m3" "an S unit that does not take E4M3 names qk.unit" -- \
  kernel show "$tmp/sunit.json"
expect 2 "softmax.ex2_emu_freq.*multiple of 32" "the software exp2 needs whole 32-key fragments" -- \
  kernel show "file:$tmp/fa3.json,softmax.ex2_emu_freq=10,keys.block=100"
expect 3 "nope.json.*cannot be read" "a missing file" -- analyze --tensors "$sample" --method "file:$tmp/nope.json"
expect 2 "p.offset.*'x' is not allowed \(a finite number\)" "a bad value in the spec" -- \
  analyze --tensors "$sample" --method "file:$tmp/fa3.json,p.offset=x"
expect 2 "'7' is not key=value" "a bare value where a method takes none" -- analyze --tensors "$sample" --method sage2:7
expect 2 "no description file" "file without a path" -- analyze --tensors "$sample" --method file
out=$tmp/out.md
expect 3 "" "nothing is written on a refused file" -- analyze --tensors "$sample" --method "file:$tmp/bad.json" --out "$out"
check "no partial output" [ ! -e "$out" ]
if [ ${#emu[@]} -eq 0 ] && ! sanitized; then  # every default method on the sample: natively only
  check "analyze without --method leaves the file method out" \
    [ -z "$(q analyze --tensors "$sample" --summary 2>&1 | grep -F 'file')" ]
fi

echo "kernel_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
