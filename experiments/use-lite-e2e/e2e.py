"""use-lite-e2e: every attention method, and every KV quantizer at 2/3/4 bits, swapped into both attention layers of
Universal Sentence Encoder Lite; what it does to the sentence embeddings, and whether the attention-level ranking of
``qattn analyze`` predicts it.

    python3 experiments/use-lite-e2e/e2e.py [--out-dir DIR] [--fast] [--no-plots] [--model-dir DIR] [--tensors DUMP]

(``qattn reproduce use-lite-e2e`` runs this.) The model is the NumPy forward pass of ``qattn.models.use_lite`` on the
weights ``scripts/fetch-model.sh`` downloads; the sentences are the fixed set in ``use_lite_sentences.json`` beside this script
(240 sentences of licence texts Debian ships; experiments/use-lite-e2e/README.md says how they were made). The
report goes to stdout; DIR receives e2e.csv and e2e.png. Nothing is downloaded here. It is an experiment, not part
of the package: it imports the installed (or PYTHONPATH's) qattn, and is installed under share/qattn/experiments.
"""
import argparse
import json
import math
import os
import platform
import sys

# The forward pass's float32 matmuls go through NumPy's OpenBLAS, which picks its kernels by CPU when NumPy loads it:
# on an Intel Xeon with AVX-512 (family 6 model 207) its SkylakeX-class sgemm sums in another order than the Haswell
# kernels AMD Zen runs, and the report's Spearman for fp32 + kv flashq:bits=2 moved from 0.84981 to 0.85065.
# OPENBLAS_CORETYPE=Haswell (AVX2 and FMA, which every x86 CPU this project runs on has) gives every x86 CPU the
# same sums: on that Xeon the --fast report is then byte-identical to expected-fast.txt, made on Zen 5. A value the
# caller set is kept.
if platform.machine() in ("x86_64", "AMD64"):
    os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

import numpy as np  # noqa: E402  (after OPENBLAS_CORETYPE: OpenBLAS reads it when NumPy loads it)

from qattn import analyze, attention, canonical, methods, quantize_kv, quantizers  # noqa: E402
from qattn.models import use_lite  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = HERE  # use_lite_sentences.json and use_lite_windows.npz


def method_specs():
    """Every registered method, bare and under each preset, one row per distinct canonical spec."""
    rows, seen = [], {}
    for m in methods():
        if not m["in_default_lists"]:  # built from a file only (file:PATH)
            continue
        # an old spelling (alias_of) is its preset's row, not one of its own
        for spec in [m["name"]] + [m["name"] + "@" + p["name"] for p in m["presets"] if "alias_of" not in p]:
            c = canonical(spec)
            if c in seen:
                rows[seen[c]]["names"].append(spec)
                continue
            seen[c] = len(rows)
            rows.append({"names": [spec], "method": spec, "kv": None})
    return rows


def kv_specs():
    """Each KV quantizer at 2, 3 and 4 bits (those with a bits parameter; SAW is INT4 by construction), over fp32.
    Returns the rows and the widths a quantizer refuses, with its message."""
    rows, refused = [], []
    probe = np.random.default_rng(0).standard_normal((1, 64, 64))
    for q in quantizers()["kv"]:
        keys = [p["key"] for p in q["params"]]
        variants = [f"{q['name']}:bits={b}" for b in (2, 3, 4)] if "bits" in keys else \
            [q["name"]] + [q["name"] + "@" + p["name"] for p in q["presets"]]
        for v in variants:
            try:
                quantize_kv(probe, probe, v)
            except ValueError as e:
                refused.append(f"{v} ({e})")
                continue
            rows.append({"names": ["fp32 + kv " + v], "method": "fp32", "kv": v})
    return rows, refused


def spearman(a, b):
    def ranks(x):
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        xs = np.asarray(x)[order]
        i = 0
        while i < len(xs):  # average ranks of ties
            j = i
            while j + 1 < len(xs) and xs[j + 1] == xs[i]:
                j += 1
            r[order[i:j + 1]] = (i + j) / 2
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float(ra @ rb / math.sqrt((ra @ ra) * (rb @ rb)))


