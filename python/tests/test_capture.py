"""qattn.torch.capture (qattn/dump_torch.py) on a small causal decoder built here: 2 layers, 4 query heads over 2 K/V
heads, head_dim 16, rotary position embeddings, random weights. Its attention calls
torch.nn.functional.scaled_dot_product_attention, looked up at call time; Debian's PyTorch 1.13 has none, so the tests
install a stand-in under that name with the math of PyTorch 2's (its documented reference implementation, GQA
included). The captured files must be the tensors the attention computed with: its output recomputed from them in
NumPy equals the module's."""
import json
import math
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # python3-torch is in the test dependencies
import torch.nn.functional as F  # noqa: E402

from qattn.torch import AttentionDumper, capture  # noqa: E402

D_MODEL, HQ, HKV, HD, LAYERS = 64, 4, 2, 16, 2
B, L = 2, 12
# |O recomputed in float64 from the dumped float32 q, k, v - the model's float32 O| (and likewise after o_proj);
# measured 1.4e-7 on |O| <= 1.8
OUTPUT_TOLERANCE = 1e-6


def sdpa_standin(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention of PyTorch 2.5, as its documentation writes it out."""
    lq, lk = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    attn_bias = torch.zeros(lq, lk, dtype=query.dtype)
    if is_causal:
        assert attn_mask is None
        attn_bias.masked_fill_(torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=0).logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_bias = attn_bias.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            attn_bias = attn_mask + attn_bias
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    attn_weight = query @ key.transpose(-2, -1) * scale_factor
    attn_weight = torch.softmax(attn_weight + attn_bias, dim=-1)
    attn_weight = torch.dropout(attn_weight, dropout_p, train=True)
    return attn_weight @ value


def my_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """A model's own attention function, called through this module's globals (fn= names it)."""
    return sdpa_standin(query, key, value, attn_mask, dropout_p, is_causal, scale)


def rope_tables(length, d):
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(length).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, cos, sin):  # Hugging Face's apply_rotary_pos_emb on [B, H, L, d]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(torch.nn.Module):
    """kv: "gqa" hands K/V with their 2 heads to the attention function (enable_gqa=True); "repeat" repeats them per
    query head first, as Hugging Face's repeat_kv. mask: "is_causal", "bool" ([L, L], True = visible), "float"
    ([B, 1, L, L], 0 and the dtype's lowest value, as Hugging Face builds it), "padding" (sentence 1's last key
    hidden: not representable), "bias" (an ALiBi-like additive float), "dropout"."""

    def __init__(self, kv, mask, function="sdpa"):
        super().__init__()
        self.kv, self.mask, self.function = kv, mask, function
        self.q_proj = torch.nn.Linear(D_MODEL, HQ * HD, bias=True)
        self.k_proj = torch.nn.Linear(D_MODEL, HKV * HD, bias=False)
        self.v_proj = torch.nn.Linear(D_MODEL, HKV * HD, bias=False)
        self.o_proj = torch.nn.Linear(HQ * HD, D_MODEL, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, HQ, HD).transpose(1, 2)
        k = self.k_proj(x).view(b, n, HKV, HD).transpose(1, 2)
        v = self.v_proj(x).view(b, n, HKV, HD).transpose(1, 2)
        q, k = apply_rotary(q, k, *rope_tables(n, HD))
        kwargs = {}
        if self.kv == "repeat":
            k, v = (t[:, :, None].expand(b, HKV, HQ // HKV, n, HD).reshape(b, HQ, n, HD) for t in (k, v))
        else:
            kwargs["enable_gqa"] = True
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        if self.mask == "is_causal":
            kwargs["is_causal"] = True
        elif self.mask == "bool":
            kwargs["attn_mask"] = causal
        elif self.mask == "float":
            m = torch.zeros(b, 1, n, n).masked_fill(~causal, torch.finfo(torch.float32).min)
            kwargs["attn_mask"] = m
        elif self.mask == "padding":
            visible = causal.expand(b, 1, n, n).clone()
            visible[1, :, :, -1] = False
            kwargs["attn_mask"] = visible
        elif self.mask == "bias":
            kwargs["attn_mask"] = -0.1 * (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().float()
        elif self.mask == "dropout":
            kwargs["dropout_p"] = 0.1
        if self.function == "sdpa":  # looked up at call time, as Hugging Face's sdpa attention does
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        else:
            kwargs.pop("enable_gqa", None)
            o = my_attention(q, k, v, **kwargs)
        return self.o_proj(o.transpose(1, 2).reshape(b, n, HQ * HD))


class Decoder(torch.nn.Module):
    def __init__(self, kv="gqa", mask="is_causal", function="sdpa", seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList()
        for _ in range(LAYERS):
            block = torch.nn.Module()
            block.norm1, block.norm2 = torch.nn.LayerNorm(D_MODEL), torch.nn.LayerNorm(D_MODEL)
            block.self_attn = Attention(kv, mask, function)
            block.mlp = torch.nn.Sequential(torch.nn.Linear(D_MODEL, 2 * D_MODEL), torch.nn.GELU(),
                                            torch.nn.Linear(2 * D_MODEL, D_MODEL))
            self.layers.append(block)
        self.eval()

    def forward(self, x):
        for block in self.layers:
            x = x + block.self_attn(block.norm1(x))
            x = x + block.mlp(block.norm2(x))
        return x


@pytest.fixture
def sdpa(monkeypatch):
    """The stand-in installed as torch.nn.functional.scaled_dot_product_attention (raising=False: 1.13 has none)."""
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa_standin, raising=False)
    return sdpa_standin


def inputs(seed=1, batch=B, length=L):
    return torch.randn(batch, length, D_MODEL, generator=torch.Generator().manual_seed(seed))


def watch(model):
    """Each attention module's input and output, and its core output (o_proj's input), per forward call."""
    seen = {"in": {}, "out": {}, "core": {}}

    def keep(kind, layer, t):
        seen[kind].setdefault(layer, []).append(t)

    handles = []
    for i, block in enumerate(model.layers):
        attn = block.self_attn
        handles.append(attn.register_forward_pre_hook(lambda m, a, i=i: keep("in", i, a[0])))
        handles.append(attn.register_forward_hook(lambda m, a, y, i=i: keep("out", i, y)))
        handles.append(attn.o_proj.register_forward_pre_hook(lambda m, a, i=i: keep("core", i, a[0])))
    return seen, handles


def written_layers(dumper):
    return json.load(open(os.path.join(dumper.out_dir, "manifest.json")))["layers"]


def load(out, layer, head, kind):
    return np.load(os.path.join(out, f"layer{layer}_head{head}_{kind}.npy"))


def attention_from_dump(out, layer):
    """O [B, H_q, L_q, d] in float64 from the dumped files, with the manifest's scale, causal flag and GQA mapping."""
    entry = json.load(open(os.path.join(out, "manifest.json")))["layers"][str(layer)]
    hq, hkv, scale = entry["num_heads"], entry["num_kv_heads"], entry["scale"]
    heads = []
    for h in range(hq):
        g = h // (hq // hkv)
        q, k, v = (load(out, layer, hh, kind).astype(np.float64) for hh, kind in ((h, "q"), (g, "k"), (g, "v")))
        s = scale * q @ k.transpose(0, 2, 1)
        if entry["causal"]:
            lq, lk = s.shape[-2:]
            s = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq, s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        heads.append((p / p.sum(axis=-1, keepdims=True)) @ v)
    return np.stack(heads, axis=1)


