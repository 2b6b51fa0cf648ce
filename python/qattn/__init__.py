"""qattn: quantized softmax and attention, verified with exact arithmetic.

The Python face of the C++ library: the method registry, softmax and attention with any registered method (the
fused integer kernels where a method has them, bit for bit the reference model), the error metrics, and tensor
files. Method specs are the CLI's: ``"intattention@upstream-neon:k-group=64"``.

Inputs are NumPy arrays of float32 or float64 (float16 is widened to float32 first, exactly). A C-contiguous, aligned float64 array is read in place, without a
copy; so are C-contiguous, aligned float32 arrays given to ``softmax``, ``attention`` (q, k, v all float32) and
``compare``, and int8 / int16 / int32 integer logits of ``softmax_integer``. Any other array is converted once to
float64 (int32 for integer logits), exactly.
Outputs are new arrays. The GIL is released while qattn computes. python/README.md says which method copies what.
"""

import operator

from . import _qattn
from . import plot
from ._lowp import fp8_encode, lowp_decode, lowp_encode, mma, mma_models, mx_quantize, nvfp4_quantize
from ._calls import _native, _widen16
from .plot import write_csv

__version__ = _qattn.__version__  # the project's version: `qattn --version` prints the same

__all__ = ["methods", "quantizers", "canonical", "softmax", "softmax_integer", "exact_softmax", "attention",
           "quantize_kv", "quantize_weights", "compare", "Method", "analyze", "sweep", "fp8_encode", "lowp_encode",
           "lowp_decode", "mx_quantize", "nvfp4_quantize", "mma", "mma_models", "load", "save", "plot", "write_csv"]


def methods():
    """List the registered methods.

    Returns
    -------
    list of dict
        One dict per method: ``name``, ``summary``, ``kind`` (``float format``, ``softmax model`` or
        ``attention pipeline``), ``doc`` (its page in the repository), ``params`` (each a dict with ``key``,
        ``default``, ``doc``, ``choices``) and ``presets`` (each a dict with ``name``, ``values``, ``doc``; an old
        spelling kept for one release has ``alias_of``, the preset it now means, and no values).
    """
    return _qattn.methods()


def canonical(spec):
    """Resolve a method spec to its canonical form, every parameter spelled out.

    Parameters
    ----------
    spec : str
        ``name[@preset][:key=value,...]``, as ``qattn --method`` takes it.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        For an unknown method, preset or key, or a value out of range, with the CLI's message.
    """
    return _native("canonical", _qattn.canonical, spec)


def softmax(logits, method, engine="auto"):
    """Softmax of every row (the last axis) of ``logits`` by ``method``.

    Parameters
    ----------
    logits : ndarray of float32 or float64, shape (..., L)
        ``-inf`` masks an entry (P = 0 there); a row of only ``-inf`` gives zeros. NaN and ``+inf`` are refused.
    method : str
        A method with a softmax form (``qattn.methods()``, kind other than ``attention pipeline``).
    engine : {"auto", "fast", "reference"}

    Returns
    -------
    ndarray of float64, shape (..., L)
        The probabilities (an integer P divided by its scale for the integer methods).
    """
    return _native("softmax", _qattn.softmax, _widen16(logits), method, engine)


