#!/usr/bin/env bash
# Hostile and careless use of the qattn program: outputs onto devices, FIFOs, symbolic links and inputs; writes
# that fail; empty, non-finite and overflowing tensors; grids, archives and headers built to exhaust memory; lenient
# inputs. Every case: the documented exit code (0, 2 usage, 3 bad input), a message naming what is wrong, no signal
# exit, nothing destroyed and nothing half-written (docs/tensor-io.md "Output files", docs/non-finite.md).
#
#   hardening_test.sh QATTN_BINARY REPO_ROOT [EMULATOR...]
set -uo pipefail
source "$(dirname "$0")/lib.sh" "$@"
py=/usr/bin/python3
if ! $py -c "import numpy" 2>/dev/null; then echo "hardening_test: needs /usr/bin/python3 with numpy"; exit 1; fi
sample=$root/experiments/data/use-lite
s=$sample/layer0_head0
cd "$tmp" || exit 1
# .npz needs libzip, which the cross build leaves out: its cases run where the build reads .npz
has_npz=0
q info "$root/tests/fixtures/deflated.npz" >/dev/null 2>&1 && has_npz=1

$py - <<'PY'
import numpy as np, json, os, zipfile, io
rng = np.random.default_rng(7)
for n in "qkv":
    np.save(f"{n}.npy", rng.standard_normal((1, 16, 8)).astype(np.float32))
# logits of Q = K = +-1e20: finite in float64 (up to 8e40), beyond float32 (3.4e38)
for n in ("qbig", "kbig"):
    np.save(f"{n}.npy", (rng.choice([-1.0, 1.0], (1, 16, 8)) * 1e20).astype(np.float32))
q = np.load("q.npy"); q[0, 3, 2] = np.nan; np.save("qnan.npy", q)
k = np.load("k.npy"); k[0, 5, 1] = np.inf; np.save("kinf.npy", k)
lg = rng.standard_normal((2, 6)); lg[1, 4] = np.nan; np.save("lognan.npy", lg)
lg = rng.standard_normal((2, 6)); lg[0, 2] = -np.inf; np.save("logmask.npy", lg)
a = rng.standard_normal((3, 4)); a[1, 2] = np.nan; np.save("selfnan.npy", a)
np.save("zero_b.npy", np.zeros((0, 16, 8), np.float32))
np.save("zero_logits.npy", np.zeros((0, 16, 16), np.float32))
os.makedirs("zdump"); os.makedirs("bigdump"); os.makedirs("mdump")
for n in "qkv":
    np.save(f"zdump/layer0_head0_{n}.npy", np.zeros((0, 16, 8), np.float32))
    np.save(f"mdump/layer0_head0_{n}.npy", np.load(f"{n}.npy"))
np.save("bigdump/layer0_head0_q.npy", np.load("qbig.npy")); np.save("bigdump/layer0_head0_k.npy", np.load("kbig.npy"))
np.save("bigdump/layer0_head0_v.npy", np.load("v.npy"))
os.makedirs("sdump")  # v misspelt: layer0_haed0_v.npy
np.save("sdump/layer0_head0_q.npy", np.load("q.npy")); np.save("sdump/layer0_head0_k.npy", np.load("k.npy"))
np.save("sdump/layer0_haed0_v.npy", np.load("v.npy"))
os.makedirs("ddump"); os.makedirs("bdump")  # k's d differs from q's; k's batch differs from q's
np.save("ddump/layer0_head0_q.npy", np.load("q.npy")); np.save("ddump/layer0_head0_v.npy", np.load("v.npy"))
np.save("ddump/layer0_head0_k.npy", rng.standard_normal((1, 16, 4)).astype(np.float32))
np.save("bdump/layer0_head0_q.npy", np.load("q.npy")); np.save("bdump/layer0_head0_v.npy", np.load("v.npy"))
np.save("bdump/layer0_head0_k.npy", rng.standard_normal((2, 16, 8)).astype(np.float32))
os.makedirs("hugedump")  # float64 Q = K = +-1e200: logits beyond float64
for n in ("q", "k"):
    np.save(f"hugedump/layer0_head0_{n}.npy", rng.choice([-1.0, 1.0], (1, 16, 8)) * 1e200)