def projections(model, layer, x, rope):
    """The layer's q, k, v [B, H, L, d] from its input, pre- or post-RoPE, K/V with their own 2 heads."""
    attn = model.layers[layer].self_attn
    b, n, _ = x.shape
    with torch.no_grad():
        q = attn.q_proj(x).view(b, n, HQ, HD).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, HKV, HD).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, HKV, HD).transpose(1, 2)
        if rope:
            q, k = apply_rotary(q, k, *rope_tables(n, HD))
    return q.numpy(), k.numpy(), v.numpy()


CASES = [("gqa", "is_causal"), ("gqa", "bool"), ("repeat", "float")]


@pytest.mark.parametrize("kv,mask", CASES)
def test_the_captured_tensors_are_the_ones_the_attention_computed_with(sdpa, tmp_path, kv, mask):
    model, x = Decoder(kv, mask), inputs()
    seen, handles = watch(model)
    dumper = AttentionDumper(tmp_path / "dump")
    with torch.no_grad(), capture(dumper) as c:
        y = model(x)
    for h in handles:
        h.remove()
    assert c.calls == LAYERS and c.function == "torch.nn.functional.scaled_dot_product_attention"
    assert F.scaled_dot_product_attention is sdpa  # restored
    with torch.no_grad():
        assert torch.equal(y, model(x))  # capture never changes what the model computes
    dumper.write()
    out = str(tmp_path / "dump")
    hkv = HKV if kv == "gqa" else HQ  # what the attention function received
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    for layer in range(LAYERS):
        assert manifest["layers"][str(layer)] == {
            "source": "capture", "function": "torch.nn.functional.scaled_dot_product_attention", "num_heads": HQ,
            "num_kv_heads": hkv, "scale": 1 / math.sqrt(HD), "causal": True}
        for h in range(HQ):  # K/V as given: heads [H_kv, H_q) have a q file only
            for kind in "kv":
                assert os.path.exists(os.path.join(out, f"layer{layer}_head{h}_{kind}.npy")) == (h < hkv)
            assert load(out, layer, h, "q").shape == (B, L, HD) and load(out, layer, h, "q").dtype == np.float32
        # (a) the attention output recomputed from the files equals the module's: its core and, through o_proj, its
        # output
        o = attention_from_dump(out, layer)
        core = seen["core"][layer][0].numpy().reshape(B, L, HQ, HD).transpose(0, 2, 1, 3)
        assert np.abs(o - core).max() < OUTPUT_TOLERANCE, np.abs(o - core).max()
        w = model.layers[layer].self_attn.o_proj.weight.detach().numpy().astype(np.float64)
        module_out = o.transpose(0, 2, 1, 3).reshape(B, L, HQ * HD) @ w.T
        assert np.abs(module_out - seen["out"][layer][0].numpy()).max() < OUTPUT_TOLERANCE
        # (b) post-RoPE: the dumped q and k are the rotated projections of the layer's input, not the projections
        q, k, v = projections(model, layer, seen["in"][layer][0], rope=True)
        q0, k0, _ = projections(model, layer, seen["in"][layer][0], rope=False)
        for h in range(HQ):
            g = h // (HQ // HKV)
            assert np.array_equal(load(out, layer, h, "q"), q[:, h])
            assert np.abs(load(out, layer, h, "q") - q0[:, h]).max() > 0.1
            hk = h if h < hkv else None
            if hk is not None:  # "repeat": K/V head h is the model's head h // 2, repeated
                assert np.array_equal(load(out, layer, hk, "k"), k[:, g if kv == "repeat" else h])
                assert np.array_equal(load(out, layer, hk, "v"), v[:, g if kv == "repeat" else h])
                assert np.abs(load(out, layer, hk, "k") - k0[:, g if kv == "repeat" else h]).max() > 0.1


