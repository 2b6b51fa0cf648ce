#!/usr/bin/env bash
# Grouped-query attention (docs/dumping.md): a dump whose layers hold H_kv K/V heads for H_q query heads, and
# `qattn attention` on [..., H_kv, L, d] K/V, give byte for byte what the same data gives with K/V repeated per query
# head (Hugging Face's repeat_kv: query head h reads K/V head h / (H_q / H_kv)), for methods that run head by head and
# for those that rank a layer's heads; without a manifest the grouping is read from the files, a manifest's
# num_kv_heads is checked against them; counts that do not divide, k and v counts that differ and a manifest that
# contradicts the files are refused naming both counts, and nothing is written; shards merge to the unsharded table.
#
#   gqa_test.sh QATTN_BINARY REPO_ROOT [EMULATOR...]
set -uo pipefail
source "$(dirname "$0")/lib.sh" "$@"
py=/usr/bin/python3
if ! $py -c "import numpy" 2>/dev/null; then echo "gqa_test: needs /usr/bin/python3 with numpy"; exit 1; fi
cd "$tmp" || exit 1

# g/: 2 layers of 4 query heads over 2 K/V heads (B = 2, L = 80, d = 16), with the projections --weights reads;
# r/: the same with K/V (and wk, wv, bk, bv) repeated per query head. Layer 1 is causal in both manifests.
$py - <<'PY'
import json, os
import numpy as np
rng = np.random.default_rng(50)
B, L, D, HQ, HKV, DM = 2, 80, 16, 4, 2, 24
G = HQ // HKV
for d in ("g", "r", "odd", "kv_differ", "nodiv"):
    os.makedirs(d)