def attention(q, k, v, method, scale=None, causal=False, mask=None, return_probs=False, engine="auto", threads=1,
              kv=None, raw=False):
    """``softmax(scale q k^T) v`` by ``method``, for every batch entry and head.

    Parameters
    ----------
    q : ndarray of float32 or float64, shape (..., L_q, d)
    k : ndarray of float32 or float64, shape (..., L_k, d)
    v : ndarray of float32 or float64, shape (..., L_k, d_v)
        Leading axes must match, but for the heads' (below). With three or more axes, the axis before L is the heads
        of one layer: methods that treat heads together (TurboAttention's head-wise KV bits) see them in one call.
        Grouped-query attention: k and v may have H_kv heads on that axis where q has H_q, H_kv dividing H_q; query
        head h reads K/V head ``h // (H_q // H_kv)`` (contiguous groups, as Hugging Face's ``repeat_kv``), from your
        array, not a repeated copy; a count that does not divide is a ValueError naming both. C-contiguous float64
        arrays, and C-contiguous float32 q, k and v together, are read in place: the fused kernels quantise float32
        straight from your buffer; reference models widen one call's heads to float64. The bits are the same either
        way (float32 widens exactly).
    method : str or Method
        Any registered method spec, or a method of your own (``qattn.Method``, softmax or attention kind), run on the
        calling thread; what its callable raises is raised as itself (``engine`` and ``threads`` do not apply).
    scale : float, optional
        Logit scale; default ``1 / sqrt(d)``.
    causal : bool
        Bottom-right aligned causal mask: query i sees keys j <= i + L_k - L_q.
    mask : ndarray of bool, shape (L_q, L_k), optional
        Padding mask, True = visible, the same for every batch entry and head; combined with ``causal``.
    return_probs : bool
        Also return P. Without it the fused kernels never hold P (memory O(block L_k)).
    engine : {"auto", "fast", "reference"}
        ``auto`` runs the fused kernels where they compute the method's bits, else the reference model; ``fast``
        refuses a method without fused kernels; ``reference`` always runs the reference model.
    threads : int
        Threads of one fused call, in [0, 1024]; 0 is one per hardware thread, as ``qattn attention --threads 0``.
        Every count gives the same bits.
    kv : str, optional
        A KV-cache quantizer spec (``qattn.quantizers()["kv"]``, e.g. ``"turboquant:bits=3"``) applied to the K and
        V of every call before the method, as ``qattn analyze --kv`` does: Q is rotated where the quantizer rotates
        K, and O rotated back where it rotates V. The reference engine runs it.
    raw : bool
        With ``return_probs``: P in the method's integer dtype (uint8 P x 255 or int8 P x 127) instead of float64.
        ``ValueError`` for a method without an integer P.

    Returns
    -------
    o : ndarray of float64, shape (..., L_q, d_v)
    p : ndarray of float64 (uint8 or int8 with ``raw``), shape (..., L_q, L_k)
        Only with ``return_probs``.
    """
    if isinstance(method, Method):
        method = method._entry()
    elif not isinstance(method, str):
        raise TypeError("attention: method must be a spec (str) or a qattn.Method, got " + type(method).__name__)
    return _native("attention", _qattn.attention, _widen16(q), _widen16(k), _widen16(v), method, scale, causal, mask,
                   return_probs, engine, operator.index(threads), kv or "", raw)


def softmax_integer(logits, method, cint=None, alpha=None):
    """Softmax of integer logits (e.g. the INT32 ``Q K^T`` of an integer pipeline) by an integer method.

    Parameters
    ----------
    logits : ndarray of int8, int16 or int32, shape (..., L)
        Read in place when C-contiguous (the model widens one row at a time to int32); else converted once.
    method : str
        A method with an integer form: today ``index`` (IndexSoftmax, docs/methods/index-softmax.md).
    cint : int, optional
        The clip of the integer logits, used as given (IndexSoftmax's ``c_int``).
    alpha : float, optional
        The scale of the logits (real logit = alpha * integer); the method derives its own clip from it. Give
        exactly one of ``cint`` and ``alpha``.

    Returns
    -------
    p : ndarray of float64, shape (..., L)
        The probabilities (raw / raw_scale where the method has an integer P).
    raw : ndarray of uint8 or int8, shape (..., L), or None
        The integer P, for methods that produce one (``qattn softmax --raw``).
    raw_scale : float
        ``p == raw / raw_scale`` (255 for UINT8 P, 127 for INT8 P).

    Raises
    ------
    TypeError
        For a float or 64-bit array.
    ValueError
        For both or neither of ``cint`` and ``alpha``, or a method without an integer form.
    """
    return _native("softmax_integer", _qattn.softmax_integer, logits, method, cint, alpha)