def test_hook_projections_with_rope_gives_the_captured_q_and_k_and_without_it_the_pre_rope_ones(sdpa, tmp_path):
    model, x = Decoder("gqa", "is_causal"), inputs()
    seen, handles = watch(model)
    cap, rotated, plain = (AttentionDumper(tmp_path / name) for name in ("cap", "rotated", "plain"))
    cos, sin = rope_tables(L, HD)
    for i, block in enumerate(model.layers):
        a = block.self_attn
        rotated.hook_projections(i, a.q_proj, a.k_proj, a.v_proj, num_heads=HQ, num_kv_heads=HKV, causal=True,
                                 rope=lambda q, k: apply_rotary(q, k, cos, sin))
        plain.hook_projections(i, a.q_proj, a.k_proj, a.v_proj, num_heads=HQ, num_kv_heads=HKV, causal=True)
    with torch.no_grad(), capture(cap):
        model(x)
    for h in handles:
        h.remove()
    for d in (cap, rotated, plain):
        d.write()
    cap, rotated, plain = (str(tmp_path / name) for name in ("cap", "rotated", "plain"))
    for layer in range(LAYERS):
        q0, k0, v0 = projections(model, layer, seen["in"][layer][0], rope=False)
        for h in range(HQ):
            g = h // (HQ // HKV)  # the projection dumps keep repeating K/V per query head
            assert np.array_equal(load(rotated, layer, h, "q"), load(cap, layer, h, "q"))
            assert np.array_equal(load(rotated, layer, h, "k"), load(cap, layer, g, "k"))
            assert np.array_equal(load(rotated, layer, h, "v"), load(cap, layer, g, "v"))
            assert np.array_equal(load(plain, layer, h, "q"), q0[:, h])
            assert np.array_equal(load(plain, layer, h, "k"), k0[:, g])
            assert np.abs(load(plain, layer, h, "q") - load(cap, layer, h, "q")).max() > 0.1
    m_rot, m_plain = (json.load(open(os.path.join(d, "manifest.json"))) for d in (rotated, plain))
    assert m_rot["layers"]["0"] == {"source": "projections", "num_heads": HQ, "rope": True, "causal": True}
    assert m_plain["layers"]["0"] == {"source": "projections", "num_heads": HQ, "rope": False, "causal": True}
    # --weights recomputes pre-RoPE Q and K from the projections: only the plain dump has its files
    assert not any("attn_input" in f["name"] or "_w" in f["name"] for f in m_rot["files"])
    assert os.path.exists(os.path.join(plain, "layer0_attn_input.npy"))
    assert os.path.exists(os.path.join(plain, "layer1_wk.npy"))