def neighbours(e, k):
    s = e @ e.T
    np.fill_diagonal(s, -np.inf)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def run(model_dir=None, tensors=None, fast=False, out_dir=None, plots=True, log=sys.stderr):
    model = use_lite.Model(model_dir)
    with open(os.path.join(DATA, "use_lite_sentences.json")) as f:
        sentences = json.load(f)["sentences"]
    if fast:
        sentences = sentences[::10]  # 24 sentences
    ids = [np.array(s["ids"]) for s in sentences]
    windows = np.load(os.path.join(DATA, "use_lite_windows.npz"))

    out = []
    # 1. the forward pass against the model's own embeddings of the sample's 8 windows
    check = []
    for i, w in enumerate(windows["token_ids"]):
        e = model.embed(w)
        r = windows["final_embedding"][i]
        check.append(float(e @ r / (np.linalg.norm(e) * np.linalg.norm(r))))
    verified = min(check) >= 0.99999
    out.append("# use-lite-e2e: attention methods inside Universal Sentence Encoder Lite\n")
    out.append(f"Forward pass (NumPy, fp32 attention) vs the model's own embeddings of the sample's 8 windows of "
               f"128 tokens: CosSim min {min(check):.8f} (required >= 0.99999): "
               f"{'VERIFIED' if verified else 'NOT VERIFIED'}\n")
    if not verified:
        raise SystemExit("use-lite-e2e: the forward pass does not reproduce the model; stopping")

    base = np.stack([model.embed(x) for x in ids])
    base_sim = base @ base.T
    iu = np.triu_indices(len(ids), 1)
    base_nn1, base_nn5 = neighbours(base, 1), neighbours(base, 5)

    kv_rows, kv_refused = kv_specs()
    rows = method_specs() + kv_rows
    dump = tensors or dump_path()
    for n, row in enumerate(rows):
        print(f"[{n + 1}/{len(rows)}] {row['names'][0]}", file=log, flush=True)

        def core(q, k, v, scale, layer, row=row):
            return attention(q, k, v, row["method"], scale=scale, kv=row["kv"]).astype(np.float32)

        e = np.stack([model.embed(x, core) for x in ids])
        cos = np.sum(e * base, axis=1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(base, axis=1))
        sim = e @ e.T
        nn1, nn5 = neighbours(e, 1), neighbours(e, 5)
        top5 = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(nn5, base_nn5)])
        rec = analyze(dump, [row["method"]], kv=row["kv"], as_frame=False)
        layer_o = [float(np.mean([r["O_cossim"] for r in rec if r["layer"] == l])) for l in (0, 1)]
        row.update(cos_mean=float(cos.mean()), cos_worst=float(cos.min()),
                   spearman=spearman(sim[iu], base_sim[iu]), top1=float(np.mean(nn1[:, 0] == base_nn1[:, 0])),
                   top5=float(top5), o_layer0=layer_o[0], o_layer1=layer_o[1],
                   o_mean=float(np.mean([r["O_cossim"] for r in rec])))

    out.append(f"{len(ids)} sentences ({'--fast: every 10th of ' if fast else ''}the fixed set of 240 sentences of "
               f"Apache-2.0, MPL-2.0, LGPL-3 and GPL-3, 8 to 126 tokens); both attention layers swapped; every "
               f"metric against the model with fp32 attention. Attention level: mean O CosSim of `qattn analyze` on "
               f"the embedded sample (layer 0, layer 1, all heads).\n")
    if kv_refused:
        out.append("KV widths a quantizer does not have: " + "; ".join(kv_refused) + ".\n")
    out.append("| method | emb CosSim mean | emb CosSim worst | Spearman sims | NN top-1 | NN top-5 | "
               "O CosSim L0 | O CosSim L1 | O CosSim all |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out.append(f"| {' = '.join(r['names'])} | {r['cos_mean']:.6f} | {r['cos_worst']:.6f} | "
                   f"{r['spearman']:.5f} | {r['top1']:.3f} | {r['top5']:.3f} | {r['o_layer0']:.5f} | "
                   f"{r['o_layer1']:.5f} | {r['o_mean']:.5f} |")

    # 2. does the attention-level ranking predict the end-to-end one?
    att = [r["o_mean"] for r in rows]
    e2e = [r["cos_mean"] for r in rows]
    rho = spearman(att, e2e)
    rho_sp = spearman(att, [r["spearman"] for r in rows])
    order_att = sorted(range(len(rows)), key=lambda i: -att[i])
    order_e2e = sorted(range(len(rows)), key=lambda i: -e2e[i])
    worst_att, worst_e2e = order_att[-5:], order_e2e[-5:]
    out.append("")
    out.append(f"Rank correlation (Spearman, {len(rows)} rows) of attention-level O CosSim with embedding CosSim: "
               f"{rho:.3f}; with the Spearman of pairwise similarities: {rho_sp:.3f}.")
    out.append(f"Five worst by O CosSim (worst last): {', '.join(rows[i]['names'][0] for i in worst_att)}.")
    out.append(f"Five worst by embedding CosSim (worst last): {', '.join(rows[i]['names'][0] for i in worst_e2e)}.")
    if rho >= 0.9:
        verdict = "YES: the attention-level leaderboard predicts the end-to-end ranking (rank correlation >= 0.9)"
    elif rho >= 0.7:
        verdict = "LARGELY: the leaderboard predicts the end-to-end ranking in broad strokes (0.7 <= rank " \
                  "correlation < 0.9); rows close in O CosSim swap places end to end"
    else:
        verdict = "NO: the attention-level leaderboard does not predict the end-to-end ranking (rank correlation < 0.7)"
    out.append(f"Verdict: {verdict}.")

    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "e2e.csv"), "w") as f:
            keys = ["cos_mean", "cos_worst", "spearman", "top1", "top5", "o_layer0", "o_layer1", "o_mean"]
            f.write("method,kv," + ",".join(keys) + "\n")
            for r in rows:
                f.write(f"{r['names'][0]},{r['kv'] or ''}," + ",".join(repr(r[k]) for k in keys) + "\n")
        if plots:
            plot(rows, os.path.join(out_dir, "e2e.png"), len(ids))
    return "\n".join(out) + "\n", rows


