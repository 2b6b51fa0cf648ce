#!/usr/bin/env python3
"""Checks the generated code of every int8 MAC peak loop (qattn::kernels::mac_loop__*) in the kernels library: its
hot loop (the backward branch enclosing the most multiply-accumulate instructions) must hold at least 8 of them (4
for AMX's tdpbssd, each a 16 x 16 x 64 tile product into its own C tile) and no instruction with a memory operand, i.e. no accumulator is spilled or reloaded, so the bench's peak is the
register-only rate of the instruction the GEMMs use.

It also checks the AVX-512, AVX-VNNI and AVX2 GEMM tiles' k loops (gemm_avx512vnni.cc, gemm_avxvnni.cc,
gemm_avx2.cc, inline assembly): every innermost loop that encloses at least 4 vpdpbusd (vpmaddwd in the AVX2 file)
outside the peak loops must broadcast its A groups from memory and hold no vector register copy (vmovdqa/vmovdqu
between two registers) and no store: the accumulators stay in their registers for the whole loop. Every vpdpbusd of
an AVX-VNNI function must be VEX-encoded (objdump's "{vex}"): the EVEX form needs AVX512-VL, which the CPUs this
variant is for do not have.

    peak_loop_codegen.py OBJDUMP LIBRARY.a
"""
import re
import subprocess
import sys

MAC = re.compile(r"^(vpdpbusd|vpmaddwd|imul|sdot|usdot|madd|tdpbssd|tdpbusd)\b")
TILE_MAC = re.compile(r"^tdpb")  # AMX: one instruction is 16 x 16 x 64 products; four independent C tiles
BRANCH = re.compile(r"^(j[a-z]+|b\.[a-z]+|b|cbnz|cbz|tbnz|tbz)\s+([0-9a-f]+)\b")
MEMORY = re.compile(r"\(|\[")  # AT&T (%reg) / Arm [xN]


def instruction(text):
    """The instruction without objdump's encoding pseudo-prefix ({vex}, {evex})."""
    return re.sub(r"^\{[a-z0-9]+\}\s*", "", text)


def functions(text):
    name, body = None, []
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            if name:
                yield name, body
            name, body = head.group(1), []
            continue
        ins = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line)
        if name and ins:
            body.append((int(ins.group(1), 16), instruction(ins.group(2).strip())))
    if name:
        yield name, body


VMOVE = re.compile(r"^vmovdq[au](8|16|32|64)?\s+%[xyz]mm\d+,\s*%[xyz]mm\d+$")
STORE = re.compile(r"^v?mov\S*\s+%\S+,\s*\S*\(")


def innermost_loops(body):
    """Every loop closed by a backward branch that encloses no other backward branch."""
    back = [(int(m.group(2), 16), addr) for addr, ins in body
            for m in [BRANCH.match(ins)] if m and int(m.group(2), 16) < addr]
    for start, end in back:
        if any(start <= s and e < end for s, e in back if (s, e) != (start, end)):
            continue
        yield [x for x in body if start <= x[0] <= end]


def check_tile_loops(text, mac="vpdpbusd"):
    checked, failures = 0, []
    for name, body in functions(text):
        if "mac_loop__" in name:
            continue
        for loop in innermost_loops(body):
            ins = [x for _, x in loop]
            dps = sum(1 for x in ins if x.startswith(mac))
            if dps < 4:
                continue
            checked += 1
            copies = [x for x in ins if VMOVE.match(x)]
            stores = [x for x in ins if STORE.match(x)]
            broadcasts = [x for x in ins if x.startswith("vpbroadcastd") and "(" in x]
            print(f"{name[:90]}: tile loop of {len(ins)} instructions, {dps} {mac}, {len(copies)} register copies, "
                  f"{len(stores)} stores")
            if copies or stores:
                failures.append(f"{name}: {copies[:3] + stores[:3]} in a tile loop")
            if len(broadcasts) * 3 < dps:
                failures.append(f"{name}: {len(broadcasts)} memory broadcasts for {dps} {mac}")
    return checked, failures