def test_layers_numbers_several_forward_passes_and_later_blocks_append(sdpa, tmp_path):
    model, x1, x2 = Decoder(), inputs(1), inputs(2, batch=1)
    one, two, separate = (AttentionDumper(tmp_path / n) for n in ("one", "two", "separate"))
    with torch.no_grad():
        with capture(one, layers=LAYERS) as c:  # two forward passes in one block
            model(x1)
            model(x2)
        assert c.calls == 2 * LAYERS
        with capture(two):  # one pass per block: the second block appends
            model(x1)
        with capture(two):
            model(x2)
        with capture(separate):  # without layers=, call i is layer i
            model(x1)
            model(x2)
    for d in (one, two, separate):
        d.write()
    for layer in range(LAYERS):
        for h in range(HQ):
            a = load(tmp_path / "one", layer, h, "q")
            assert a.shape == (B + 1, L, HD)
            assert np.array_equal(a, load(tmp_path / "two", layer, h, "q"))
            assert np.array_equal(a[:B], load(tmp_path / "separate", layer, h, "q"))
            assert np.array_equal(a[B:], load(tmp_path / "separate", layer + LAYERS, h, "q"))
    assert sorted(json.load(open(tmp_path / "separate" / "manifest.json"))["layers"]) == ["0", "1", "2", "3"]
    with pytest.raises(ValueError, match=r"layer 0 .*L_q.*differ from the layer's earlier calls.*batch axis"):
        with torch.no_grad(), capture(two):  # another L cannot join the batch axis
            model(inputs(3, length=L - 2))