def dump_path():
    """The embedded USE-Lite sample: experiments/data/use-lite beside this folder in the source tree, or
    share/qattn/data/use-lite where both are installed."""
    for p in (os.path.join(HERE, "..", "data", "use-lite"), os.path.join(HERE, "..", "..", "data", "use-lite"),
              "/usr/local/share/qattn/data/use-lite", "/usr/share/qattn/data/use-lite"):
        if os.path.isdir(p):
            return p
    raise SystemExit("use-lite-e2e: the embedded sample was not found; give --tensors DIR")


def plot(rows, path, n):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for r in rows:
        x, y = max(1 - r["o_mean"], 1e-9), max(1 - r["cos_mean"], 1e-9)
        ax.scatter(x, y, s=14, color="tab:red" if r["kv"] else "tab:blue")
        ax.annotate(r["names"][0], (x, y), fontsize=5, xytext=(2, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("1 - O CosSim (qattn analyze, embedded sample, all heads)")
    ax.set_ylabel(f"1 - sentence-embedding CosSim (mean of {n} sentences)")
    ax.set_title("USE-Lite end to end: attention error vs embedding error (blue: methods, red: KV over fp32)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)


def main(argv=None):
    p = argparse.ArgumentParser(prog="e2e.py", description=__doc__.split("\n")[0])
    p.add_argument("--out-dir")
    p.add_argument("--fast", action="store_true", help="every 10th sentence (24)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--model-dir", help="the fetched npm package's dist/ (default: $QATTN_MODEL_DIR or the cache)")
    p.add_argument("--tensors", help="dump for the attention-level column (default: the embedded sample)")
    a = p.parse_args(argv)
    try:
        report, _ = run(a.model_dir, a.tensors, a.fast, a.out_dir, not a.no_plots)
    except FileNotFoundError as e:
        print(f"use-lite-e2e: {e}", file=sys.stderr)
        return 3
    sys.stdout.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
