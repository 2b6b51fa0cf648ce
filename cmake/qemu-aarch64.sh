#!/bin/sh
# Runs an aarch64 binary under qemu-user. QATTN_QEMU_CPU selects the emulated CPU:
#   max          dotprod + i8mm (default)
#   neoverse-n1  dotprod only
exec qemu-aarch64 -cpu "${QATTN_QEMU_CPU:-max}" -L /usr/aarch64-linux-gnu "$@"
