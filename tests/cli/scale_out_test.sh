#!/usr/bin/env bash
# Sharded analyze and sweep, and qattn merge (docs/scale-out.md): the GNU parallel one-liners of the doc on the
# embedded sample give the unsharded tables byte for byte, in every format; sets with a shard missing, given twice,
# from another run or read from inputs that changed are refused, and nothing is written.
#
#   scale_out_test.sh QATTN_BINARY REPO_ROOT
source "$(dirname "$0")/lib.sh"

command -v parallel >/dev/null || { echo "FAIL: GNU parallel is not installed (scripts/install-deps.sh installs it)"; exit 1; }

# shards NAME N ARGS...: runs `qattn ARGS --shard K/N` for K = 0..N-1 with GNU parallel (as docs/scale-out.md does),
# parts in $tmp/NAME/
shards() {
  local name=$1 n=$2
  shift 2
  mkdir -p "$tmp/$name"
  parallel --halt now,fail=1 -j 4 "$bin" "$@" --shard '{}'/"$n" --out "$tmp/$name/part-{}.json" ::: $(seq 0 $((n - 1))) \
    </dev/null 2>"$tmp/$name.log" || { echo "FAIL: $name: a shard failed"; cat "$tmp/$name.log"; fail=$((fail + 1)); return 1; }
}
# same NAME FULL_FILE [MERGE_OPTIONS...]: merges $tmp/NAME/part-*.json and compares with FULL_FILE byte for byte
same() {
  local name=$1 full=$2
  shift 2
  if ! q merge "$tmp/$name"/part-*.json --out "$tmp/$name.merged" "$@" 2>>"$tmp/$name.log"; then
    echo "FAIL: $name: merge failed"; cat "$tmp/$name.log"; fail=$((fail + 1)); return
  fi
  check "$name $*: merged table equals the unsharded one byte for byte" cmp "$full" "$tmp/$name.merged"
}

# --- the doc's one-liners: 4 shards of a sweep and of an analyze -------------------------------------------------
q sweep --method index@paper --grid b=4:8 --grid c=6:2:12 >"$tmp/sweep.csv" 2>/dev/null
shards sweep 4 sweep --method index@paper --grid b=4:8 --grid c=6:2:12 && same sweep "$tmp/sweep.csv"
q sweep --method index@paper --grid b=4:8 --grid c=6:2:12 --format md >"$tmp/sweep.md" 2>/dev/null
same sweep "$tmp/sweep.md" --format md
q sweep --method exaq --grid bits=2,3 --metric kl --target P >"$tmp/sweep-kl.csv" 2>/dev/null
shards sweep-kl 3 sweep --method exaq --grid bits=2,3 --metric kl --target P && same sweep-kl "$tmp/sweep-kl.csv"
# More shards than points: shards own part of a point's heads (and read only those), some own nothing; a method that
# ranks a layer's heads makes its shards read whole layers.
shards sweep-kl-7 7 sweep --method exaq --grid bits=2,3 --metric kl --target P && same sweep-kl-7 "$tmp/sweep-kl.csv"
shards sweep-kl-23 23 sweep --method exaq --grid bits=2,3 --metric kl --target P && same sweep-kl-23 "$tmp/sweep-kl.csv"
check "sweep shard 3/7 (heads 6, 7 of point 0 and head 0 of point 1) reads only those heads and the manifest" /usr/bin/python3 -c "
import json, os, sys
d = json.load(open(sys.argv[1]))
names = sorted(os.path.basename(f) for f in d['provenance']['inputs'])
heads = sorted({(r['head']['layer'], r['head']['head']) for r in d['result']['rows']})
sys.exit(not (heads == [(0, 0), (1, 2), (1, 3)] and len(names) == 10))" "$tmp/sweep-kl-7/part-3.json"  # units 6..8 of 16
# Head-major: N dividing the heads gives each shard whole heads, every point on them
shards sweep-hm 8 sweep --method exaq --grid bits=2,3 --metric kl --target P --order head-major &&
  same sweep-hm "$tmp/sweep-kl.csv"