def exact_softmax(logits, decimal=False):
    """The exact softmax of every row (the last axis), in 50 significant digits (Boost.Multiprecision).

    The reference of ``qattn analyze --reference exact`` (docs/softmax-reference.md): exp and the sum carried out in
    ``cpp_bin_float_50``, each probability rounded once at the end.

    Parameters
    ----------
    logits : ndarray of float32 or float64, shape (..., L)
        ``-inf`` masks an entry; NaN and ``+inf`` are refused.
    decimal : bool
        Return ``decimal.Decimal`` objects with all 50 digits instead of float64 (each rounded once).

    Returns
    -------
    ndarray of float64 (or of object, holding Decimal), shape (..., L)
    """
    return _native("exact_softmax", _qattn.exact_softmax, logits, decimal)


def quantize_kv(k, v, spec):
    """Apply a KV-cache quantizer to the K and V of the heads of one layer.

    Parameters
    ----------
    k : ndarray of float32 or float64, shape (heads, L, d) or (L, d)
    v : ndarray of float32 or float64, shape (heads, L, d_v) or (L, d_v)
    spec : str
        ``qattn.quantizers()["kv"]``: ``rtn``, ``kivi``, ``flashq``, ``turboquant``, ``saw`` with parameters, e.g.
        ``"kivi:bits=2"``.

    Returns
    -------
    dict
        ``k``, ``v`` (dequantized, float64, the input shapes), ``rotation`` (the orthonormal [d, d] matrix K is
        expressed in, or None: attention must then use ``q @ rotation``), ``v_rotated`` (V too: the output is then
        ``o @ rotation.T``), ``k_bits`` and ``v_bits`` (bits per stored element, scales included).
    """
    return _native("quantize_kv", _qattn.quantize_kv, k, v, spec)


def quantize_weights(w, x, spec):
    """Quantize projection weights ``W`` [in, out] (``y = x W + b``) with calibration inputs ``X`` [n, in].

    Parameters
    ----------
    w : ndarray of float32 or float64, shape (in, out)
    x : ndarray of float32 or float64, shape (n, in)
    spec : str
        ``qattn.quantizers()["weights"]``: ``rtn``, ``gptq``, ``awq`` with parameters, e.g. ``"gptq:bits=3"``.

    Returns
    -------
    ndarray of float64, shape (in, out)
        The dequantized weights.
    """
    return _native("quantize_weights", _qattn.quantize_weights, w, x, spec)


def quantizers():
    """List the KV-cache and weight quantizers.

    Returns
    -------
    dict
        ``{"kv": [...], "weights": [...]}``, each entry as in ``qattn.methods()``.
    """
    return _qattn.quantizers()


# The JSON reports spell non-finite metrics "nan", "inf" and "-inf", as the tables do (docs/metrics.md); records and
# summaries hold them as the floats they stand for.
_NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _number(v):
    return _NONFINITE.get(v, v) if isinstance(v, str) else v