np.save("q4.npy", rng.standard_normal((B, HQ, L, D)).astype(np.float32) * 2)
for layer in range(2):
    x = rng.standard_normal((B, L, DM)).astype(np.float32)
    w = {k: (rng.standard_normal((DM, (HQ if k == "q" else HKV) * D)) / 3).astype(np.float32) for k in "qkv"}
    b = {k: (rng.standard_normal(w[k].shape[1]) / 4).astype(np.float32) for k in "qkv"}
    y = {k: (x @ w[k] + b[k]).reshape(B, L, -1, D) for k in "qkv"}  # [B, L, heads, D]
    for dump in ("g", "r"):
        np.save(f"{dump}/layer{layer}_attn_input.npy", x)
        for k in "qkv":
            rep = k != "q" and dump == "r"
            wk = np.repeat(w[k].reshape(DM, HKV, D), G, axis=1).reshape(DM, -1) if rep else w[k]
            bk = np.repeat(b[k].reshape(HKV, D), G, axis=0).reshape(-1) if rep else b[k]
            np.save(f"{dump}/layer{layer}_w{k}.npy", wk)
            np.save(f"{dump}/layer{layer}_b{k}.npy", bk)
            heads = HQ if k == "q" or rep else HKV
            for h in range(heads):
                np.save(f"{dump}/layer{layer}_head{h}_{k}.npy", np.ascontiguousarray(y[k][:, :, h // G if rep else h]))
manifest = {"layers": [{"layer": 1, "causal": True}]}
for dump in ("g", "r"):
    json.dump(manifest, open(f"{dump}/manifest.json", "w"))
# attention inputs: [B, H_q, L, d] Q with [B, H_kv, L, d] K/V and their repeats; [H, L, d] likewise
q4 = np.load("q4.npy")
k4, v4 = (rng.standard_normal((B, HKV, L, D)).astype(np.float32) for _ in range(2))
np.save("k4.npy", k4); np.save("v4.npy", v4)
np.save("k4r.npy", np.repeat(k4, G, axis=1)); np.save("v4r.npy", np.repeat(v4, G, axis=1))
np.save("q3.npy", q4[0]); np.save("k3.npy", k4[0]); np.save("v3.npy", v4[0])
np.save("k3r.npy", np.repeat(k4[0], G, axis=0)); np.save("v3r.npy", np.repeat(v4[0], G, axis=0))
np.save("k4_3.npy", rng.standard_normal((B, 3, L, D)).astype(np.float32))
np.save("v4_1.npy", rng.standard_normal((B, 1, L, D)).astype(np.float32))
# refused dumps: 4 query heads over 3 K/V heads; 2 k heads and 1 v head
for h in range(4):
    np.save(f"odd/layer0_head{h}_q.npy", q4[:, h]); np.save(f"nodiv/layer0_head{h}_q.npy", q4[:, h])
    np.save(f"kv_differ/layer0_head{h}_q.npy", q4[:, h])
for h in range(3):
    for k in "kv":
        np.save(f"odd/layer0_head{h}_{k}.npy", k4[:, 0])
for h in range(2):
    np.save(f"kv_differ/layer0_head{h}_k.npy", k4[:, h])
np.save("kv_differ/layer0_head0_v.npy", v4[:, 0])
PY

# --- analyze: the GQA dump equals the repeated one, byte for byte ----------------------------------------------
# fp32 and sas stream head by head; intattention is a fused integer pipeline; turbo with nh=1 ranks a layer's heads
# (its 2-bit KV head), and so does flashq@mixed as a KV quantizer: each gets the same K/V view for a group's heads.
for args in "--method fp32 --method sas" "--method intattention" "--method turbo:mode=decode,nh=1 --method turbo" \
            "--kv flashq@mixed --method fp32" "--weights rtn:bits=4 --method fp32" "--method quant-only --whole-calls"; do
  read -ra a <<<"$args"
  q analyze --tensors g "${a[@]}" --format json >g.json 2>g.err
  q analyze --tensors r "${a[@]}" --format json >r.json 2>r.err
  check "analyze $args on the GQA dump ran ($(head -c 300 g.err))" test -s g.json
  # the tables name their dump directory: compare with it replaced
  check "analyze $args: the GQA dump gives the repeated dump's table byte for byte" \
    cmp <(sed 's#"g"#"DUMP"#g; s#[^"]*/g"#DUMP"#g' g.json) <(sed 's#"r"#"DUMP"#g; s#[^"]*/r"#DUMP"#g' r.json)
done
q analyze --tensors g --method fp32 --format csv >g.csv 2>/dev/null
check "analyze reports one row per query head: 8 heads, mean and worst" test "$(grep -c . g.csv)" -eq 11
# the threads and the blocks of query rows do not change a GQA dump's bytes either
q analyze --tensors g --method quant-only --threads 1 --block-rows 64 --format csv >g1.csv 2>/dev/null
q analyze --tensors g --method quant-only --threads 3 --block-rows 128 --format csv >g3.csv 2>/dev/null
check "GQA analyze: --threads 1 --block-rows 64 equals --threads 3 --block-rows 128" cmp g1.csv g3.csv

# --- the manifest: num_kv_heads read and checked ---------------------------------------------------------------
cp -r g gm
echo '{"layers": [{"layer": 0, "num_heads": 4, "num_kv_heads": 2}, {"layer": 1, "causal": true, "num_kv_heads": 2}]}' \
  >gm/manifest.json
q analyze --tensors gm --method fp32 --format csv >gm.csv 2>/dev/null
check "a manifest's num_kv_heads equal to the files' is accepted (same table)" cmp g.csv <(sed 's#gm#g#' gm.csv)
echo '{"layers": [{"layer": 0, "num_kv_heads": 1}]}' >gm/manifest.json
expect 3 "gm/manifest.json: layers\[0\].num_kv_heads: says 1 K/V heads, the dump has 2 \(k and v files of layer 0, for 4 query heads\)" \
  "a manifest's num_kv_heads below the files' is refused, naming both counts" -- analyze --tensors gm --method fp32
cp -r r rm
echo '{"layers": [{"layer": 1, "num_kv_heads": 2, "causal": true}]}' >rm/manifest.json
expect 3 "rm/manifest.json: layers\[1\].num_kv_heads: says 2 K/V heads, the dump has 4" \
  "a manifest's num_kv_heads on a dump with K/V per query head is refused, naming both counts" -- \
  analyze --tensors rm --method fp32
echo '{"layers": [{"layer": 1, "num_kv_heads": 4, "causal": true}]}' >rm/manifest.json
q analyze --tensors rm --method fp32 --format csv >rm.csv 2>/dev/null
check "num_kv_heads = num_heads on a dump with K/V per query head reads as before" test "$(grep -c . rm.csv)" -eq 11

# --- dumps refused, naming both counts ---------------------------------------------------------------------------
expect 3 "odd: --tensors: layer 0 has 4 q heads, 3 k and v heads: grouped-query attention needs the K/V head count to divide the query head count" \
  "3 K/V heads for 4 query heads are refused" -- analyze --tensors odd --method fp32
expect 3 "kv_differ: --tensors: layer 0 has 4 q heads, 2 k heads and 1 v heads: grouped-query attention needs as many k heads as v heads \(layer0_head1_v.npy is missing\)" \
  "k and v head counts that differ are refused" -- analyze --tensors kv_differ --method fp32
# --weights: K and V project onto the K/V heads; weights of another width are refused naming both
cp -r g gw
cp r/layer0_wk.npy r/layer0_bk.npy r/layer0_wv.npy r/layer0_bv.npy gw/
expect 3 "gw/layer0_wk.npy: shape: 64 outputs, but the dump's layer 0 has 2 K/V heads of d = 16" \
  "--weights: wk of the query heads' width on a GQA dump is refused" -- analyze --tensors gw --weights rtn --method fp32

# --- attention: [..., H_kv, L, d] K/V read in place -------------------------------------------------------------
for m in fp32 intattention turbo:mode=decode,nh=1 sage2; do
  q attention --q q4.npy --k k4.npy --v v4.npy --method "$m" --out o_g.npy --threads 2 2>o.err
  q attention --q q4.npy --k k4r.npy --v v4r.npy --method "$m" --out o_r.npy --threads 2 2>/dev/null
  check "attention --method $m on [2, 4, 80, 16] Q over [2, 2, 80, 16] K/V ran ($(head -c 300 o.err))" test -s o_g.npy
  check "attention --method $m: GQA equals K/V repeated, byte for byte" cmp o_g.npy o_r.npy
  rm -f o_g.npy o_r.npy
done
q attention --q q4.npy --k k4.npy --v v4.npy --method index --causal --out o_g.npy --probs p_g.npy 2>/dev/null
q attention --q q4.npy --k k4r.npy --v v4r.npy --method index --causal --out o_r.npy --probs p_r.npy 2>/dev/null
check "attention --probs --causal: GQA O equals K/V repeated" cmp o_g.npy o_r.npy
check "attention --probs --causal: GQA P equals K/V repeated" cmp p_g.npy p_r.npy
q attention --q q3.npy --k k3.npy --v v3.npy --method quant-only --out o3_g.npy 2>/dev/null
q attention --q q3.npy --k k3r.npy --v v3r.npy --method quant-only --out o3_r.npy 2>/dev/null
check "attention on [H, L, d]: the first axis is heads, GQA equals K/V repeated" cmp o3_g.npy o3_r.npy
expect 3 "k4_3.npy: shape: k and v have 3 heads \(axis -3 of \(2, 3, 80, 16\)\), q has 4 \(q4.npy, \(2, 4, 80, 16\)\): grouped-query attention needs the K/V head count to divide the query head count" \
  "attention: 3 K/V heads for 4 query heads are refused, naming both" -- \
  attention --q q4.npy --k k4_3.npy --v k4_3.npy --method fp32 --out bad.npy
expect 3 "v4_1.npy: shape: v has 1 heads \(axis -3 of \(2, 1, 80, 16\)\), k has 2" \
  "attention: K and V head counts that differ are refused, naming both" -- \
  attention --q q4.npy --k k4.npy --v v4_1.npy --method fp32 --out bad.npy
check "nothing written by a refused attention" test ! -e bad.npy
# analyze --q --k --v takes the same shapes: one row (the batch entries pooled), equal to the repeated run
q analyze --q q4.npy --k k4.npy --v v4.npy --method intattention --format csv >x_g.csv 2>x.err
q analyze --q q4.npy --k k4r.npy --v v4r.npy --method intattention --format csv >x_r.csv 2>/dev/null
check "analyze --q --k --v with [2, 2, 80, 16] K/V ran ($(head -c 300 x.err))" test -s x_g.csv
check "analyze --q --k --v: GQA equals K/V repeated" cmp x_g.csv x_r.csv
expect 3 "k4_3.npy: shape: k and v have 3 heads" "analyze --q --k --v: 3 K/V heads for 4 are refused" -- \
  analyze --q q4.npy --k k4_3.npy --v k4_3.npy --method fp32

# --- shards: blocks that cut a group, merged, give the unsharded table ----------------------------------------
# Shards record their inputs' SHA-256: a build without OpenSSL's libcrypto (the aarch64 cross build) runs none
probe=$(q analyze --tensors g --method fp32 --shard 0/1 --out probe.json 2>&1)
if grep -q "built without OpenSSL" <<<"$probe"; then
  echo "gqa_test: the --shard cases skipped (built without OpenSSL's libcrypto)"
else
  for args in "3|--method fp32 --method intattention" "5|--method turbo:mode=decode,nh=1" "3|--kv flashq@mixed --method fp32" \
              "11|--method sas"; do
    n=${args%%|*}
    read -ra a <<<"${args#*|}"
    q analyze --tensors g "${a[@]}" --format csv >full.csv 2>/dev/null
    rm -f part-*.json
    for ((k = 0; k < n; k++)); do q analyze --tensors g "${a[@]}" --format csv --shard "$k/$n" --out "part-$k.json"; done
    q merge part-*.json --out merged.csv 2>merge.err
    check "GQA analyze ${args#*|} in $n shards merges to the unsharded table ($(head -c 300 merge.err))" cmp full.csv merged.csv
  done
  # sweep: points x query heads, in shards that cut the groups
  q sweep --tensors g --method index@paper --grid b=4,6 --format csv >sweep.csv 2>/dev/null
  q sweep --tensors r --method index@paper --grid b=4,6 --format csv >sweep-r.csv 2>/dev/null
  check "sweep on the GQA dump equals the repeated dump's" test -s sweep.csv -a "$(cat sweep.csv)" = "$(cat sweep-r.csv)"
  rm -f part-*.json
  for k in 0 1 2 3 4; do q sweep --tensors g --method index@paper --grid b=4,6 --shard "$k/5" --out "part-$k.json"; done
  q merge part-*.json --out sweep-merged.csv 2>merge.err
  check "GQA sweep in 5 shards merges to the unsharded table ($(head -c 300 merge.err))" cmp sweep.csv sweep-merged.csv
  # shard 1/3 owns units 2..4 of 8, query heads 2, 3 of layer 0 and 0 of layer 1: it reads their groups' K/V heads, 1
  # of layer 0 and 0 of layer 1, and no other file
  q analyze --tensors g --method fp32 --shard 1/3 --out part.json 2>/dev/null
  check "a shard of a GQA dump reads its query heads and their groups' K/V heads only" $py -c "
import json, os, sys
d = json.load(open(sys.argv[1]))
names = sorted(os.path.basename(f) for f in d['provenance']['inputs'])
want = ['layer0_head1_k.npy', 'layer0_head1_v.npy', 'layer0_head2_q.npy', 'layer0_head3_q.npy', 'layer1_head0_k.npy',
        'layer1_head0_q.npy', 'layer1_head0_v.npy', 'manifest.json']
rows = sorted({(r['layer'], r['head']) for r in d['result']['rows']})
sys.exit(names != want or rows != [(0, 2), (0, 3), (1, 0)])" part.json
  expect 3 "odd: --tensors: layer 0 has 4 q heads, 3 k and v heads" "a shard of a dump whose counts do not divide refuses it too" -- \
    analyze --tensors odd --method fp32 --shard 3/4 --out part-odd.json
  check "no part written by the refused shard" test ! -e part-odd.json
fi

echo "gqa_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