check "head-major sweep shard 0/8 holds head (0, 0) at both points and reads only its files" /usr/bin/python3 -c "
import json, os, sys
d = json.load(open(sys.argv[1]))
names = sorted(os.path.basename(f) for f in d['provenance']['inputs'])
units = sorted((r['point'], r['head']['layer'], r['head']['head']) for r in d['result']['rows'])
sys.exit(not (units == [(0, 0, 0), (1, 0, 0)] and len(names) == 4))" "$tmp/sweep-hm/part-0.json"
# The sweep streams over (head, block) items: its table does not depend on the thread count
q sweep --method exaq --grid bits=2,3 --metric kl --target P --threads 1 >"$tmp/sweep-kl-1.csv" 2>/dev/null
q sweep --method exaq --grid bits=2,3 --metric kl --target P --threads 3 >"$tmp/sweep-kl-3.csv" 2>/dev/null
check "sweep --threads 1 and 3 give the same bytes" cmp "$tmp/sweep-kl-1.csv" "$tmp/sweep-kl-3.csv"
check "sweep --threads 1 gives the default run's bytes" cmp "$tmp/sweep-kl-1.csv" "$tmp/sweep-kl.csv"
q sweep --method turbo:mode=decode,nh=1 --grid kv=2,4 >"$tmp/sweep-turbo.csv" 2>/dev/null
shards sweep-turbo 5 sweep --method turbo:mode=decode,nh=1 --grid kv=2,4 && same sweep-turbo "$tmp/sweep-turbo.csv"

methods=(--method index@paper --method exaq --method intattention --method fp16)
q analyze "${methods[@]}" >"$tmp/analyze.md" 2>/dev/null
shards analyze 4 analyze "${methods[@]}" && same analyze "$tmp/analyze.md"
for f in csv latex json; do
  q analyze "${methods[@]}" --format "$f" >"$tmp/analyze.$f" 2>/dev/null
  same analyze "$tmp/analyze.$f" --format "$f"
done

# Blocks that cut layers in two, with methods and quantizers that look across a layer's heads (their shards read
# whole layers), softmax-only dumps, and more shards than heads (some shards empty).
for args in "3|--method turbo:nh=1 --method turbo" "3|--kv kivi --method intattention" \
            "5|--softmax-only --reference exact --method index@paper --method fp64" "11|--method sas --format csv" \
            "3|--weights rtn:bits=4 --method fp32"; do
  n=${args%%|*}
  read -ra a <<<"${args#*|}"
  name="analyze-$n-${a[1]//[^a-z0-9]/}"
  q analyze "${a[@]}" >"$tmp/$name.full" 2>/dev/null
  shards "$name" "$n" analyze "${a[@]}" && same "$name" "$tmp/$name.full"
done

# --- the streamed evaluation (docs/streaming.md): threads, block rows and shards give the same bytes ------------
# Every default method (streamed ones and whole-head ones side by side), causal and not (the blocks shift the causal
# diagonal), on the embedded sample's L = 128 heads: 1, 2 and 3 threads, blocks of 64, 128 and 192 rows, and a
# 3-way shard + merge all give the unthreaded table byte for byte, and so does every method on whole calls.
for causal in plain causal; do
  src="$tmp/stream-src-$causal"
  mkdir -p "$src"
  for f in "$(dirname "$0")"/../../experiments/data/use-lite/layer1_head[01]_[qkv].npy; do cp "$f" "$src/"; done
  [ "$causal" = causal ] && echo '{"causal": true}' >"$src/manifest.json"
  q analyze --tensors "$src" --threads 1 --block-rows 64 --format json >"$tmp/stream-$causal.json" 2>/dev/null
  check "streamed analyze ($causal) ran" test -s "$tmp/stream-$causal.json"
  for run in "2 64" "3 64" "1 128" "2 192" "1 0"; do
    read -r t b <<<"$run"
    q analyze --tensors "$src" --threads "$t" --block-rows "$b" --format json >"$tmp/stream-$causal-$t-$b.json" 2>/dev/null
    check "analyze ($causal) --threads $t --block-rows $b equals --threads 1 --block-rows 64 byte for byte" \
      cmp "$tmp/stream-$causal.json" "$tmp/stream-$causal-$t-$b.json"
  done
  shards "stream-$causal" 3 analyze --tensors "$src" --threads 2 --block-rows 128 --format json &&
    same "stream-$causal" "$tmp/stream-$causal.json" --format json
  # Streamed (each method's first pass in prepare(), then blocks) against every method on whole calls, on the fused
  # kernels and on the reference models
  q analyze --tensors "$src" --whole-calls --format json >"$tmp/whole-$causal.json" 2>/dev/null
  check "analyze ($causal): streamed equals --whole-calls byte for byte" cmp "$tmp/stream-$causal.json" "$tmp/whole-$causal.json"
  q analyze --tensors "$src" --engine reference --block-rows 64 --format json >"$tmp/stream-ref-$causal.json" 2>/dev/null
  q analyze --tensors "$src" --engine reference --whole-calls --format json >"$tmp/whole-ref-$causal.json" 2>/dev/null
  check "analyze ($causal) --engine reference: streamed equals --whole-calls byte for byte" \
    cmp "$tmp/stream-ref-$causal.json" "$tmp/whole-ref-$causal.json"
