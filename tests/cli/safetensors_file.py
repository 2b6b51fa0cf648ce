"""A .safetensors file written member by member, for the CLI tests that forge vector files
(tests/cli/hardening_mma_test.sh): the 8-byte little-endian header length, the JSON header padded with spaces to a
multiple of 8 bytes, then each member's bytes in the order given.
"""
import json


def write_safetensors(path, members):
    """members: (name, dtype code, shape, bytes); the bytes need not match the shape (the tests forge such files)."""
    header, data = {}, b""
    for name, code, shape, payload in members:
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(len(text).to_bytes(8, "little") + text + data)