class Method:
    """A method of your own, evaluated by ``analyze`` and ``sweep`` beside the registry's: the same fp64 reference,
    metrics, summaries and threads (docs/streaming.md).

    Parameters
    ----------
    name : str
        The name its results carry (with its parameters: ``"topk:k=8"``).
    fn : callable
        ``kind="softmax"``: ``fn(logits, **params) -> P``, logits a float64 array ``(rows, L)`` with masked entries
        ``-inf``, P of the same shape; inside attention it sits between float64 logits ``scale q k^T`` and float64
        ``P V``, as the registry's softmax models do. ``kind="attention"``: ``fn(q, k, v, scale, mask, **params)``
        returning O ``(L_q, d_v)`` or ``(O, P)``; ``mask`` is None or a bool array ``(L_q, L_k)``, True where the
        query sees the key. It is called from qattn's worker threads, under the GIL, and one call at a time unless
        ``thread_safe``: the calls of every method of an analysis that is not thread-safe are made one after another,
        even where ``fn`` releases the GIL (``time.sleep``, NumPy on large arrays), so ``fn`` may keep state between
        calls (in which order the heads come is not fixed). What ``fn`` raises (``KeyboardInterrupt`` and
        ``SystemExit`` included) leaves ``analyze`` as itself, with its traceback, and a note naming the method, the
        file, the layer and the head (``BaseException.add_note``, Python 3.11 and newer); a result of the wrong shape
        or with NaN raises ValueError naming the method.
    kind : {"softmax", "attention"}
    thread_safe : bool
        ``fn`` may run in several threads at once (it keeps no state, or guards it): its calls overlap wherever it
        releases the GIL. Default False. ``with_params`` keeps it.
    **params
        Fixed keyword arguments of ``fn``; ``sweep`` varies them as grid axes.
    """

    def __init__(self, name, fn, kind="softmax", *, thread_safe=False, **params):
        if not callable(fn):
            raise TypeError("Method: fn must be callable, got " + type(fn).__name__)
        if kind not in ("softmax", "attention"):
            raise ValueError("Method: kind must be 'softmax' or 'attention', got " + repr(kind))
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError("Method: name must be a non-empty string without ':', got " + repr(name))
        if not isinstance(thread_safe, bool):
            raise TypeError("Method: thread_safe must be True or False, got " + repr(thread_safe))
        self.name, self.fn, self.kind, self.params = name, fn, kind, dict(params)
        self.thread_safe = thread_safe

    @property
    def label(self):
        """The name its results carry: ``name`` or ``name:key=value,...``."""
        if not self.params:
            return self.name
        return self.name + ":" + ",".join("%s=%s" % (k, v) for k, v in self.params.items())

    def with_params(self, **params):
        """The same method with these parameters set (the others kept)."""
        return Method(self.name, self.fn, self.kind, thread_safe=self.thread_safe, **dict(self.params, **params))

    def __repr__(self):
        return "qattn.Method(%r, kind=%r%s)" % (self.label, self.kind, ", thread_safe=True" if self.thread_safe else "")

    def _entry(self):
        import functools
        fn = functools.partial(self.fn, **self.params) if self.params else self.fn
        return (self.label, fn, self.kind, self.thread_safe)


def _split_methods(methods):
    """Specs (str) and own methods ((label, callable, kind)) from a spec, a Method, or a sequence of them."""
    if methods is None:
        return [], []
    if isinstance(methods, (str, Method)):
        methods = [methods]
    specs, own = [], []
    for m in methods:
        if isinstance(m, str):
            specs.append(m)
        elif isinstance(m, Method):
            own.append(m._entry())
        else:
            raise TypeError("methods: a spec (str), a qattn.Method, or a sequence of them; got " + type(m).__name__)
    return specs, own


