#!/usr/bin/env bash
# Hostile and careless use of `qattn mma` and `qattn mma-check` (docs/mma.md "Bounds"): shapes whose products wrap or
# pass the bound on D, K = 0, vector files built to exhaust memory or time, sets without a name or an output, NaN
# outputs, a fit that changes nothing. Every case runs under a 4 GB address-space limit (where no sanitizer or
# emulator needs more) and ends with the documented exit code (0, 2 usage, 3 bad input) and a message naming what is
# wrong; never a signal.
#
#   hardening_mma_test.sh QATTN_BINARY REPO_ROOT [EMULATOR...]
set -uo pipefail
source "$(dirname "$0")/lib.sh" "$@"
py=/usr/bin/python3
if ! $py -c "import numpy" 2>/dev/null; then echo "hardening_mma_test: needs /usr/bin/python3 with numpy"; exit 1; fi
cd "$tmp" || exit 1
# The address-space limit: a sanitizer's shadow memory or an emulator needs more than 4 GB of it.
vlimit=4000000
{ [ -n "${emu[*]}" ] || sanitized; } && vlimit=""
q() { (if [ -n "$vlimit" ]; then ulimit -v "$vlimit"; fi; exec "${emu[@]}" "$bin" "$@"); }
has_npz=0
q info "$root/tests/fixtures/deflated.npz" >/dev/null 2>&1 && has_npz=1

PYTHONPATH="$root/tests/cli" $py - <<'PY'
import numpy as np
from safetensors_file import write_safetensors
# K = 0: the files hold no data, whatever M and N say
for name, shape in [("wide", (1 << 22, 1 << 21, 0)), ("tall", ((1 << 60) + 1, 0)), ("col16", (16, 0)),
                    ("big", (200000, 0))]:
    h = "{'descr': '|u1', 'fortran_order': False, 'shape': %s, }" % (shape,)
    h = h.encode("latin1")
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    open(name + ".npy", "wb").write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h)
np.save("a0.npy", np.zeros((2, 3, 0), np.uint8))
np.save("bt0.npy", np.zeros((2, 2, 0), np.uint8))
c = np.arange(12, dtype=np.float32).reshape(2, 3, 2) - 5.5
c[0, 0, 0] = np.inf
np.save("c0.npy", c)
np.save("a1.npy", np.zeros(5, np.uint8))
np.save("ak6.npy", np.zeros((16, 6), np.uint8)); np.save("btk6.npy", np.zeros((8, 6), np.uint8))
np.save("bt1.npy", np.zeros((4, 5), np.uint8))
np.save("c64.npy", np.zeros((1, 1), np.float64))
np.save("a14.npy", np.zeros((1, 4), np.float32))
np.save("ct.npy", np.full((1, 1), 0.1, np.float32))
np.save("a16.npy", np.zeros((1, 16), np.uint16))

# 40,000 variants of a 1 x 1 x 4 set (the scan was quadratic in the members)
write_safetensors("many.safetensors", [("s_A", "U8", (1, 1, 4), bytes(4)), ("s_Bt", "U8", (1, 1, 4), bytes(4))] +
                  [(f"s_v{i}_D", "F32", (1, 1, 1), bytes(4)) for i in range(40000)])
# an unnamed set, and an empty one
write_safetensors("unnamed.safetensors", [("_A", "U8", (1, 2, 4), bytes(8)), ("_Bt", "U8", (1, 2, 4), bytes(8)),
                                          ("_D", "F32", (1, 2, 2), bytes(16))])
write_safetensors("empty.safetensors", [("e_A", "U8", (0, 2, 4), b""), ("e_Bt", "U8", (0, 2, 4), b""),
                                        ("e_D", "F32", (0, 2, 2), b"")])
# every model output NaN (an E4M3 NaN in each row of A) where the GPU's are finite
a = np.zeros((1, 2, 4), np.uint8)
a[0, :, 0] = 0x7F
write_safetensors("nan.safetensors", [("n_A", "U8", (1, 2, 4), a.tobytes()), ("n_Bt", "U8", (1, 2, 4), bytes(8)),
                                      ("n_D", "F32", (1, 2, 2), np.ones((1, 2, 2), np.float32).tobytes())])
# 300 output variants of A, Bt [1, 1, 2^23] of zeros: 74 KB deflated, once 3.94 GB of copies
members = {"z_A": np.zeros((1, 1, 1 << 23), np.uint8), "z_Bt": np.zeros((1, 1, 1 << 23), np.uint8)}
members.update({f"z_v{i}_D": np.zeros((1, 1, 1), np.float32) for i in range(300)})
np.savez_compressed("variants.npz", **members)
# members of 2 x 2^27 bytes in a small file: beyond the bound on a vector file once read
np.savez_compressed("huge.npz", h_A=np.zeros((1, 1, 1 << 27), np.uint8), h_Bt=np.zeros((1, 1, 1 << 27), np.uint8),
                    h_D=np.zeros((1, 1, 1), np.float32))
