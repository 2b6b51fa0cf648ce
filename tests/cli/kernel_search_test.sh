#!/usr/bin/env bash
# `qattn kernel check --search` (docs/kernels-as-data.md, "Searching for bad inputs"): the worst input it writes is a
# dump that `qattn analyze` reads back to the same error, bit for bit, its causal mask included; the result does not
# depend on --threads; the search tells the P-path bugs from their fixes (FlashInfer's FP8 P cast without the 2^8
# pre-scale on diffuse rows, FlashAttention-4's rescale threshold on a needle); bad options are refused with nothing
# written.
#
#   kernel_search_test.sh QATTN_BINARY REPO_ROOT [EMULATOR...]
set -uo pipefail
source "$(dirname "$0")/lib.sh" "$@"

py=/usr/bin/python3
small=(--budget 8 --d 64 --max-keys 1024)

# field FILE EXPR: a value of the JSON report in FILE (EXPR indexes j, the parsed report)
field() { "$py" -c "import json, sys; j = json.load(open(sys.argv[1])); print(repr($2))" "$1"; }

# ---- the dump: analyze reads back the same error ----------------------------------------------------------------
for fam in needle first-causal; do
  d=$tmp/dump-$fam
  q kernel check fa3-fp8 --search "${small[@]}" --family "$fam" --dump "$d" --format json --threads 1 > "$tmp/s.json"
  check "$fam: exit 0 (fa3-fp8's contracts hold)" [ $? -eq 0 ]
  check "$fam: the dump holds q, k, v and a manifest" [ -f "$d/layer0_head0_q.npy" ] && [ -f "$d/layer0_head0_k.npy" ] \
    && [ -f "$d/layer0_head0_v.npy" ] && [ -f "$d/manifest.json" ]
  want=$(field "$tmp/s.json" 'j["search"]["families"][0]["error"]')
  q analyze --tensors "$d" --method fa3-fp8 --format json > "$tmp/a.json"
  got=$(field "$tmp/a.json" 'j["heads"][0]["O"]["rel_l1"]')
  check "$fam: analyze on the dump reports the search's O_rel_l1 ($want, got $got)" [ "$want" == "$got" ]
  causal=$(field "$d/manifest.json" 'j["causal"]')
  if [ "$fam" == first-causal ]; then want_causal=True; else want_causal=False; fi
  check "$fam: the manifest's causal is $want_causal" [ "$causal" == "$want_causal" ]
  check "$fam: the dump's mode is mkdir's (0777 less the umask)" [ "$(stat -c %a "$d")" == "$(printf '%o' $((0777 & ~$(umask))))" ]
done

# ---- threads do not change the result ----------------------------------------------------------------------------
one=$(q kernel check sage2@sm90 --search "${small[@]}" --threads 1 2>/dev/null)
two=$(q kernel check sage2@sm90 --search "${small[@]}" --threads 2 2>/dev/null)
check "sage2@sm90: --threads 1 and 2 print the same report" [ "$one" == "$two" ]
check "the report has a row per family" [ "$(grep -cE '^\| (max-jump|diffuse|first-causal|needle) \|' <<<"$one")" -eq 4 ]
other=$(q kernel check sage2@sm90 --search "${small[@]}" --seed 1 2>/dev/null)
check "another --seed draws other inputs" [ "$one" != "$other" ]

# ---- the search tells the P-path bugs from their fixes ------------------------------------------------------------
worst() {  # worst SPEC FAMILY: the family's worst O_rel_l1
  q kernel check "$1" --search --budget 24 --d 64 --max-keys 2048 --family "$2" --format json > "$tmp/w.json" 2>/dev/null
  field "$tmp/w.json" 'j["search"]["families"][0]["error"]'
}
q kernel show fa3-fp8 > "$tmp/fa3.json"
flush=$(worst "file:$tmp/fa3.json,p.offset=0" diffuse)
prescaled=$(worst "file:$tmp/fa3.json,p.offset=0,p.scale=256" diffuse)
check "diffuse rows: P~ in (0, 1] cast to E4M3 ($flush) errs at least twice as much as with the 2^8 pre-scale ($prescaled)" \
  "$py" -c "import sys; sys.exit(not float(sys.argv[1]) >= 2 * float(sys.argv[2]))" "$flush" "$prescaled"