np.save("hugedump/layer0_head0_v.npy", np.load("v.npy"))
os.makedirs("zsm"); np.save("zsm/layer0_head0_logits.npy", np.zeros((0, 16, 16)))

def npy(header, payload=b""):
    h = header.encode("latin1")
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + payload
open("shape_int.npy", "wb").write(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", b"\0" * 8))
open("esc.npy", "wb").write(npy("{'descr': '\x1b[31mRED\x00', 'fortran_order': False, 'shape': (1,), }", b"\0" * 4))
h = b"{'descr': '" + b"A" * 900000 + b"', 'fortran_order': False, 'shape': (1,), }"
h += b" " * ((64 - (12 + len(h) + 1) % 64) % 64) + b"\n"
open("long.npy", "wb").write(b"\x93NUMPY\x02\x00" + len(h).to_bytes(4, "little") + h + b"\0" * 4)
open("empty.npz", "wb").write(b"")
# a member whose .npy header declares 8 bytes and whose deflate stream inflates to 512 MiB
with zipfile.ZipFile("bomb.npz", "w", zipfile.ZIP_DEFLATED) as z:
    with z.open("x.npy", "w", force_zip64=True) as f:
        f.write(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"))
        zeros = b"\0" * (1 << 20)
        for _ in range(512):
            f.write(zeros)
# a 20 MB safetensors header of nested brackets
hdr = b"[" * 10_000_000 + b"]" * 10_000_000
open("nested.safetensors", "wb").write(len(hdr).to_bytes(8, "little") + hdr)
json.dump({"layers": [{"layer": 0, "scale": 0.5}, {"layer": 0, "scale": 0.25}]}, open("dup_manifest.json", "w"))
json.dump({"layers": {"0": {"scale": 0.5}, "7": {"scale": 0.25}}}, open("ghost_manifest.json", "w"))
open("bin.csv", "wb").write(bytes(range(256)) * 4)
PY

# ---- output paths -------------------------------------------------------------------------------------------------
attn=(attention --q q.npy --k k.npy --v v.npy --method fp32)
expect 0 "" "--out /dev/null" -- "${attn[@]}" --out /dev/null --probs /dev/null
check "/dev/null is still a character device" test -c /dev/null
mkfifo fifo.npy
timeout 60 cat fifo.npy >from_fifo.bin &  # (timeout: a writer that never opens it must not hang the test)
reader=$!
expect 0 "" "--out onto a FIFO" -- "${attn[@]}" --out fifo.npy
wait "$reader"
check "a FIFO stays a FIFO" test -p fifo.npy
mv from_fifo.bin from_fifo.npy
expect 0 "float32 +\| \(1, 16, 8\)" "the FIFO's reader got a whole .npy" -- info from_fifo.npy
expect 3 "is not a regular file" "a FIFO as input is refused, not waited on" -- info fifo.npy
ln -s real.npy link.npy
expect 0 "" "--out onto a symbolic link" -- "${attn[@]}" --out link.npy
check "the link is kept and written through" test -L link.npy -a -f real.npy
cp q.npy q_before.npy
expect 2 "same file as --q" "--out equal to an input" -- "${attn[@]}" --out q.npy
ln q.npy q_hard.npy
expect 2 "same file as --q" "--out a hard link of an input" -- "${attn[@]}" --out q_hard.npy
ln -s q.npy q_sym.npy
expect 2 "same file as --q" "--out a symbolic link to an input" -- "${attn[@]}" --out q_sym.npy
expect 2 "same file as --out" "--probs equal to --out" -- "${attn[@]}" --out o.npy --probs ./o.npy
expect 2 "same file as --in" "softmax --out equal to --in" -- softmax --in q.npy --method fp32 --out q.npy
check "the inputs are unchanged" cmp -s q.npy q_before.npy
check "nothing written for the refused --probs" test ! -e o.npy
expect 2 "file inside --tensors" "analyze --out onto a file of the dump" -- analyze --tensors mdump --method fp32 \
  --out mdump/layer0_head0_v.npy
if [ "$has_npz" -eq 1 ]; then
  expect 0 "" "--out .npz and --probs .safetensors" -- "${attn[@]}" --out o.npz --probs p.safetensors
  expect 0 "o\.npz +\| o +\| float32 +\| \(1, 16, 8\)" "an .npz output is an .npz" -- info o.npz
else
  expect 2 "npz support was not built" "--out .npz without libzip is refused before any work" -- "${attn[@]}" --out o.npz
  expect 0 "" "--out .safetensors" -- "${attn[@]}" --out o.safetensors --probs p.safetensors
fi
expect 0 "p\.safetensors +\| p +\| float64 +\| \(1, 16, 16\)" "a .safetensors output is .safetensors" -- info p.safetensors
expect 2 "names no tensor format" "--out with an unknown extension" -- "${attn[@]}" --out o.txt
long=$(printf 'a%.0s' $(seq 245)).npy
expect 0 "" "a 249-character output name" -- "${attn[@]}" --out "$long"
check "the 249-character file exists" test -f "$long"
umask 022
expect 0 "" "a new output" -- softmax --in q.npy --method fp32 --out mode.npy
check "a new output gets mode 0644 under umask 022" test "$(stat -c %a mode.npy)" = 644
check "no temporary left behind" test -z "$(ls -A | grep -e '^\.qattn-')"
for cmd in "analyze --method fp32" "info q.npy" "methods" "compare q.npy q.npy" "sweep --method index --grid b=4:5"; do
  # shellcheck disable=SC2086
  out=$(q $cmd 2>&1 >/dev/full); rc=$?
  if [ "$rc" -eq 3 ] && grep -q "standard output: write failed: No space left on device" <<<"$out"; then pass=$((pass + 1)); else
    echo "FAIL: '$cmd > /dev/full': exit $rc: $out"; fail=$((fail + 1)); fi
done
expect 3 "" "reproduce that fails" -- reproduce intattn-table8 --tensors nowhere --out-dir newdir/sub --no-plots
check "reproduce --out-dir is not created when the run fails" test ! -e newdir
expect 2 "not an experiment" "reproduce of an unknown experiment" -- reproduce nosuch --out-dir newdir2
check "reproduce --out-dir is not created for an unknown experiment" test ! -e newdir2

# ---- numeric edge cases ---------------------------------------------------------------------------------------------
expect 3 "zero_b.npy: shape: a leading \(batch\) axis has length 0" "analyze of a batch of size 0" -- \
  analyze --q zero_b.npy --k zero_b.npy --v zero_b.npy --method fp32
expect 3 "a leading \(batch\) axis has length 0" "analyze --softmax-only of a batch of size 0" -- \
  analyze --softmax-only --tensors zsm --method fp32
expect 3 "a leading \(batch\) axis has length 0" "sweep over a batch of size 0" -- sweep --method index --grid b=4:5 --tensors zdump
expect 3 "overflows float32, in which quant-only forms its logits" "quant-only with float32-overflowing logits" -- \
  attention --q qbig.npy --k kbig.npy --v v.npy --method quant-only --out o.npy
expect 3 "overflows float32" "quant-only with --scale 1e300" -- "${attn[@]/fp32/quant-only}" --scale 1e300 --out o.npy
expect 3 "overflows float32" "analyze quant-only on an overflowing dump" -- analyze --tensors bigdump --method quant-only
expect 3 "overflows float64 in the fp64 reference" "analyze when the fp64 reference overflows" -- \
  analyze --tensors hugedump --method fp32
expect 3 "qnan.npy: Q\[0, 3, 2\]: is NaN" "sage2 refuses NaN in Q, naming file, tensor and index" -- \
  attention --q qnan.npy --k k.npy --v v.npy --method sage2 --out o.npy
expect 3 "kinf.npy: K\[0, 5, 1\]: is \+inf" "+inf in K" -- attention --q q.npy --k kinf.npy --v v.npy --method fp32 --out o.npy
# Q, K and V are read (and checked) side by side with more than one thread: the error reported is still the first in
# the order Q, K, V, whatever finishes first, and the same as with one thread.
for t in 1 2; do
  expect 3 "qnan.npy: Q\[0, 3, 2\]: is NaN" "NaN in Q before a missing K, $t thread(s)" -- \
    attention --q qnan.npy --k absent.npy --v v.npy --method intattention --threads $t --out o.npy
  expect 3 "absent.npy: file: cannot open" "a missing Q before +inf in K, $t thread(s)" -- \
    attention --q absent.npy --k kinf.npy --v v.npy --method intattention --threads $t --out o.npy
  expect 3 "kinf.npy: K\[0, 5, 1\]: is \+inf" "+inf in K before a missing V, $t thread(s)" -- \
    attention --q q.npy --k kinf.npy --v absent.npy --method intattention --threads $t --out o.npy
done
expect 3 "lognan.npy: logits\[1, 4\]: is NaN" "exaq refuses NaN logits, naming the file" -- \
  softmax --in lognan.npy --method exaq --out o.npy
expect 0 "" "-inf logits mean masked" -- softmax --in logmask.npy --method exaq --out pm.npy
check "nothing written on refusal" test ! -e o.npy
out=$(q analyze --tensors bigdump --method fp32 --method intattention 2>&1); rc=$?
if [ "$rc" -eq 0 ] && grep -qE "^\| all +\| worst \(NaN: layer 0 head 0\) +\| fp32 +\| nan " <<<"$out" &&
   grep -q "fp32 gives a non-finite output on layer 0 head 0" <<<"$out" &&
   ! grep -qE "^\| [^|]+\| [^|]+\| intattention +\|.*\| (inf|-inf|nan) " <<<"$out"; then
  pass=$((pass + 1)); else echo "FAIL: a NaN head in the worst row: exit $rc"; echo "$out" | tail -6; fail=$((fail + 1)); fi
expect 3 "layer0_head0_v.npy is missing .*files not read, named like none of the dump's: layer0_haed0_v.npy" \
  "a misspelt head file is named" -- analyze --tensors sdump --method fp32
expect 3 "nowhere-at-all: --tensors: does not exist" "a missing dump directory is said to not exist" -- \
  analyze --tensors nowhere-at-all --method fp32
expect 3 "ddump/layer0_head0_k.npy: shape: head dimension d = 4 differs from q's d = 8" "a head dimension mismatch gives both d" -- \
  analyze --tensors ddump --method fp32
expect 3 "bdump/layer0_head0_k.npy: shape: batch size differs between q, k and v: 1, 2 and 1" "a batch mismatch gives the sizes" -- \
  analyze --tensors bdump --method fp32
expect 0 '"O_cossim": "nan"' "NaN metrics are \"nan\" in JSON, as in the tables" -- analyze --tensors bigdump --method fp32 --format json
expect 0 "exact matches +\| 12 " "compare of a tensor holding NaN with itself" -- compare selfnan.npy selfnan.npy

# ---- resource limits ------------------------------------------------------------------------------------------------
rss_ok() {  # rss_ok LIMIT_KB CODE ARGS...: exit CODE with peak RSS below LIMIT_KB
  local limit=$1 code=$2
  shift 2
  /usr/bin/time -f "%M" -o rss.txt "${emu[@]}" "$bin" "$@" >/dev/null 2>&1
  local rc=$?
  [ "$rc" -eq "$code" ] && [ "$(tail -1 rss.txt)" -lt "$limit" ]
}
if [ -z "${emu[*]}" ] && [ -x /usr/bin/time ]; then
  check "a grid of 10^12 points is refused at once, in little memory" rss_ok 300000 2 \
    sweep --method index --grid b=1:100000 --grid c=1:0.001:100 --grid alpha=1:100
  [ "$has_npz" -eq 1 ] && check "an .npz member inflating past its header is refused in little memory" rss_ok 300000 3 info bomb.npz
  check "a deeply nested safetensors header is refused in little memory" rss_ok 300000 3 info nested.safetensors
fi
expect 2 "more than 100000 points" "the product of the grid's axes is capped" -- \
  sweep --method index --grid b=1:8 --grid c=1:0.001:100
expect 2 "--max-points: 0 is outside" "--max-points 0" -- sweep --method index --grid b=4:5 --max-points 0
[ "$has_npz" -eq 1 ] && expect 3 "inflates past the [0-9]+ bytes its .npy header declares" "npz bomb" -- info bomb.npz
expect 3 "nests deeper than 16 levels" "nested safetensors header" -- info nested.safetensors
expect 2 "--threads: 100000 is outside \[0, 1024\]" "sweep --threads 100000" -- sweep --method index --grid b=4:5 --threads 100000
expect 2 "--threads: -1 is outside" "sweep --threads -1" -- sweep --method index --grid b=4:5 --threads -1
expect 2 "--threads: -2 is outside" "reproduce --threads -2" -- reproduce intattn-table8 --threads -2
expect 2 "--reps: 0 is outside" "bench --reps 0" -- bench --L 16 --reps 0
expect 2 "--L: 99999 is outside" "bench --L beyond its bound" -- bench --L 99999 --reps 1
expect 2 "--d: -3 is outside" "bench --d -3" -- bench --L 16 --d -3 --reps 1
expect 2 "--threads: 0 is outside" "bench --threads 0" -- bench --L 16 --threads 0 --reps 1

# ---- inputs accepted too leniently ----------------------------------------------------------------------------------
cp dup_manifest.json mdump/manifest.json
expect 3 "manifest.json: layers\[0\]: layer 0 is described twice" "duplicate manifest layers" -- analyze --tensors mdump --method fp32
cp ghost_manifest.json mdump/manifest.json
expect 3 "manifest.json: layers\[7\]: describes a layer that has no files" "a manifest layer without files" -- \
  analyze --tensors mdump --method fp32
rm mdump/manifest.json && mkdir mdump/manifest.json
expect 3 "manifest.json: file: is a directory" "a manifest that is a directory" -- analyze --tensors mdump --method fp32
rmdir mdump/manifest.json
expect 2 "key 'b' given twice" "duplicate keys in a method spec" -- softmax --in q.npy --method index:b=5,b=6 --out o.npy
expect 3 "shape: \(2\) is not a tuple" "npy shape (2)" -- info shape_int.npy
[ "$has_npz" -eq 1 ] && expect 3 "empty.npz: archive: file is empty" "a 0-byte .npz" -- info empty.npz
out=$(q info esc.npy 2>&1)
if grep -q 'descr' <<<"$out" && ! LC_ALL=C grep -q $'\x1b' <<<"$out" && grep -qF '\x1b[31mRED\x00' <<<"$out"; then
  pass=$((pass + 1)); else echo "FAIL: terminal escapes in a header reach stderr raw: $out"; fail=$((fail + 1)); fi
out=$(q info long.npy 2>&1)
if [ "${#out}" -lt 4000 ] && grep -q "more bytes\]" <<<"$out"; then pass=$((pass + 1)); else
  echo "FAIL: a 900 KB descr is echoed whole (${#out} bytes)"; fail=$((fail + 1)); fi
if [ -z "${emu[*]}" ] && $py -c "import matplotlib" 2>/dev/null; then
  q sweep --method index --grid b=4 --grid c=5:7 --out s1.csv 2>/dev/null
  expect 3 "a heatmap needs at least two values on each axis" "plot heatmap of a 1 x N sweep" -- plot heatmap s1.csv -o h.png
  expect 3 "bin.csv: not UTF-8 text" "plot of a binary CSV" -- plot lines bin.csv -o h.png --x a
  printf 'a,b\n1\n' >ragged.csv
  expect 3 "row 2 has 1 fields" "plot of a ragged CSV" -- plot lines ragged.csv -o h.png --x a --y b
  check "no figure from a bad CSV" test ! -e h.png
fi

# ---- messages and edges: the dump's names, manifest keys, integer options, bench-eval's children ---------------------
# Each case runs in a 4 GB address space (where no sanitizer's shadow memory or emulator needs more): an exit code
# and a message, never a signal.
vlimit=4000000
{ [ -n "${emu[*]}" ] || sanitized; } && vlimit=""
q() { (if [ -n "$vlimit" ]; then ulimit -v "$vlimit"; fi; exec "${emu[@]}" "$bin" "$@"); }
$py - <<'PY'
import numpy as np, os
rng = np.random.default_rng(49)
def head(d, names):
    os.makedirs(d, exist_ok=True)
    for n in names:
        np.save(f"{d}/{n}.npy", rng.standard_normal((1, 16, 8)).astype(np.float32))
head("twins", ["layer0_head0_q", "layer0_head0_k", "layer0_head0_v", "layer0_head00_k"])
head("plus", ["layer0_head0_q", "layer0_head0_k", "layer0_head0_v", "layer0_head+1_q"])
head("long", ["layer0_head0_q", "layer0_head0_k", "layer0_head0_v", "layer0_head12345678901_v"])
head("mf", ["layer0_head0_q", "layer0_head0_k", "layer0_head0_v"])
t = {n: rng.standard_normal((1, 16, 8)).astype(np.float32) for n in ("q", "k", "v")}
np.savez("twins.npz", layer0_head0_q=t["q"], layer0_head0_k=t["k"], layer0_head0_v=t["v"], layer0_head00_v=t["v"])
np.savez("plus.npz", layer0_head0_q=t["q"], layer0_head0_k=t["k"], layer0_head0_v=t["v"], **{"layer1_head+1_q": t["q"]})
PY
expect 3 "twins: --tensors: layer0_head00_k.npy and layer0_head0_k.npy both name layer 0 head 0's k" \
  "two spellings of one head file" -- analyze --tensors twins --method fp32
expect 3 "plus/layer0_head\+1_q.npy: name: head number '\+1' is not a decimal number" "head+1 is refused, not dropped" -- \
  analyze --tensors plus --method fp32
expect 3 "long/layer0_head12345678901_v.npy: name: head number 12345678901 is out of range \[0, 2147483647\]" \
  "an 11-digit head number is refused, not dropped" -- analyze --tensors long --method fp32
# Shards record their inputs' SHA-256: a build without OpenSSL's libcrypto (the aarch64 cross build) runs none
has_shards=1
probe=$(q analyze --tensors twins --shard 0/1 2>&1)
grep -q "built without OpenSSL" <<<"$probe" && has_shards=0
if [ "$has_shards" -eq 1 ]; then
  expect 3 "layer0_head12345678901_v.npy: name: head number" "a shard refuses it too" -- \
    analyze --tensors long --method fp32 --shard 0/1 --out part.json
  # one head in two shards: shard 0/2 owns no head and still refuses the names the other shard refuses
  expect 3 "twins: --tensors: layer0_head00_k.npy and layer0_head0_k.npy both name" "a shard that owns no head refuses twins" -- \
    analyze --tensors twins --method fp32 --shard 0/2 --out part.json
  check "no part written by the shard that owns no head" test ! -e part.json
else
  echo "hardening_test: the --shard cases skipped (built without OpenSSL's libcrypto)"
fi
if [ "$has_npz" -eq 1 ]; then
  expect 3 "twins.npz: --tensors: layer0_head00_v and layer0_head0_v both name layer 0 head 0.s v|layer0_head0_v and layer0_head00_v both name" \
    "two spellings of one member in an .npz" -- analyze --tensors twins.npz --method fp32
  if [ "$has_shards" -eq 1 ]; then
    expect 3 "twins.npz: --tensors: layer0_head00_v and layer0_head0_v both name layer 0 head 0.s v|layer0_head0_v and layer0_head00_v both name" \
      "a shard of an .npz that owns no head refuses twins" -- analyze --tensors twins.npz --method fp32 --shard 0/2 --out part.json
  fi
  expect 3 "plus.npz:layer1_head\+1_q: name: head number '\+1' is not a decimal number" "head+1 in an .npz" -- \
    analyze --tensors plus.npz --method fp32
fi
printf '{"layers": [{"layer": 0, "scale": 0.5, "scale": 0.25}]}' >mf/manifest.json
expect 3 "manifest.json: layers\[0\].scale: the key is given twice in one object" "a manifest key given twice" -- \
  analyze --tensors mf --method fp32
printf '{"layers": {"0": {"layer": 1}}}' >mf/manifest.json
expect 3 "manifest.json: layers\[0\].layer: is 1 in the entry keyed \"0\"" "an inner layer that contradicts its key" -- \
  analyze --tensors mf --method fp32
printf '{"layers": [{"layer": 0, "scael": 0.5}]}' >mf/manifest.json
expect 3 "manifest.json: layers\[0\].scael: is not a key of a manifest here \(known: layer, scale, causal" \
  "a misspelt manifest key" -- analyze --tensors mf --method fp32
rm mf/manifest.json
expect 2 "--block-rows: 99999999999999999999 is outside the range of a 64-bit integer" "--block-rows beyond 64 bits" -- \
  analyze --tensors mf --method fp32 --block-rows 99999999999999999999
expect 2 "--block-rows: must be a multiple of 64 .*got 100$" "--block-rows 0100 is decimal 100, not octal 64" -- \
  analyze --tensors mf --method fp32 --block-rows 0100
expect 0 "" "--block-rows +064 is 64" -- analyze --tensors mf --method fp32 --block-rows +064 --threads 01
for cmd in "analyze --tensors mf --method fp32" "compare q.npy q.npy" "attention --q q.npy --k k.npy --v v.npy --method fp32 --out o.npy" \
           "sweep --method index --grid b=4:5" "reproduce intattn-table8 --no-plots" "bench --L 16 --reps 1" "bench-eval --L 64"; do
  # shellcheck disable=SC2086
  expect 2 "--threads: '' is not a decimal integer" "$cmd --threads ''" -- $cmd --threads ""
  # shellcheck disable=SC2086
  expect 2 "--threads: '0x10' is not a decimal integer" "$cmd --threads 0x10" -- $cmd --threads 0x10
done
check "nothing written by the refused attention" test ! -e o.npy
# bench-eval resolves its methods before it writes a head or times the anchor, with analyze's message
start=$(date +%s)
out=$(q bench-eval --method nope --L 4096 --reps 1 2>&1); rc=$?
if [ "$rc" -eq 2 ] && grep -q "nope" <<<"$out" && ! grep -q "anchor" <<<"$out" && [ $(($(date +%s) - start)) -lt 10 ]; then
  pass=$((pass + 1)); else echo "FAIL: bench-eval --method nope: exit $rc after $(($(date +%s) - start)) s: $out"; fail=$((fail + 1)); fi
expect 2 "--anchor-max-L: -1 is outside" "bench-eval --anchor-max-L -1" -- bench-eval --L 64 --anchor-max-L -1
# what a child refuses for the head's shape fails in the trial run on 64 rows: its exit status (not the wait status)
# and the end of its own stderr
# (bench-eval's children exec /proc/self/exe: under an emulator that is the guest binary, which the host cannot run)
if [ -z "${emu[*]}" ]; then
  out=$(q bench-eval --L 4096 --d 512 --reps 1 --method fa3-fp8 2>&1); rc=$?
  if [ "$rc" -eq 3 ] && grep -q "the child run \`qattn analyze .*\` exited with status 3; the end of its stderr:" <<<"$out" &&
     grep -q "^  qattn: error: .*FlashAttention-3's FP8 kernel takes head dimensions up to 256" <<<"$out" && ! grep -q "anchor" <<<"$out"; then
    pass=$((pass + 1)); else echo "FAIL: bench-eval --d 512 --method fa3-fp8: exit $rc: $out"; fail=$((fail + 1)); fi
else
  echo "hardening_test: bench-eval's child case skipped under the emulator"
fi
q() { "${emu[@]}" "$bin" "$@"; }

echo "hardening_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