def test_the_attribute_is_restored_and_what_a_dump_cannot_hold_is_refused(sdpa, tmp_path):
    x = inputs()
    d = AttentionDumper(tmp_path / "dump")
    with pytest.raises(RuntimeError, match="inside"):
        with capture(d):
            raise RuntimeError("inside")
    assert F.scaled_dot_product_attention is sdpa
    for mask, message in (("dropout", r"dropout_p=0\.1.*model\.eval\(\)"),
                          ("padding", r"attn_mask is neither the causal mask .*nor all-visible.*one causal flag "
                                      r"per layer"),
                          ("bias", r"attn_mask adds values other than 0 and -inf")):
        with pytest.raises(ValueError, match=r"capture: layer 0 \(torch\.nn\.functional\.scaled_dot_product_attention"
                                             r"\): " + message):
            with torch.no_grad(), capture(d):
                Decoder("gqa", mask)(x)
        assert F.scaled_dot_product_attention is sdpa
    q, k = torch.randn(1, HQ, L, HD), torch.randn(1, HKV, L, HD)
    with torch.no_grad(), capture(d):
        with pytest.raises(ValueError, match=r"L_q=3 != L_k=12.*top left"):
            F.scaled_dot_product_attention(q[:, :, -3:], k, k, is_causal=True, enable_gqa=True)
        with pytest.raises(ValueError, match=r"3 heads, which does not divide the query's 4 heads"):
            F.scaled_dot_product_attention(q, q[:, :3], q[:, :3], enable_gqa=True)
        with pytest.raises(TypeError, match=r"keyword 'need_weights'"):
            F.scaled_dot_product_attention(q, q, q, need_weights=False)
        y = F.scaled_dot_product_attention(q[:, :, -3:], k, k, enable_gqa=True)  # no mask: L_q != L_k is fine
    assert torch.equal(y, sdpa(q[:, :, -3:], k, k, enable_gqa=True))
    assert F.scaled_dot_product_attention is sdpa
    d.write()  # only the one call that was not refused
    assert written_layers(d) == {"0": {
        "source": "capture", "function": "torch.nn.functional.scaled_dot_product_attention", "num_heads": HQ,
        "num_kv_heads": HKV, "scale": 0.25, "causal": False}}
    assert load(d.out_dir, 0, 0, "q").shape == (1, 3, HD)
    # a mask that hides nothing is no mask; the causal mask of L_q < L_k is aligned at the bottom right
    e = AttentionDumper(tmp_path / "e")
    with torch.no_grad(), capture(e, layers=1):
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(L, L, dtype=torch.bool))
    e.write()
    assert written_layers(e)["0"]["causal"] is False
    f = AttentionDumper(tmp_path / "f")
    with torch.no_grad(), capture(f):
        with pytest.raises(ValueError, match="neither the causal mask"):  # top-left causal, L_q != L_k
            F.scaled_dot_product_attention(q[:, :, :3], q, q, attn_mask=torch.ones(3, L, dtype=torch.bool).tril())
        F.scaled_dot_product_attention(q[:, :, :3], q, q, attn_mask=torch.ones(3, L, dtype=torch.bool).tril(L - 3))
    f.write()
    assert written_layers(f)["0"]["causal"] is True


def test_the_function_to_wrap_is_named_or_refused_clearly(sdpa, monkeypatch):
    d = AttentionDumper("unused")
    for fn, error, message in (("no_such_module_qattn:f", ValueError, "cannot import the module 'no_such_module_q"),
                               ("math:no_such_function", ValueError, "has no attribute 'no_such_function'"),
                               ("math.pi", TypeError, "math.pi is a float, not a function"),
                               ("math", ValueError, "expected 'package.module:attr' or 'package.module.attr'"),
                               (42, TypeError, "fn must be None"),
                               ((Attention, "forward"), TypeError, "is a method")):
        with pytest.raises(error, match=message):
            with capture(d, fn=fn):
                pass
    with pytest.raises(ValueError, match="layers must be an integer >= 1"):
        with capture(d, layers=0):
            pass
    with pytest.raises(TypeError, match="dumper must be an AttentionDumper"):
        with capture("dump/"):
            pass
    monkeypatch.delattr(F, "scaled_dot_product_attention")  # PyTorch before 2.0
    with pytest.raises(ValueError, match=r"no torch\.nn\.functional\.scaled_dot_product_attention \(it came with "
                                         r"PyTorch 2\.0\); pass fn="):
        with capture(d):
            pass


@pytest.mark.parametrize("fn", [f"{__name__}:my_attention", f"{__name__}.my_attention",
                                (sys.modules[__name__], "my_attention")])
def test_fn_names_the_models_own_attention_function(sdpa, tmp_path, fn):
    x = inputs()
    ours, standard = AttentionDumper(tmp_path / "ours"), AttentionDumper(tmp_path / "standard")
    model = Decoder("repeat", "is_causal", function="mine")
    with torch.no_grad():
        with capture(ours, fn=fn) as c:
            assert my_attention is not TestOriginals.my_attention  # replaced for the block
            y = model(x)
        assert my_attention is TestOriginals.my_attention and c.calls == LAYERS
        assert torch.equal(y, model(x))
        with capture(standard):
            Decoder("repeat", "is_causal")(x)  # the same weights (seed), through the SDPA name
    ours.write()
    standard.write()
    for layer in range(LAYERS):
        assert json.load(open(tmp_path / "ours" / "manifest.json"))["layers"][str(layer)]["function"] == \
            f"{__name__}.my_attention"
        for h in range(HQ):
            for kind in "qkv":
                assert np.array_equal(load(tmp_path / "ours", layer, h, kind),
                                      load(tmp_path / "standard", layer, h, kind))