done
# EXAQ calibrated over its first calls (traits.calls_in_order): its calls stay in dump order on any thread count.
q analyze --method exaq:calib=3 --method fp16 --threads 1 --format json >"$tmp/calib-1.json" 2>/dev/null
q analyze --method exaq:calib=3 --method fp16 --threads 2 --format json >"$tmp/calib-2.json" 2>/dev/null
check "calibrated exaq: --threads 2 equals --threads 1 byte for byte" cmp "$tmp/calib-1.json" "$tmp/calib-2.json"
expect 2 "block-rows.*multiple of 64" "--block-rows 100 is refused" -- analyze --block-rows 100

# --- what a part records ---------------------------------------------------------------------------------------
part="$tmp/analyze/part-1.json"
version=$(q --version | awk '{print $2}')
check "a part records the qattn version" grep -q "\"version\": \"$version\"" "$part"
check "a part records shard 1 of 4" /usr/bin/python3 -c "
import json, sys; d = json.load(open(sys.argv[1])); s = d['provenance']['shard']; sys.exit(s != {'index': 1, 'count': 4})" "$part"
check "a part records the SHA-256 of every file it read, and reads only its own heads (and the manifest)" /usr/bin/python3 -c "
import hashlib, json, os, sys
d = json.load(open(sys.argv[1]))
inputs = d['provenance']['inputs']
names = sorted(os.path.basename(f) for f in inputs)
ok = all(hashlib.sha256(open(f, 'rb').read()).hexdigest() == h for f, h in inputs.items())
sys.exit(not (ok and names == ['layer0_head2_k.npy', 'layer0_head2_q.npy', 'layer0_head2_v.npy',
                               'layer0_head3_k.npy', 'layer0_head3_q.npy', 'layer0_head3_v.npy', 'manifest.json']))" "$part"

# --- refused sets: exit 3, the missing or foreign part named, nothing written ------------------------------------
p=("$tmp"/analyze/part-{0,1,2,3}.json)
expect 3 "incomplete: 1 of 4 shards missing \(2/4\)" "a missing shard is named" -- merge "${p[0]}" "${p[1]}" "${p[3]}" --out "$tmp/no.md"
expect 3 "shard 1/4 is given twice" "a shard given twice is refused" -- merge "${p[@]}" "${p[1]}" --out "$tmp/no.md"
cp "${p[1]}" "$tmp/copy-of-1.json"
expect 3 "shard 1/4 is given twice \(also .*part-1.json\)" "the same shard under two names is refused" -- \
  merge "${p[@]}" "$tmp/copy-of-1.json" --out "$tmp/no.md"
expect 3 "sweep-kl/part-0.json: provenance.command: foreign part" "a part of another command is named" -- \
  merge "${p[@]}" "$tmp/sweep-kl/part-0.json" --out "$tmp/no.md"
q analyze --method index@paper --method exaq --method intattention --method fp32 --shard 2/4 --out "$tmp/other.json" 2>/dev/null
expect 3 "other.json: provenance.options.method\[3\]: foreign part: \"fp32\" here, \"fp16\"" \
  "a part of a run with other methods is named, with the option that differs" -- \
  merge "${p[0]}" "${p[1]}" "$tmp/other.json" "${p[3]}" --out "$tmp/no.md"