def analyze(dump, methods=None, kv=None, weights=None, softmax_only=False, reference="fp64", engine="auto",
            as_frame=False, format=None, threads=0, summary=False, columns=None):
    """Error of each method against the fp64 (or exact) reference over a dump, as ``qattn analyze`` reports it.

    Parameters
    ----------
    dump : str or os.PathLike
        A directory of ``layer{L}_head{H}_{q,k,v}.npy`` (or ``_logits.npy``), or one .npz / .safetensors file.
    methods : str, Method, or a sequence of them, optional
        Method specs (``"turbo"`` or ``["fp16", "index@paper"]``) and methods of your own (``qattn.Method``);
        default every registered method but fp64 (the softmax models with ``softmax_only``). Given only own
        methods, only they run.
    kv, weights : str, optional
        A KV-cache or weight quantizer applied first (``qattn analyze --kv`` / ``--weights``).
    softmax_only : bool
        Evaluate the softmax models on the dump's logits instead of attention.
    reference : {"fp64", "exact"}
        The softmax-only reference.
    engine : {"auto", "fast", "reference"}
    as_frame : bool
        Return a pandas DataFrame instead of the records (``analyze(...).to_frame()`` is the same). Default False:
        the type returned does not depend on what is installed; pandas is needed only for a frame.
    format : {"md", "csv", "latex", "json"}, optional
        Return the report as text instead, byte for byte what ``qattn analyze --format FORMAT`` writes for the same
        dump path and specs, the methods in the order given (your own among them).
    summary : bool
        With ``format`` md, csv or latex: only each method's mean and worst rows (``qattn analyze --summary``).
    columns : str or sequence of str, optional
        With ``format`` md, csv or latex: the metric columns shown, in this order (``qattn analyze --columns``; ids
        as the records' keys, docs/metrics.md "The analysis table"). For a frame: ``records.to_frame(columns=...)``.
    threads : int
        Worker threads over the (head, block of query rows) items, in [0, 1024]; 0 (the default) is one per hardware
        thread, as ``qattn analyze --threads 0``. The results do not depend on it (docs/streaming.md).

    Returns
    -------
    list of dict, pandas.DataFrame, or str (with ``format``)
        One record per layer, head and method: ``layer``, ``head``, ``method``, ``O_cossim``,
        ``O_one_minus_cossim``, ``O_rel_l1``, ``O_rmse``, ``P_cossim``, ``P_one_minus_cossim``, ``P_rel_l1``,
        ``P_rmse``, ``P_max_abs``, ``P_bias``, ``P_kl_mean``, ``K_bits``, ``V_bits`` (the O columns are absent for
        softmax-only analysis). ``*_one_minus_cossim`` is 1 - CosSim from the error's own sums: it keeps the digits
        of a CosSim that rounds to 1. ``records.summary`` (or
        ``frame.attrs["summary"]``) holds the mean and worst rows of each method.

    Raises
    ------
    KeyboardInterrupt
        On Ctrl-C, within about a second: the workers stop between blocks and between calls of your methods, and
        are joined first (a block, or a call of a method without blocks, already running is finished).
    BaseException
        Whatever a ``Method``'s callable raised, as itself (see ``Method``).
    """
    import os
    specs, own = _split_methods(methods)
    if format is not None and format not in ("md", "csv", "latex", "json"):
        raise ValueError("analyze: format must be one of md, csv, latex, json, got %r" % (format,))
    columns = _column_list(columns)
    if (summary or columns) and format is None:
        raise ValueError("analyze: summary and columns choose what a text table shows (format='md', 'csv' or "
                         "'latex'); records keep every row and metric: records.to_frame(summary=..., columns=...)")
    if not isinstance(summary, bool):
        raise TypeError("analyze: summary must be True or False, got " + type(summary).__name__)
    order = []
    for m in ([methods] if isinstance(methods, (str, Method)) else list(methods or [])):
        label = m if isinstance(m, str) else m.label if isinstance(m, Method) else None
        if label is not None and label not in order:
            order.append(label)
    report = _native("analyze", _qattn.analyze_report, os.fspath(dump), specs, kv or "", weights or "", softmax_only,
                     reference, engine, own, format or "", operator.index(threads), summary, columns, order)
    if format is not None:
        return report["text"]
    records = []
    for h in report["heads"]:
        r = {"layer": h["layer"], "head": h["head"], "method": h["method"]}
        if not softmax_only:
            r.update(O_cossim=h["O"]["cossim"], O_one_minus_cossim=h["O"]["one_minus_cossim"],
                     O_rel_l1=h["O"]["rel_l1"], O_rmse=h["O"]["rmse"])
        r.update(P_cossim=h["P"]["cossim"], P_one_minus_cossim=h["P"]["one_minus_cossim"], P_rel_l1=h["P"]["rel_l1"],
                 P_rmse=h["P"]["rmse"],
                 P_max_abs=h["P"]["max_abs"], P_bias=h["P"]["bias"], P_kl_mean=h["P_kl_mean"],
                 K_bits=h["K_bits"], V_bits=h["V_bits"])
        records.append({k: (v if k in ("layer", "head", "method") else _number(v)) for k, v in r.items()})
    for s in report["summary"]:
        for part in ("mean", "worst"):
            s[part] = {k: _number(v) for k, v in s[part].items()}
    # The methods in the order given (the native records have the registry's specs first, then the own methods)
    rank = {label: i for i, label in enumerate(order)}
    heads = {}
    for r in records:
        heads.setdefault((r["layer"], r["head"]), len(heads))
    records.sort(key=lambda r: (heads[(r["layer"], r["head"])], rank.get(r["method"], len(rank))))
    result = _Records(records, sorted(report["summary"], key=lambda s: rank.get(s["method"], len(rank))))
    return result.to_frame() if as_frame else result