# random E4M3 codes, no NaN code among them
rng = np.random.default_rng(5)
for name in ("fa", "fbt"):
    np.save(name + ".npy", (rng.integers(0, 0x7F, (4, 4, 64)) | rng.integers(0, 2, (4, 4, 64)) * 0x80).astype(np.uint8))
PY
truncate -s 300M sparse.safetensors  # 300 MB on paper, none on disk

# ---- qattn mma: shapes --------------------------------------------------------------------------------------------
expect 3 "wide.npy: shape: A \(4194304, 2097152, 0\) and Bt \(4194304, 2097152, 0\) give D \(4194304, 2097152, 2097152\): more than 2\^64 bytes" \
  "K = 0 with M x N wrapping (was SIGSEGV)" -- mma --model h100-wgmma-e4m3 --a wide.npy --bt wide.npy --out d.npy
expect 3 "tall.npy: shape: A \(1152921504606846977, 0\) and Bt \(16, 0\) give D \(1152921504606846977, 16\): more than 2\^64 bytes" \
  "K = 0 with M x N wrapping to 16 (was SIGABRT)" -- mma --model h100-wgmma-e4m3 --a tall.npy --bt col16.npy --out d.npy
expect 3 "big.npy: shape: .* give D \(200000, 200000\): 160000000000 bytes of float32 outputs, beyond the bound of 1073741824 bytes" \
  "a 160 GB D from 256 bytes of files (was bad_alloc)" -- mma --model h100-wgmma-e4m3 --a big.npy --bt big.npy --out d.npy
check "nothing written for a refused product" test ! -e d.npy
expect 3 "a1.npy: shape: \(5,\) has 1 dimension: A \[\.\.\., M, K\] needs 2 or more" "a one-dimensional A names its shape" -- \
  mma --model h100-wgmma-e4m3 --a a1.npy --bt bt1.npy --out d.npy
expect 3 "ak6.npy: shape: K = 6 \(the last axis\) is not a multiple of 4, which model h100-mma-e4m3 needs" \
  "mma.sync's k mod 4 pairing names the file and K" -- mma --model h100-mma-e4m3 --a ak6.npy --bt btk6.npy --out d.npy
expect 0 "" "K = 0 within the bound" -- mma --model h100-mma-e4m3 --a a0.npy --bt bt0.npy --c c0.npy --out d0.npy
check "K = 0: D = C" $py -c "import numpy as np, sys; sys.exit(not np.array_equal(np.load('d0.npy'), np.load('c0.npy')))"
expect 0 "" "K = 0 without C" -- mma --model h100-wgmma-e4m3 --a a0.npy --bt bt0.npy --out z0.npy
check "K = 0 without C: D = 0" $py -c "import numpy as np, sys; d = np.load('z0.npy'); sys.exit(not (d.shape == (2, 3, 2) and not d.any()))"
expect 3 "c64.npy: dtype: float64: expected float32 or float16" "a float64 C" -- \
  mma --model h100-wgmma-e4m3 --a a14.npy --bt a14.npy --c c64.npy --out d.npy
expect 3 "ct.npy: element 0: 0.100000001 is not a float16 value, and h100-hmma-f16-acc16 has an f16 accumulator" \
  "a C the f16 accumulator cannot hold" -- mma --model h100-hmma-f16-acc16 --a a16.npy --bt a16.npy --c ct.npy --out d.npy

# ---- qattn mma-check: vector files ----------------------------------------------------------------------------------
start=$(date +%s)
expect 0 "All sets: 40000 of 40000 outputs bit-equal" "40,000 variants of a set" -- \
  mma-check many.safetensors --model h100-wgmma-e4m3
if [ -n "$vlimit" ]; then  # natively, without a sanitizer: under qemu or ASan the bound would measure them
  check "40,000 variants are read in linear time (under 15 s; a quadratic scan takes minutes)" \
    test $(($(date +%s) - start)) -lt 15
fi
if [ "$has_npz" -eq 1 ]; then
  expect 0 "All sets: 300 of 300 outputs bit-equal" "300 variants of a 2^23-deep set share its operands (was 3.94 GB)" -- \
    mma-check variants.npz --model h100-wgmma-e4m3
  expect 3 "huge.npz: members: hold 268435460 bytes, beyond the bound of 268435456 bytes" "members beyond the bound" -- \
    mma-check huge.npz --model h100-wgmma-e4m3