q analyze "${methods[@]}" --shard 0/3 --out "$tmp/of-three.json" 2>/dev/null
expect 3 "of-three.json: provenance.shard.count: foreign part: 3 here, 4" "parts of different shard counts are refused" -- \
  merge "${p[@]}" "$tmp/of-three.json" --out "$tmp/no.md"
echo '{"rows": []}' >"$tmp/not-a-part.json"
expect 3 "not-a-part.json: qattn_partial: is not a partial result" "a JSON file that is not a part is refused" -- \
  merge "$tmp/not-a-part.json" --out "$tmp/no.md"
# edit IN OUT CODE [--keep-digest]: part IN as `d`, changed by the Python CODE and written to OUT, its
# provenance.result_sha256 recomputed (the SHA-256 of the result's compact form, keys sorted, every number spelled as
# the part spells it) unless --keep-digest
cat >"$tmp/edit.py" <<'PY'
import hashlib, json, re, sys
raw = lambda s: '\x00N' + s
d = json.load(open(sys.argv[1]), parse_float=raw, parse_int=raw)
exec(sys.argv[3])
def dump(v, **kw):
    return re.sub(r'"\\u0000N([^"]*)"', r'\1', json.dumps(v, sort_keys=True, ensure_ascii=False, **kw))
if sys.argv[4:] != ['--keep-digest']:
    d['provenance']['result_sha256'] = hashlib.sha256(dump(d['result'], separators=(',', ':')).encode()).hexdigest()
open(sys.argv[2], 'w').write(dump(d, indent=1))
PY
edit() { /usr/bin/python3 "$tmp/edit.py" "$@"; }
edit "${p[1]}" "$tmp/resealed.json" "pass"
check "a part read and written again by the test's editor keeps its SHA-256" cmp <(grep result_sha256 "${p[1]}") \
  <(grep result_sha256 "$tmp/resealed.json")
edit "${p[0]}" "$tmp/old-layout.json" "d['result']['view']['specs'] = [m['label'] for m in d['result']['view'].pop('methods')]"
expect 3 "old-layout.json: result: is not a result this qattn reads" "a part of another layout is named, not a crash" -- \
  merge "$tmp/old-layout.json" "${p[1]}" "${p[2]}" "${p[3]}" --out "$tmp/no.md"
printf 'not json' >"$tmp/garbage.json"
expect 3 "garbage.json: json: is not JSON" "a file that is not JSON is refused" -- merge "$tmp/garbage.json" --out "$tmp/no.md"
expect 3 "analyze: file: is not a regular file" "a directory given as a part is refused" -- merge "$tmp/analyze" --out "$tmp/no.md"
check "no output is left by a refused merge" test ! -e "$tmp/no.md"

# An input that changes between shards (same size, other bytes): 2 shards of 2 points each read the whole dump.
cp -r "$root/experiments/data/use-lite" "$tmp/dump"
q sweep --method exaq --grid bits=2,3 --tensors "$tmp/dump" --shard 0/2 --out "$tmp/changed-0.json" 2>/dev/null
/usr/bin/python3 -c "
import numpy as np, sys
a = np.load(sys.argv[1]); a.flat[0] += 1; np.save(sys.argv[1], a)" "$tmp/dump/layer1_head3_v.npy"
q sweep --method exaq --grid bits=2,3 --tensors "$tmp/dump" --shard 1/2 --out "$tmp/changed-1.json" 2>/dev/null
expect 3 "changed-1.json: provenance.inputs.*layer1_head3_v.npy: foreign part: it read .* with SHA-256 [0-9a-f]{64}, .*changed-0.json read it with [0-9a-f]{64}" \
  "an input that changed between shards is named, with both hashes" -- merge "$tmp/changed-0.json" "$tmp/changed-1.json"

