"""qattn: quantized softmax and attention, verified with exact arithmetic.

The Python face of the C++ library: the method registry, softmax and attention with any registered method (the
fused integer kernels where a method has them, bit for bit the reference model), the error metrics, and tensor
files. Method specs are the CLI's: ``"intattention@upstream-neon:k-group=64"``.

Inputs are NumPy arrays of float32 or float64; they are converted once to float64, exactly, because every method
takes float64 inputs. Outputs are new float64 arrays. The GIL is released while qattn computes.
"""
from . import _qattn

__all__ = ["methods", "canonical", "softmax", "attention", "compare", "load", "save"]


def methods():
    """List the registered methods.

    Returns
    -------
    list of dict
        One dict per method: ``name``, ``summary``, ``kind`` (``float format``, ``softmax model`` or
        ``attention pipeline``), ``doc`` (its page in the repository), ``params`` (each a dict with ``key``,
        ``default``, ``doc``, ``choices``) and ``presets`` (each a dict with ``name``, ``values``, ``doc``).
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
    return _qattn.canonical(spec)


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
    return _qattn.softmax(logits, method, engine)


def attention(q, k, v, method, scale=None, causal=False, mask=None, return_probs=False, engine="auto", threads=1):
    """``softmax(scale q k^T) v`` by ``method``, for every batch entry and head.

    Parameters
    ----------
    q : ndarray of float32 or float64, shape (..., L_q, d)
    k : ndarray of float32 or float64, shape (..., L_k, d)
    v : ndarray of float32 or float64, shape (..., L_k, d_v)
        Leading axes must match. With three or more axes, the axis before L is the heads of one layer: methods
        that treat heads together (TurboAttention's head-wise KV bits) see them in one call.
    method : str
        Any registered method spec.
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
        Threads of one fused call; every count gives the same bits.

    Returns
    -------
    o : ndarray of float64, shape (..., L_q, d_v)
    p : ndarray of float64, shape (..., L_q, L_k)
        Only with ``return_probs``.
    """
    return _qattn.attention(q, k, v, method, scale, causal, mask, return_probs, engine, threads)


def compare(a, b):
    """Error metrics of ``a`` against the reference ``b`` (same shape).

    Returns
    -------
    dict
        ``count``, ``nonfinite``, ``cossim``, ``rel_l1`` (sum |a - b| / sum |b|), ``rmse``, ``max_abs``, ``bias``
        (mean of a - b), ``median_abs``, as ``qattn analyze`` computes them.
    """
    return _qattn.compare(a, b)


def load(path):
    """Read a tensor file: ``.npy`` (one tensor, named after the file's stem), ``.npz`` or ``.safetensors``.

    Returns
    -------
    dict of str to ndarray
        In the file's dtype; float16 and bfloat16 are widened exactly to float32.
    """
    return _qattn.load(path)


def save(path, arrays):
    """Write float32 / float64 arrays to ``.npy`` (exactly one), ``.npz`` or ``.safetensors``, atomically.

    Parameters
    ----------
    path : str
    arrays : dict of str to ndarray
    """
    _qattn.save(path, arrays)
