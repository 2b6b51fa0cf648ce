#!/usr/bin/python3
"""`qattn plot` as a reviewer reads its figures. The script (cli/plots/qattn_plot.py, a link to the package's
python/qattn/plot.py) writes, under QATTN_PLOT_ARTISTS, every drawn text's box and each axes' names and scales; the
checks read that: no two texts intersect (the leaderboard's Pareto figure with its dozen-plus points, a sweep's lines,
a heatmap), the axes are named in words, error metrics lie on a log axis of 1 - CosSim (--logy never logs CosSim;
--linear is the escape), the heatmap's caption names the dashed threshold only where its contour is drawn. Also: a
heatmap's title names the preset, the plateau outline runs along the cells' edges, a one-axis sweep is one line per
configuration, and bad input exits 3 writing nothing.

    plot_test.py QATTN_BINARY REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

qattn, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "cli", "plots"))
sys.path.insert(0, os.path.join(root, "tests", "cli"))
import qattn_plot  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks("plot_test")


def overlapping(texts):
    return [(a["text"], b["text"]) for i, a in enumerate(texts) for b in texts[i + 1:]
            if a["box"][0] < b["box"][2] and b["box"][0] < a["box"][2] and a["box"][1] < b["box"][3]
            and b["box"][1] < a["box"][3]]


def plot(tmp, *args):
    """`qattn plot ARGS -o FIG`: (exit status, stderr, artists or None)."""
    artists = os.path.join(tmp, "artists.json")
    if os.path.exists(artists):
        os.unlink(artists)
    r = subprocess.run([qattn, "plot", *args], capture_output=True, text=True,
                       env=dict(os.environ, QATTN_PLOT_ARTISTS=artists))
    drawn = json.load(open(artists)) if os.path.exists(artists) else None
    return r.returncode, r.stderr, drawn


def figure_checks(name, drawn, xlabel_has, ylabel_has, yscale):
    if drawn is None:
        check(False, f"{name}: no artists written under QATTN_PLOT_ARTISTS")
        return
    ax = drawn["axes"][0]
    check(overlapping(drawn["texts"]) == [], f"{name}: texts intersect: {overlapping(drawn['texts'])[:6]}")
    check(xlabel_has in ax["xlabel"], f"{name}: x axis {ax['xlabel']!r} lacks {xlabel_has!r}")
    check(ylabel_has in ax["ylabel"], f"{name}: y axis {ax['ylabel']!r} lacks {ylabel_has!r}")
    check(ax["yscale"] == yscale, f"{name}: y scale {ax['yscale']}, expected {yscale}")


os.environ["QATTN_CLI"] = qattn
with tempfile.TemporaryDirectory() as tmp:
    png = os.path.join(tmp, "f.png")
    # README command 1's own figure: the leaderboard's Pareto plot, as pareto_outputs draws it
    board = os.path.join(root, "experiments", "leaderboard", "leaderboard-pareto.csv")
    rc, err, drawn = plot(tmp, "pareto", board, "-o", png, "--x", "kv_bits", "--y", "O_error", "--label", "method",
                          "--logy", "--title", "Attention pipelines")
    check(rc == 0, f"pareto: {err}")
    figure_checks("leaderboard pareto", drawn, "K/V bits per element", "1 − O CosSim", "log")
    texts = " | ".join(t["text"] for t in drawn["texts"]) if drawn else ""
    check(all(r["method"] in texts for r in qattn_plot.read_csv(board)), f"every method is named: {texts}")
    # on a linear axis the board's many small errors crowd at zero (refused, "draw fewer rows"): its first 12 rows
    few = os.path.join(tmp, "few.csv")
    with open(board) as f, open(few, "w") as g:
        g.writelines(f.readlines()[:13])
    rc, err, drawn = plot(tmp, "pareto", few, "-o", png, "--x", "kv_bits", "--y", "O_error", "--linear",
                          "--xlabel", "bits")
    check(rc == 0 and drawn and drawn["axes"][0]["yscale"] == "linear" and drawn["axes"][0]["xlabel"] == "bits",
          f"pareto --linear --xlabel: {err} {drawn and drawn['axes']}")
    kv = os.path.join(root, "experiments", "kv-quantizers", "kv-quantizers-pareto.csv")
    rc, err, drawn = plot(tmp, "pareto", kv, "-o", png, "--x", "bits", "--y", "O_error", "--label", "quantizer")
    figure_checks("kv-quantizers pareto", drawn, "scales and zero points included", "1 − O CosSim", "log")

    # the preset named from the registry: intattention@upstream-neon's parameters with b and c swept
    r = subprocess.run([qattn, "sweep", "--method", "intattention@upstream-neon", "--grid", "b=4,5", "--grid", "c=5,6"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"sweep: {r.stderr}")
    csv = os.path.join(tmp, "s.csv")
    open(csv, "w").write(r.stdout)
    rows = qattn_plot.read_csv(csv)
    name = qattn_plot.configuration(rows, {"b", "c"})
    check("intattention@upstream-neon" in name, f"the heatmap names the preset: {name!r}")
    os.environ.pop("QATTN_CLI")
    check(qattn_plot.configuration(rows, {"b", "c"}).startswith("intattention ("), "without the program: the parameters")
    os.environ["QATTN_CLI"] = qattn
    # the outline of cells (1, 1), (1, 2), (2, 1) on a 3 x 3 grid of unit cells: 8 edges, all on cell boundaries
    grid = [[0, 0, 0], [0, 1, 1], [0, 1, 0]]
    edges = qattn_plot.cell_edges([0, 1, 2])
    check(edges == [-0.5, 0.5, 1.5, 2.5], f"cell edges: {edges}")
    check(qattn_plot.cell_edges([2, 4, 6, 6.6, 8])[3:5] == [6.3, 7.3], "cells of an uneven grid end halfway")
    segs = qattn_plot.plateau_edges(grid, lambda v: v >= 1, edges, edges)
    check(len(segs) == 8, f"outline edges: {len(segs)}")
    check(all((x % 1 == 0.5 or y % 1 == 0.5) for sx, sy in segs for x, y in zip(sx, sy)),
          f"every outline point lies on a cell edge: {segs}")
    # the colour is log10 of the error unless --linear; the dashed threshold is named only where it is drawn
    means = sorted(float(x["mean"]) for x in rows)
    for extra, want_bar, dashed in (([], "log10(1 - mean)", False), (["--linear"], "cossim: mean", False),
                                    (["--threshold", "0.99999999"], "log10(1 - mean)", False),
                                    (["--threshold", f"{(means[1] + means[2]) / 2:.9f}"], "log10(1 - mean)", True)):
        rc, err, drawn = plot(tmp, "heatmap", csv, "-o", png, *extra)
        check(rc == 0 and drawn is not None, f"heatmap {extra}: {err}")
        if drawn:
            bar, ax = drawn["axes"][1], drawn["axes"][0]
            check(want_bar in bar["ylabel"], f"colour bar with {extra}: {bar['ylabel']!r}")
            check(("dashed" in ax["title"]) == dashed, f"heatmap {extra}: the caption {ax['title']!r}")
            check(ax["xlabel"].startswith("c: ") and ax["ylabel"].startswith("b: "),
                  f"heatmap axes in words: {ax['xlabel']!r}, {ax['ylabel']!r}")
            check(overlapping(drawn["texts"]) == [], f"heatmap {extra}: texts intersect")

    # a one-axis sweep: one line, named by its preset; CosSim drawn as 1 - CosSim on a log axis
    r = subprocess.run([qattn, "sweep", "--method", "index@paper", "--grid", "b=3:8"], capture_output=True, text=True)
    open(csv, "w").write(r.stdout)
    rows = qattn_plot.read_csv(csv)
    labels = qattn_plot.series_labels(rows, [x["method"] for x in rows], "method", "b")
    check(len(set(labels)) == 1 and "index@paper" in labels[0], f"one line per configuration: {set(labels)}")
    for extra, yscale in (([], "log"), (["--logy"], "log"), (["--linear"], "linear")):
        rc, err, drawn = plot(tmp, "lines", csv, "-o", png, "--x", "b", *extra)
        check(rc == 0 and os.path.exists(png), f"qattn plot lines {extra}: {err}")
        figure_checks(f"lines {extra}", drawn, "b: ", "CosSim", yscale)
        if drawn and yscale == "log":
            ylabel = drawn["axes"][0]["ylabel"]
            check(ylabel.startswith("1 − O CosSim"), f"lines {extra}: {ylabel!r}")

    # bad input: exit 3, the file and column named, nothing written
    out = os.path.join(tmp, "never.png")
    rc, err, _ = plot(tmp, "lines", csv, "-o", out, "--x", "L")
    check(rc == 3 and "no column 'L'" in err and csv in err and not os.path.exists(out), f"missing column: {rc} {err}")
    rc, err, _ = plot(tmp, "pareto", os.path.join(tmp, "none.csv"), "-o", out)
    check(rc == 3 and "none.csv: cannot read" in err and not os.path.exists(out), f"missing file: {rc} {err}")
    # more coincident points than any placement can number apart: refused, never drawn overlapping
    crowd = os.path.join(tmp, "crowd.csv")
    open(crowd, "w").write("method,bits,error\n" + "".join(f"m{i},8,1e-3\n" for i in range(150)))
    rc, err, _ = plot(tmp, "pareto", crowd, "-o", out)
    check(rc == 3 and "crowd.csv: 150 points too crowded" in err and not os.path.exists(out), f"crowded: {rc} {err}")

check.exit()