# --- parts that lie: each is refused (exit 3, the part and the field named, nothing written), and no merge hangs ----
saved_emu=("${emu[@]}")
emu=(timeout -s KILL 60 "${emu[@]}")  # a merge that hangs is killed and fails its check
lying() {  # lying WHAT PATTERN PARTS...: merge PARTS is refused with PATTERN, and nothing is written
  local what=$1 pattern=$2
  shift 2
  expect 3 "$pattern" "$what" -- merge "$@" --out "$tmp/no.md"
  check "$what: nothing is written" test ! -e "$tmp/no.md"
  rm -f "$tmp/no.md"
}
# The shard: an integer count in [1, 1000000] (a part of count -3 or 10^12 hung the merge in its missing-shard loop;
# 0 and 2^64+3 made one part of 4 a complete set), an integer index below it (7, -1, 1.5 counted a part's heads twice)
for count in -3 1000000000000 0 18446744073709551619; do
  edit "${p[3]}" "$tmp/count.json" "d['provenance']['shard']['count'] = $count"
  lying "a shard count of $count is refused" "count.json: provenance.shard.count: .* is not an integer in \[1, 1000000\]" \
    "$tmp/count.json"
done
for index in 7 -1 1.5; do
  edit "${p[3]}" "$tmp/index.json" "d['provenance']['shard']['index'] = $index"
  lying "a shard index of $index is refused" "index.json: provenance.shard.index: " "${p[0]}" "${p[1]}" "${p[2]}" "$tmp/index.json"
done
edit "${p[1]}" "$tmp/alone.json" "d['provenance']['shard'] = {'index': 0, 'count': 1}"
lying "a part of 2 heads relabelled as the whole run (shard 0/1) is refused" \
  "alone.json: result.rows: 8 rows, where shard 0/1's block \(units 0 to 8 of 8\) holds 32" "$tmp/alone.json"
# The rows: exactly the part's own (layer, head) x methods, each once
edit "${p[1]}" "$tmp/foreign-row.json" "
o = json.load(open('${p[2]}'), parse_float=raw, parse_int=raw)
d['result']['rows'][0] = o['result']['rows'][0]"
lying "a part holding another shard's row is refused" \
  "foreign-row.json: result.rows\[0\]: layer 1 head 0 \(.*\) is unit 4 of the run, outside shard 1/4's block" \
  "${p[0]}" "$tmp/foreign-row.json" "${p[2]}" "${p[3]}"
edit "${p[1]}" "$tmp/row-twice.json" "d['result']['rows'][1] = d['result']['rows'][0]"
lying "a part holding a row twice is refused" "row-twice.json: result.rows\[1\]: layer 0 head 2 \(.*\) is given twice" \
  "${p[0]}" "$tmp/row-twice.json" "${p[2]}" "${p[3]}"
edit "${p[1]}" "$tmp/row-missing.json" "del d['result']['rows'][3]"
lying "a part with a row missing is refused" "row-missing.json: result.rows: 7 rows, where shard 1/4's block .* holds 8" \
  "${p[0]}" "$tmp/row-missing.json" "${p[2]}" "${p[3]}"
edit "${p[1]}" "$tmp/other-method.json" "d['result']['rows'][0]['method'] = 'fp32'"
lying "a row of a method the run does not have is refused" "other-method.json: result.rows\[0\].method: 'fp32' is not a method of the run" \
  "${p[0]}" "$tmp/other-method.json" "${p[2]}" "${p[3]}"
# Sweep parts: exactly their own (point, head) pairs, and a point's values the same in every part (3 shards of
# 2 points x 8 heads: part 0 holds point 0, heads 0-4; part 1 point 0, heads 5-7 and point 1, heads 0-1)
s=("$tmp"/sweep-kl/part-{0,1,2}.json)
edit "${s[0]}" "$tmp/sweep-twice.json" "d['result']['rows'][1]['head'] = d['result']['rows'][0]['head']"
lying "a sweep part with one head's row in place of another's is refused" \
  "sweep-twice.json: result.rows\[1\]: point 0, layer 0 head 0 is given twice" "$tmp/sweep-twice.json" "${s[1]}" "${s[2]}"
edit "${s[0]}" "$tmp/sweep-foreign.json" "
o = json.load(open('${s[2]}'), parse_float=raw, parse_int=raw)
d['result']['rows'][0] = o['result']['rows'][0]"
lying "a sweep part holding another shard's (point, head) is refused" \
  "sweep-foreign.json: result.rows\[0\]: point 1, layer 0 head 2 is unit 10 of the run, outside shard 0/3's block" \
  "$tmp/sweep-foreign.json" "${s[1]}" "${s[2]}"