class TestOriginals:
    my_attention = my_attention  # the function as defined, to tell it from the wrapper


def test_a_block_without_a_call_warns_and_nothing_is_written(sdpa, tmp_path):
    d = AttentionDumper(tmp_path / "dump")
    with pytest.warns(UserWarning, match=r"no call of torch\.nn\.functional\.scaled_dot_product_attention.*fn=") as w:
        with capture(d):
            Decoder("repeat", "is_causal", function="mine")(inputs())  # calls my_attention, not SDPA
    assert len(w) == 1 and w[0].filename == __file__
    with pytest.raises(RuntimeError, match="nothing captured"):
        d.write()
    assert not os.path.exists(tmp_path / "dump")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad(), capture(d):
            Decoder()(inputs())


def test_capture_after_projection_hooks_on_one_layer_is_refused(sdpa, tmp_path):
    model = Decoder()
    d = AttentionDumper(tmp_path / "dump")
    a = model.layers[0].self_attn
    d.hook_projections(0, a.q_proj, a.k_proj, a.v_proj, num_heads=HQ, num_kv_heads=HKV)
    with pytest.raises(ValueError, match="layer 0: already holds tensors from projections; capture would mix them"):
        with torch.no_grad(), capture(d):
            model(inputs())


def test_the_dumper_is_one_file_that_stands_alone(tmp_path):
    source = os.environ.get("QATTN_SOURCE")
    import qattn.dump_torch

    if source:  # cli/dump_torch.py is the package's file, not a copy
        link = os.path.join(source, "cli", "dump_torch.py")
        assert os.path.islink(link) and os.readlink(link) == "../python/qattn/dump_torch.py"
    shutil.copy(qattn.dump_torch.__file__, tmp_path / "dump_torch.py")
    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import dump_torch; "
                        "dump_torch.capture, dump_torch.AttentionDumper; assert 'qattn' not in sys.modules",
                        str(tmp_path)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 0, r.stderr


def analyze(out):
    cli = os.environ.get("QATTN_CLI", "qattn")
    r = subprocess.run([cli, "analyze", "--tensors", str(out), "--method", "fp32", "--method", "intattention",
                        "--format", "csv"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_qattn_analyze_reads_a_capture(sdpa, tmp_path):
    """The Hugging Face way (K/V repeated before the call): one row per query head plus mean and worst, and fp32's
    O error is that of float32 rounding."""
    d = AttentionDumper(tmp_path / "dump")
    with torch.no_grad(), capture(d):
        Decoder("repeat", "float")(inputs())
    d.write()
    lines = analyze(tmp_path / "dump").splitlines()
    header, rows = lines[0].split(","), [r.split(",") for r in lines[1:] if r]
    heads = [r for r in rows if r[1].isdigit()]
    assert sorted({(int(r[0]), int(r[1])) for r in heads}) == [(i, h) for i in range(LAYERS) for h in range(HQ)]
    error = header.index("O 1-CosSim")
    assert all(float(r[error]) < 1e-9 for r in heads if r[2] == "fp32")
    assert all(float(r[error]) > 1e-6 for r in heads if r[2] == "intattention")


def test_qattn_analyze_reads_a_grouped_query_capture_as_its_repeated_twin(sdpa, tmp_path):
    """K/V as given (2 heads for 4 query heads) analyse as the same K/V repeated per query head, byte for byte."""
    for kv in ("gqa", "repeat"):
        d = AttentionDumper(tmp_path / kv)
        with torch.no_grad(), capture(d):
            Decoder(kv, "is_causal")(inputs())
        d.write()
    assert not os.path.exists(tmp_path / "gqa" / "layer0_head2_k.npy")
    assert analyze(tmp_path / "gqa") == analyze(tmp_path / "repeat")