fi
expect 3 "sparse.safetensors: file: 314572800 bytes, beyond the bound of 268435456 bytes" "a file beyond the bound" -- \
  mma-check sparse.safetensors --model h100-wgmma-e4m3
expect 3 "unnamed.safetensors: _A: a set needs a name" "a set named ''" -- mma-check unnamed.safetensors --model h100-wgmma-e4m3
expect 3 "empty.safetensors: e_D: shape \(0, 2, 2\): no output to check" "a set of zero tests" -- \
  mma-check empty.safetensors --model h100-wgmma-e4m3
expect 0 "\| n \| - \| 1 \| 2 x 2 x 4 \| 4 \| 0 \| 0 % \| 4 NaN/inf \|" \
  "no output equal because the model is NaN: said, not 0" -- mma-check nan.safetensors --model h100-wgmma-e4m3
expect 0 '"max_rel_error": null' "JSON: no relative error is null, not 0" -- \
  mma-check nan.safetensors --model h100-wgmma-e4m3 --format json

# A set whose D is h100-wgmma-e4m3's own output: a fit from that preset finds nothing better, one from the
# per-product bound does.
q mma --model h100-wgmma-e4m3 --a fa.npy --bt fbt.npy --out fd.npy
PYTHONPATH="$root/tests/cli" $py - <<'PY'
import numpy as np
from safetensors_file import write_safetensors
operands = [(name, np.load(path)) for name, path in (("f_A", "fa.npy"), ("f_Bt", "fbt.npy"), ("f_D", "fd.npy"))]
write_safetensors("fit.safetensors",
                  [(name, "U8" if x.dtype == np.uint8 else "F32", x.shape, x.tobytes()) for name, x in operands])
PY
expect 0 "# fit.safetensors against h100-wgmma-e4m3$" "--fit that changes nothing keeps the preset's name" -- \
  mma-check fit.safetensors --model h100-wgmma-e4m3 --fit --fit-tests 1
expect 0 "no setting of the parameters reproduces more outputs than h100-wgmma-e4m3" "--fit says nothing improved" -- \
  mma-check fit.safetensors --model h100-wgmma-e4m3 --fit --fit-tests 1
expect 0 "against per-product-fp22-fit" "--fit that improves renames the model" -- \
  mma-check fit.safetensors --model per-product-fp22 --fit --fit-tests 1

# ---- block scales (MXFP4, NVFP4) and sets named after their preset (../shared/data/mmasim's layout) ----------------
subset=$root/tests/fixtures/mmasim/mmasim_subset.safetensors
PYTHONPATH="$root/tests/cli" $py - "$subset" <<'PY'
import json, struct, sys
import numpy as np
from safetensors_file import write_safetensors
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
dt = {"U8": np.uint8, "U16": np.uint16, "F32": np.float32, "F16": np.float16}
for key in ("A", "Bt", "C", "D", "SA", "SBt"):
    m = h["b200-nvf4.random_" + key]
    s, e = m["data_offsets"]
    np.save(f"nv_{key}.npy", np.frombuffer(b[8 + n + s:8 + n + e], dtype=dt[m["dtype"]]).reshape(m["shape"]))
np.save("nv_SA_short.npy", np.load("nv_SA.npy")[..., :4].copy())
np.save("nv_SA_i8.npy", np.load("nv_SA.npy").astype(np.int8))
a = np.load("nv_A.npy"); a[1, 2, 3] = 0x21; np.save("nv_A_packed.npy", a)
np.save("nv_A_k24.npy", np.load("nv_A.npy")[..., :24].copy()); np.save("nv_Bt_k24.npy", np.load("nv_Bt.npy")[..., :24].copy())


def forged(path, members):
    """members: (name, dtype code, shape); zero bytes of the right size"""
    write_safetensors(path, [(name, code, shape, bytes(int(np.prod(shape)) * {"U8": 1, "F32": 4}[code]))
                             for name, code, shape in members])


