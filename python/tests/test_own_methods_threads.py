"""qattn.analyze with methods of the user's own on several threads: one call at a time unless thread-safe, threads=,
Ctrl-C, and what a callable raises."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import qattn

SAMPLE = os.path.join(os.environ.get("QATTN_SOURCE", "."), "experiments", "data", "use-lite")  # 2 layers x 4 heads, batch 2


def np_softmax(logits):
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(m), m, 0))
    return e / e.sum(axis=1, keepdims=True)


class Overlaps:
    """A softmax that counts the calls running at once; it sleeps (releasing the GIL) inside each call and keeps the
    logits in between, as a callable with state would."""

    def __init__(self):
        self.lock, self.running, self.most, self.calls = threading.Lock(), 0, 0, 0
        self.logits = None

    def __call__(self, logits):
        with self.lock:
            self.running += 1
            self.most, self.calls = max(self.most, self.running), self.calls + 1
        self.logits = logits
        time.sleep(0.01)
        p = np_softmax(self.logits)  # another call's logits where calls overlap
        with self.lock:
            self.running -= 1
        return p


def test_a_callable_runs_one_call_at_a_time_unless_it_is_thread_safe():
    # Four items of one method (2 layers x 2 batch entries) on two workers: the calls of a callable that releases the
    # GIL overlapped (P CosSim far from 1), although the docstring promised one call at a time.
    fn = Overlaps()
    records = qattn.analyze(SAMPLE, qattn.Method("state", fn), threads=2, as_frame=False)
    assert fn.calls == 16 and fn.most == 1
    assert len(records) == 8 and all(abs(1 - r["P_cossim"]) < 1e-12 for r in records)
    # Methods that share one callable (a sweep's grid points) take turns too
    fn = Overlaps()
    records = qattn.analyze(SAMPLE, [qattn.Method("a", fn), qattn.Method("b", fn)], threads=2, as_frame=False)
    assert fn.calls == 32 and fn.most == 1 and all(abs(1 - r["P_cossim"]) < 1e-12 for r in records)
    fn = Overlaps()
    rows = qattn.sweep(SAMPLE, qattn.Method("swept", lambda logits, t: fn(logits)), {"t": [1, 2, 3]}, threads=2)
    assert fn.calls == 48 and fn.most == 1 and all(abs(1 - r["mean"]) < 1e-12 for r in rows)


def test_a_thread_safe_callable_may_overlap_and_keeps_its_flag():
    calls = []

    def stateless(logits):
        calls.append(1)
        time.sleep(0.01)
        return np_softmax(logits)

    m = qattn.Method("free", stateless, thread_safe=True)
    assert m.thread_safe and m.with_params(k=1).thread_safe and not qattn.Method("x", stateless).thread_safe
    assert repr(m) == "qattn.Method('free', kind='softmax', thread_safe=True)"
    records = qattn.analyze(SAMPLE, m, threads=2, as_frame=False)
    assert len(calls) == 16 and all(abs(1 - r["P_cossim"]) < 1e-12 for r in records)
    with pytest.raises(TypeError, match="thread_safe"):
        qattn.Method("x", stateless, thread_safe="yes")


def test_analyze_threads_is_the_clis_and_attention_threads_0_is_every_core():
    one = qattn.analyze(SAMPLE, ["fp16", qattn.Method("np", np_softmax)], threads=1, format="json")
    assert qattn.analyze(SAMPLE, ["fp16", qattn.Method("np", np_softmax)], threads=3, format="json") == one
    assert qattn.analyze(SAMPLE, ["fp16", qattn.Method("np", np_softmax)], threads=0, format="json") == one
    for bad in (-1, 1025):
        with pytest.raises(ValueError, match=r"threads: %d is outside \[0, 1024\]" % bad):
            qattn.analyze(SAMPLE, "fp16", threads=bad)
    with pytest.raises(TypeError):
        qattn.analyze(SAMPLE, "fp16", threads=1.5)
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 3, 128, 64)) for _ in range(3))
    o1 = qattn.attention(q, k, v, "intattention", threads=1)
    assert np.array_equal(qattn.attention(q, k, v, "intattention", threads=0), o1)  # was: ValueError (>= 1)
    for bad in (-1, 1025):
        with pytest.raises(ValueError, match=r"threads: %d is outside \[0, 1024\]" % bad):
            qattn.attention(q, k, v, "intattention", threads=bad)


def innermost_function(tb):
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(3), RuntimeError("my bug")],
                         ids=["KeyboardInterrupt", "SystemExit", "RuntimeError"])
def test_what_a_callable_raises_leaves_analyze_as_itself_with_qattns_context(error):
    # Was: ValueError("broken raised KeyboardInterrupt: \x0a\x0aAt: ..."), not chained to the callable's exception.
    def broken_softmax(logits):
        raise error

    def broken_attention(q, k, v, scale, mask):
        if np.array_equal(q, layer1_batch1_q[2]):
            raise error
        return np_softmax(scale * q @ k.T) @ v

    layer1_batch1_q = [np.load(os.path.join(SAMPLE, "layer1_head%d_q.npy" % h))[1].astype(np.float64) for h in range(4)]
    for method, softmax_only, where in [
            (qattn.Method("broken", broken_softmax), True, "layer0_head0_logits.npy"),
            (qattn.Method("broken", broken_softmax), False, "layer0_head0_q.npy and its 4 heads, batch entry 0"),
            (qattn.Method("broken", broken_attention, kind="attention"), False,
             "layer1_head0_q.npy and its 4 heads, batch entry 1")]:
        with pytest.raises(type(error)) as raised:
            qattn.analyze(SAMPLE, ["fp16", method], softmax_only=softmax_only, threads=1)
        assert raised.value is error
        assert innermost_function(raised.value.__traceback__) == method.fn.__name__  # pdb.pm() reaches the callable
        note = raised.value.__notes__[-1]
        assert note.startswith("qattn.analyze: ") and where in note and "method broken" in note, note
        assert "broken raised " + type(error).__name__ in note and "\\x0a" not in note
        if method.kind == "attention":
            assert "(head 2 of the call's 4)" in note
        del raised.value.__notes__  # the same exception again in the next case
        raised.value.__traceback__ = None
    # A result qattn cannot use is still a ValueError naming the method
    with pytest.raises(ValueError, match="nan.*P holds NaN"):
        qattn.analyze(SAMPLE, qattn.Method("nan", lambda logits: logits * np.nan), threads=2)


CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    import qattn

    def slow(logits):
        print("started", flush=True)
        time.sleep(0.5)
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        return e / e.sum(axis=1, keepdims=True)

    def registry_dump(path):  # four heads of 4096 x 64: about 20 s of work for the methods below on 2 cores
        rng = np.random.default_rng(1)
        for h in range(4):
            for x in "qkv":
                np.save("%s/layer0_head%d_%s.npy" % (path, h, x), rng.standard_normal((4096, 64)).astype(np.float32))

    sample, kind, path = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "registry":
        registry_dump(path)
    try:
        if kind == "callable":
            qattn.analyze(sample, qattn.Method("slow", slow), threads=2)
        else:
            print("started", flush=True)
            qattn.analyze(path, ["fp32", "fp16", "bf16", "index", "sas"], threads=2)
        print("finished")
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        # the workers are joined and the pool is usable again
        print(len(qattn.analyze(sample, "fp16", threads=2, as_frame=False)), flush=True)
""")


@pytest.mark.parametrize("kind", ["callable", "registry"])
def test_ctrl_c_stops_analyze_within_about_a_second(kind, tmp_path):
    # Was: ignored until the analysis ended (16 calls of 0.5 s one after another; the registry's methods over 4096
    # rows: tens of seconds).
    child = subprocess.Popen([sys.executable, "-c", CHILD, SAMPLE, kind, str(tmp_path)], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert child.stdout.readline() == "started\n"
        time.sleep(1.0)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0 and out.splitlines()[-2:] == ["KeyboardInterrupt", "8"], out
    assert took < 15.0, "%.2f s from SIGINT to exit" % took  # about 1 s on 2 busy cores (the analysis: 20 s)