broken=$(worst fa4-fp8 needle)
fixed=$(worst fa4-fp8@no-threshold needle)
check "needle: fa4-fp8's rescale threshold ($broken) errs at least 4 times as much as without it ($fixed)" \
  "$py" -c "import sys; sys.exit(not float(sys.argv[1]) >= 4 * float(sys.argv[2]))" "$broken" "$fixed"

# --fail-above: exit 1 past the bound, 0 within it
expect 1 "worst: needle" "--fail-above below the worst error: exit 1" -- kernel check fa4-fp8@no-threshold --search \
  --budget 4 --d 64 --max-keys 512 --family needle --fail-above 1e-9
expect 0 "worst: needle" "--fail-above above it: exit 0" -- kernel check fa4-fp8@no-threshold --search --budget 4 --d 64 \
  --max-keys 512 --family needle --fail-above 100

# ---- refused, nothing written -------------------------------------------------------------------------------------
mkdir "$tmp/exists"
expect 3 "--dump.*exists" "--dump of an existing directory" -- kernel check fa3-fp8 --search --budget 1 --d 64 \
  --max-keys 256 --dump "$tmp/exists"
check "the existing directory is left empty" [ -z "$(ls -A "$tmp/exists")" ]
expect 3 "--dump.*parent" "--dump under a missing directory" -- kernel check fa3-fp8 --search --budget 1 --d 64 \
  --max-keys 256 --dump "$tmp/no/such/dir"
check "no staging directory is left behind" [ -z "$(ls -A "$tmp" | grep qattn-search)" ]
expect 2 "--budget" "--budget 0" -- kernel check fa3-fp8 --search --budget 0
expect 2 "--metric.*O_rel_l1" "--metric that the search does not maximise" -- kernel check fa3-fp8 --search --metric P_kl
expect 2 "--family.*max-jump" "an unknown --family" -- kernel check fa3-fp8 --search --family spiky
expect 2 "--budget.*--search only" "--budget without --search" -- kernel check fa3-fp8 --budget 4
expect 2 "not a flash kernel" "a method that is not a flash kernel" -- kernel check fp32 --search --budget 1
expect 2 "--max-keys.*max-jump needs keys past the kernel's key block \(128\)" "max-jump without a block boundary" -- \
  kernel check sage2@sm90 --search --budget 1 --max-keys 64
expect 0 "first-causal" "--max-keys below the key block without max-jump" -- kernel check sage2@sm90 --search --budget 1 \
  --max-keys 64 --family first-causal

# a kernel given as a path: the command the report prints runs as printed; "DIR/" names DIR
q kernel show fa3-fp8 > "$tmp/k.json"
out=$(q kernel check "$tmp/k.json" --search --budget 2 --d 64 --max-keys 512 --family needle --dump "$tmp/slash/" 2>/dev/null)
check "a dump named with a trailing slash is written" [ -f "$tmp/slash/manifest.json" ]
check "the report names the path as file:PATH" [ -n "$(grep -F -- "--method file:$tmp/k.json)" <<<"$out")" ]
check "that command runs" q analyze --tensors "$tmp/slash" --method "file:$tmp/k.json" --summary --columns O_rel_l1

# JSON keeps a non-finite error as text: V per channel to 448 on the f16 accumulator overflows it
q kernel show sage2@sm89 > "$tmp/sm89.json"
q kernel check "file:$tmp/sm89.json,v.max=0" --search --budget 2 --d 64 --max-keys 512 --family needle --format json \
  > "$tmp/inf.json" 2>/dev/null
check "an overflowing output's error is \"inf\" in the JSON" [ "$(field "$tmp/inf.json" 'j["search"]["families"][0]["error"]')" == "'inf'" ]

echo "kernel_search: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