edit "${s[1]}" "$tmp/sweep-values.json" "d['result']['rows'][0]['values'] = ['3']"
lying "sweep parts that give a point different values are refused" \
  "sweep-values.json: result.rows\[0\]: point 0 has other values or another method here than in .*part-0.json" \
  "${s[0]}" "$tmp/sweep-values.json" "${s[2]}"
# The digest: a number edited after the part was written, and a part of the previous format
edit "${p[1]}" "$tmp/edited.json" "d['result']['rows'][0]['O']['cossim'] = 0.5" --keep-digest
lying "a part whose result was edited is refused" \
  "edited.json: provenance.result_sha256: the result's SHA-256 is [0-9a-f]{64}, the part records [0-9a-f]{64}" \
  "${p[0]}" "$tmp/edited.json" "${p[2]}" "${p[3]}"
edit "${p[1]}" "$tmp/format-1.json" "d['qattn_partial'] = 1" --keep-digest
lying "a part of format 1 is refused with the reason" "format-1.json: qattn_partial: format 1, this qattn reads format 2" \
  "${p[0]}" "$tmp/format-1.json" "${p[2]}" "${p[3]}"
# Size: a file over the cap is refused before it is read; a part is checked while it is parsed, so a 100 MB file
# whose first key is wrong, or a part whose rows outnumber its block, is refused within 1 GB of address space
truncate -s 300M "$tmp/huge.json"
lying "a part over 256 MiB is refused unread" "huge.json: file: 314572800 bytes, more than the 268435456" "$tmp/huge.json"
/usr/bin/python3 -c "
import sys; open(sys.argv[1], 'w').write('{\"aaa\": [' + '0,' * 50000000 + '0]}')" "$tmp/bloated.json"
/usr/bin/python3 -c "
import json, sys
t = open(sys.argv[1]).read()
start = t.index('\"rows\": [') + len('\"rows\": ')
end = start + json.JSONDecoder().raw_decode(t[start:])[1]
open(sys.argv[2], 'w').write(t[:start] + '[' + ','.join([t[start + 1:end - 1]] * 6000) + ']' + t[end:])" \
  "${p[1]}" "$tmp/many-rows.json"  # 48000 rows, 90 MB
# A 1 GB address space, where no sanitizer's shadow memory needs more (ASan reserves terabytes of it)
if ! sanitized; then
  emu=(prlimit --as=1000000000 -- "${emu[@]}")
fi
lying "a 100 MB file that is not a part is refused at its first key" \
  "bloated.json: qattn_partial: is not a partial result .*: it has a key 'aaa'" "$tmp/bloated.json"
lying "a part with more rows than its block is refused at the first row too many" \
  "many-rows.json: result.rows: holds more than the 8 rows of shard 1/4's block" \
  "${p[0]}" "$tmp/many-rows.json" "${p[2]}" "${p[3]}"
emu=("${saved_emu[@]}")
rm -f "$tmp/huge.json" "$tmp/bloated.json" "$tmp/many-rows.json"

# --- bad --shard values: exit 2 before any work ------------------------------------------------------------------
expect 2 "K counts from 0 and must be below N" "--shard 4/4 is refused" -- analyze --shard 4/4
expect 2 "is not K/N" "--shard 1-4 is refused" -- sweep --method exaq --grid bits=2,3 --shard 1-4
expect 2 "N must be in \[1, 1000000\]" "--shard 0/0 is refused" -- analyze --shard 0/0
expect 2 "give --tensors, not --q/--k/--v" "--shard of explicit files is refused" -- \
  analyze --q "$root/experiments/data/use-lite/layer0_head0_q.npy" --k "$root/experiments/data/use-lite/layer0_head0_k.npy" \
  --v "$root/experiments/data/use-lite/layer0_head0_v.npy" --shard 0/2
expect 2 "'latex' is not one of csv\|md" "merge --format of a table the command does not write is refused" -- \
  merge "$tmp"/sweep/part-*.json --format latex --out "$tmp/no.md"
check "no output is left by a refused format" test ! -e "$tmp/no.md"

echo "scale-out tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