class _Records(list):
    """The per-head records of ``analyze``, with ``summary``: the mean and worst rows of each method."""

    def __init__(self, records, summary):
        super().__init__(records)
        self.summary = summary

    def to_frame(self, summary=False, columns=None):
        """The records as a pandas DataFrame (one row per layer, head and method; ``frame.attrs["summary"]`` holds
        ``summary``), or with ``summary=True`` the summary: one row per method and statistic (``stat``: "mean" or
        "worst"), in the order of ``summary``, metric columns named as the records'. ``columns`` keeps these metric
        columns, in this order, after the row's names (a comma-separated str or a sequence; an id that is not a
        column, or given twice, is a ValueError listing the columns). ImportError without pandas."""
        import pandas
        if not summary:
            names = ["layer", "head", "method"]
            frame = pandas.DataFrame.from_records(list(self))
        else:
            names = ["method", "stat"]
            rows = []
            for s in self.summary:
                for stat in ("mean", "worst"):
                    row = {"method": s["method"], "stat": stat}
                    row.update((k, v) for k, v in s[stat].items())
                    rows.append(row)
            frame = pandas.DataFrame.from_records(rows)
        chosen = _column_list(columns)
        if chosen:
            valid = [c for c in frame.columns if c not in names]
            for i, c in enumerate(chosen):
                if c not in valid or c in chosen[:i]:
                    raise ValueError("to_frame: column %r is %s; the columns are %s"
                                     % (c, "given twice" if c in chosen[:i] else "not a column", ", ".join(valid)))
            frame = frame[names + chosen]
        if not summary:
            frame.attrs["summary"] = self.summary
        return frame


def _column_list(columns):
    """Column ids from None, a comma-separated str, or a sequence of str."""
    if columns is None:
        return []
    if isinstance(columns, str):
        return columns.split(",")
    if not all(isinstance(c, str) for c in columns):
        raise TypeError("columns: a comma-separated str or a sequence of str")
    return list(columns)


_SWEEP_METRICS = ("cossim", "one_minus_cossim", "rel_l1", "rmse", "kl")