base = [("s_A", "U8", (1, 2, 32)), ("s_Bt", "U8", (1, 2, 32)), ("s_D", "F32", (1, 2, 2))]
forged("sa_only.safetensors", base + [("s_SA", "U8", (1, 2, 2))])
forged("sa_f32.safetensors", base + [("s_SA", "F32", (1, 2, 2)), ("s_SBt", "U8", (1, 2, 2))])
forged("sa_blocks.safetensors", base + [("s_SA", "U8", (1, 2, 3)), ("s_SBt", "U8", (1, 2, 3))])
forged("sa_zero.safetensors", base + [("s_SA", "U8", (1, 2, 0)), ("s_SBt", "U8", (1, 2, 0))])
PY
expect 0 "b200-nvf4  \[MMA-Sim model, not measured here\]" "mma --list marks the presets from MMA-Sim's model" -- mma --list
expect 0 "" "mma: NVFP4 with its UE4M3 block scales" -- mma --model b200-nvf4 --a nv_A.npy --bt nv_Bt.npy --c nv_C.npy \
  --scale-a nv_SA.npy --scale-bt nv_SBt.npy --out nv_D_model.npy
check "mma: the NVFP4 D is the model's vectors, bit for bit" $py -c "import numpy as np, sys; \
a, b = np.load('nv_D_model.npy'), np.load('nv_D.npy'); sys.exit(0 if a.dtype == b.dtype and a.tobytes() == b.tobytes() else 1)"
expect 3 "nv_A.npy: --scale-a: missing: model b200-nvf4 takes SA \[..., M, K/block\], one UE4M3 code \(uint8\) per block of 16 k" \
  "mma: a block-scaled model without its scales" -- mma --model b200-nvf4 --a nv_A.npy --bt nv_Bt.npy --out x.npy
expect 3 "nv_SA_short.npy: shape: \(4, 16, 4\): expected SA \[..., M, K/block\] = \(4, 16, 8\), one scale per block of 16 k" \
  "mma: scales of the wrong shape" -- mma --model b200-nvf4 --a nv_A.npy --bt nv_Bt.npy --scale-a nv_SA_short.npy \
  --scale-bt nv_SBt.npy --out x.npy
expect 3 "nv_SA_i8.npy: dtype: int8: expected uint8 UE4M3 codes" "mma: scales not uint8" -- mma --model b200-nvf4 \
  --a nv_A.npy --bt nv_Bt.npy --scale-a nv_SA_i8.npy --scale-bt nv_SBt.npy --out x.npy
expect 3 "nv_SA.npy: --scale-a: model b200-tcgen05-e4m3 takes no block scales" "mma: scales for a model without" -- \
  mma --model b200-tcgen05-e4m3 --a nv_A.npy --bt nv_Bt.npy --scale-a nv_SA.npy --out x.npy
expect 3 "nv_A_packed.npy: element 2307: code 33 is not an E2M1 code" "mma: packed FP4 pairs are refused" -- \
  mma --model b200-nvf4 --a nv_A_packed.npy --bt nv_Bt.npy --scale-a nv_SA.npy --scale-bt nv_SBt.npy --out x.npy
expect 3 "K = 24 \(the last axis\) is not a multiple of 16, model b200-nvf4's scale block" "mma: K not whole blocks" -- \
  mma --model b200-nvf4 --a nv_A_k24.npy --bt nv_Bt_k24.npy --scale-a nv_SA.npy --scale-bt nv_SBt.npy --out x.npy
check "mma: nothing written on refused scales" test ! -e x.npy
expect 0 "All sets: 23040 of 23040 outputs bit-equal" "mma-check without --model: each set against its preset" -- \
  mma-check "$subset"
expect 0 "33 sets of other presets left out" "mma-check --model: the model's own sets of a named file" -- \
  mma-check "$subset" --model b200-mxf4
expect 3 "no set for model h100-hmma-f16: its sets are named <preset>.<kind>, for b200-tcgen05-f16" \
  "mma-check: a named file without the model's sets" -- mma-check "$subset" --model h100-hmma-f16
expect 2 "--model: is needed: set 's' does not name a preset" "mma-check: unnamed sets need --model" -- \
  mma-check many.safetensors
expect 2 "--fit: needs --model" "mma-check --fit without a model" -- mma-check "$subset" --fit
expect 3 "s_SBt: missing: set 's' has block scales for one operand only" "a vector set with SA alone" -- \
  mma-check sa_only.safetensors --model b200-mxf8-e4m3
expect 3 "s_SA: dtype float32: block scale codes are uint8" "vector scales not uint8" -- \
  mma-check sa_f32.safetensors --model b200-mxf8-e4m3
expect 3 "s_SA: shape \(1, 2, 3\): expected \[..., 2, K/block\]" "3 scale blocks do not divide K = 32" -- \
  mma-check sa_blocks.safetensors --model b200-mxf8-e4m3
expect 3 "s_SA: shape \(1, 2, 0\)" "zero scale blocks" -- mma-check sa_zero.safetensors --model b200-mxf8-e4m3

echo "hardening_mma_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
