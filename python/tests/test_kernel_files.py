"""Kernel description files (docs/kernels-as-data.md) from Python: a file `qattn kernel show` printed runs wherever a
method spec is taken, with the numbers of the method it came from; bad files raise ValueError naming file and field."""
import os
import subprocess

import numpy as np
import pytest

import qattn

SAMPLE = os.path.join(os.environ.get("QATTN_SOURCE", "."), "experiments", "data", "use-lite")
CLI = os.environ.get("QATTN_CLI", "qattn")


def shown(spec, path):
    path.write_text(subprocess.run([CLI, "kernel", "show", spec], capture_output=True, text=True, check=True).stdout)
    return str(path)


@pytest.mark.parametrize("spec", ["fa3-fp8", "sage2@paper-8b", "sage1:acc=fp32"])
def test_a_shown_kernel_file_gives_the_numbers_of_its_method(spec, tmp_path):
    f = shown(spec, tmp_path / "k.json")
    keys = ["O_cossim", "O_rel_l1", "P_kl_mean"]
    a = qattn.analyze(SAMPLE, [spec])
    b = qattn.analyze(SAMPLE, ["file:" + f])
    assert [r["method"] for r in b[:1]] == ["file:" + f]
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    # and through attention(), bit for bit
    rng = np.random.default_rng(51)
    q, k, v = (rng.standard_normal((1, 2, 40, 64)).astype(np.float32) for _ in range(3))
    assert np.array_equal(qattn.attention(q, k, v, spec, causal=True), qattn.attention(q, k, v, "file:" + f, causal=True))


def test_one_field_changed_by_the_spec(tmp_path):
    f = shown("fa3-fp8", tmp_path / "k.json")
    base = qattn.analyze(SAMPLE, ["file:" + f])
    changed = qattn.analyze(SAMPLE, ["file:" + f + ",p.offset=4"])
    assert [r["O_cossim"] for r in base] != [r["O_cossim"] for r in changed]


def test_bad_files_name_the_file_and_the_field(tmp_path):
    f = shown("fa3-fp8", tmp_path / "k.json")
    bad = tmp_path / "bad.json"
    bad.write_text(open(f).read().replace('"offset"', '"ofset"'))
    with pytest.raises(ValueError, match=r"bad\.json.*p\.ofset.*no such field"):
        qattn.analyze(SAMPLE, ["file:" + str(bad)])
    with pytest.raises(ValueError, match=r"p\.offset.*not allowed"):
        qattn.analyze(SAMPLE, ["file:" + f + ",p.offset=x"])