def gemm_member(text, isa, failures):
    """The disassembly of archive member gemm_ISA*.o (objdump heads each member with "NAME.o:     file format ...")
    where the library has the peak loop mac_loop__ISA; None without that loop, or, noted in `failures`, without the
    member."""
    if "mac_loop__" + isa not in text:
        return None
    member = re.search(r"^\S*gemm_" + isa + r"\S*\.o:\s+file format.*?(?=^\S+\.o:\s+file format|\Z)", text, re.S | re.M)
    if not member:
        failures.append(f"mac_loop__{isa} found but no gemm_{isa} object")
        return None
    return member.group(0)


def main():
    objdump, library = sys.argv[1], sys.argv[2]
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", library], check=True, capture_output=True,
                          text=True).stdout
    checked, failures = 0, []
    for name, body in functions(text):
        if "mac_loop__" not in name:
            continue
        best = None
        for i, (addr, ins) in enumerate(body):
            m = BRANCH.match(ins)
            if not m or int(m.group(2), 16) >= addr:
                continue
            loop = [x for x in body if int(m.group(2), 16) <= x[0] <= addr]
            macs = sum(1 for _, x in loop if MAC.match(x))
            if best is None or macs > best[0]:
                best = (macs, loop)
        checked += 1
        if best is None:
            failures.append(f"{name}: no loop found")
            continue
        macs, loop = best
        spills = [x for _, x in loop if MEMORY.search(x) and not BRANCH.match(x)]
        print(f"{name}: loop of {len(loop)} instructions, {macs} MACs, {len(spills)} with a memory operand")
        tile_loop = any(TILE_MAC.match(x) for _, x in loop)
        if macs < (4 if tile_loop else 8):
            failures.append(f"{name}: only {macs} MAC instructions in the loop")
        if spills:
            failures.append(f"{name}: memory operands in the loop: {spills[:4]}")
    if checked == 0:
        failures.append("no mac_loop__ function found in " + library)
    if "mac_loop__avx512vnni" in text:
        tiles, tile_failures = check_tile_loops(text)
        failures += tile_failures
        if tiles < 3:  # the 4 x 48, 4 x 32 and 4 x 16 tiles
            failures.append(f"only {tiles} AVX-512 GEMM tile loops found")
    # The AVX-VNNI tiles, in their own archive member: every vpdpbusd there VEX-encoded.
    member = gemm_member(text, "avxvnni", failures)
    if member:
        evex = [line.strip() for line in member.splitlines() if "vpdpbusd" in line and "{vex}" not in line]
        if evex:
            failures.append(f"gemm_avxvnni: vpdpbusd without the VEX encoding: {evex[:2]}")
        vnni_tiles = sum(1 for name, body in functions(member) if "mac_loop__" not in name
                         for loop in innermost_loops(body) if sum(1 for _, x in loop if x.startswith("vpdpbusd")) >= 4)
        print(f"gemm_avxvnni: {vnni_tiles} tile loops of at least 4 vpdpbusd, {len(evex)} vpdpbusd not VEX-encoded")
        if vnni_tiles < 3:  # at least the 6-, 4- and 2-row tiles
            failures.append(f"only {vnni_tiles} AVX-VNNI GEMM tile loops found")
    # The AVX2 tiles (vpmaddwd), in their own archive member: the AVX-512 row kernels use no vpmaddwd loops, but
    # other files may.
    member = gemm_member(text, "avx2", failures)
    if member:
        tiles, tile_failures = check_tile_loops(member, "vpmaddwd")
        failures += tile_failures
        if tiles < 4:  # tile<6>, tile<4> and each GEMM's inlined 2-row tile (the 1-row one has 2 vpmaddwd)
            failures.append(f"only {tiles} AVX2 GEMM tile loops found")
    for f in failures:
        print("FAIL: " + f)
    print(f"peak_loop_codegen: {checked} loops checked, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
