#!/usr/bin/env python3
"""Checks the generated code of every int8 MAC peak loop (qattn::kernels::mac_loop__*) in the kernels library: its
hot loop (the backward branch enclosing the most multiply-accumulate instructions) must hold at least 8 of them and
no instruction with a memory operand, i.e. no accumulator is spilled or reloaded, so the bench's peak is the
register-only rate of the instruction the GEMMs use.

    peak_loop_codegen.py OBJDUMP LIBRARY.a
"""
import re
import subprocess
import sys

MAC = re.compile(r"^(vpdpbusd|vpmaddwd|imul|sdot|usdot|madd)\b")
BRANCH = re.compile(r"^(j[a-z]+|b\.[a-z]+|b|cbnz|cbz|tbnz|tbz)\s+([0-9a-f]+)\b")
MEMORY = re.compile(r"\(|\[")  # AT&T (%reg) / Arm [xN]


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
            body.append((int(ins.group(1), 16), ins.group(2).strip()))
    if name:
        yield name, body


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
        if macs < 8:
            failures.append(f"{name}: only {macs} MAC instructions in the loop")
        if spills:
            failures.append(f"{name}: memory operands in the loop: {spills[:4]}")
    if checked == 0:
        failures.append("no mac_loop__ function found in " + library)
    for f in failures:
        print("FAIL: " + f)
    print(f"peak_loop_codegen: {checked} loops checked, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