def sweep(dump, method, grid, metric="cossim", target="O", softmax_only=False, engine="auto", threads=0):
    """One method over a grid of its parameters: the mean and worst over the dump's heads at each point, as
    ``qattn sweep`` reports them.

    Parameters
    ----------
    dump : str or os.PathLike
    method : str or Method
        A spec (``"index@paper"``: the grid's keys are its parameters) or a method of your own (the grid's keys are
        keyword arguments of its ``fn``).
    grid : dict
        ``{key: values}``, one axis per key; points in the order of ``itertools.product`` (last key fastest). An
        axis is a list, tuple, range or 1-D ``numpy.ndarray`` of at least one value; anything else (``4``, ``6.6``,
        ``"s8"``, ``True``, a 0-d array) is a single value: ``{"b": 4}`` is ``{"b": [4]}``, and a string is one value,
        not its characters.
    metric : {"cossim", "one_minus_cossim", "rel_l1", "rmse", "kl"}
    target : {"O", "P"}
        kl applies to P only; softmax_only has P only.
    threads : int
        As ``analyze``'s: [0, 1024], 0 (the default) one per hardware thread.

    Returns
    -------
    list of dict
        One per point: its values by key, ``method`` (the point's spec or label), ``mean`` and ``worst``.
    """
    import itertools

    import numpy as np

    def axis(key, values):  # a sequence's values, or a scalar as the one value
        if isinstance(values, np.ndarray):
            if values.ndim > 1:
                raise ValueError("sweep: grid axis %r is a %d-D array; an axis is a scalar or 1-D"
                                 % (key, values.ndim))
            return list(values) if values.ndim == 1 else [values[()]]
        return list(values) if isinstance(values, (list, tuple, range)) else [values]

    if metric not in _SWEEP_METRICS or target not in ("O", "P") or (metric == "kl" and target != "P"):
        raise ValueError("sweep: metric must be one of cossim, one_minus_cossim, rel_l1, rmse (O or P) or kl (P), "
                         "got %r on %r"
                         % (metric, target))
    if not grid:
        raise ValueError("sweep: the grid needs at least one axis")
    keys = list(grid)
    axes = [axis(k, grid[k]) for k in keys]
    if any(not a for a in axes):
        raise ValueError("sweep: every grid axis needs at least one value; empty: "
                         + ", ".join(repr(k) for k, a in zip(keys, axes) if not a))
    points = [dict(zip(keys, p)) for p in itertools.product(*axes)]
    if isinstance(method, str):
        base, _, given = method.partition(":")
        fixed = dict(kv.split("=", 1) for kv in given.split(",")) if given else {}
        entries = [base + ":" + ",".join("%s=%s" % kv for kv in dict(fixed, **{k: str(v) for k, v in p.items()}).items())
                   for p in points]
        labels = entries
    elif isinstance(method, Method):
        entries = [method.with_params(**p) for p in points]
        labels = [m.label for m in entries]
    else:
        raise TypeError("sweep: method must be a spec (str) or a qattn.Method, got " + type(method).__name__)
    if len(set(labels)) != len(labels):
        raise ValueError("sweep: grid points that name the same method: " + ", ".join(labels))
    records = analyze(dump, entries, softmax_only=softmax_only, engine=engine, as_frame=False, threads=threads)
    name = target + "_" + metric
    summary = {s["method"]: s for s in records.summary}
    heads = sum(1 for r in records if r["method"] == labels[0])
    return _SweepRows([dict(p, method=label, mean=summary[label]["mean"][name], worst=summary[label]["worst"][name])
                       for p, label in zip(points, labels)], target, metric, heads)


class _SweepRows(list):
    """qattn.sweep's rows, with the sweep's ``target``, ``metric`` and ``heads`` (read by qattn.plot.write_csv)."""

    def __init__(self, rows, target, metric, heads):
        super().__init__(rows)
        self.target, self.metric, self.heads = target, metric, heads


def compare(a, b):
    """Error metrics of ``a`` against the reference ``b`` (same shape).

    Returns
    -------
    dict
        ``count``, ``nonfinite``, ``cossim``, ``one_minus_cossim``, ``rel_l1`` (sum |a - b| / sum |b|), ``rmse``,
        ``max_abs``, ``bias`` (mean of a - b), ``median_abs``, as ``qattn analyze`` computes them.
    """
    return _native("compare", _qattn.compare, _widen16(a), _widen16(b))


def load(path):
    """Read a tensor file: ``.npy`` (one tensor, named after the file's stem), ``.npz`` or ``.safetensors``.

    Returns
    -------
    dict of str to ndarray
        In the file's dtype; float16 and bfloat16 are widened exactly to float32.
    """
    return _native("load", _qattn.load, path)


def save(path, arrays):
    """Write float32 / float64 arrays to ``.npy`` (exactly one), ``.npz`` or ``.safetensors``, atomically.

    Parameters
    ----------
    path : str
    arrays : dict of str to ndarray
    """
    _native("save", _qattn.save, path, arrays)
