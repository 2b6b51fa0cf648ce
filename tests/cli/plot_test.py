#!/usr/bin/python3
"""analysis/plots/qattn_plot.py as a reviewer reads its figures: a heatmap's title names the preset, its colour is
log10 of the error unless --linear, the plateau outline runs along the cells' edges, and a one-axis sweep is one
line per configuration, with the metric on the y axis.

    plot_test.py QATTN_BINARY REPO_ROOT
"""
import os
import subprocess
import sys
import tempfile

qattn, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "analysis", "plots"))
import qattn_plot  # noqa: E402

failures = 0


def check(cond, what):
    global failures
    if not cond:
        print("FAIL:", what)
        failures += 1


os.environ["QATTN_CLI"] = qattn
# the preset named from the registry: intattention@upstream-neon's parameters with b and c swept
r = subprocess.run([qattn, "sweep", "--method", "intattention@upstream-neon", "--grid", "b=4,5", "--grid", "c=5,6"],
                   capture_output=True, text=True)
check(r.returncode == 0, f"sweep: {r.stderr}")
with tempfile.TemporaryDirectory() as tmp:
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
    # the default colour is log10 of the error; --linear the value
    for extra, want in (([], "log10(1 - mean)"), (["--linear"], "cossim: mean")):
        png = os.path.join(tmp, "h.png")
        env = dict(os.environ, MPLBACKEND="Agg")
        code = ("import sys, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; sys.argv = sys.argv[1:];"
                "import qattn_plot as q; labels = [];"
                "q.save = lambda fig, out: labels.append(fig.axes[1].get_ylabel());"
                "a = q.argparse.Namespace(csv=sys.argv[0], x=None, y=None, value='mean', threshold=None,"
                " plateau_tol=1e-3, linear='--linear' in sys.argv, log_error=False, out=sys.argv[1], title=None);"
                "q.heatmap(a, plt); print(labels[0])")
        p = subprocess.run([sys.executable, "-c", code, csv, png] + extra, capture_output=True, text=True, env=env,
                           cwd=os.path.join(root, "analysis", "plots"))
        check(p.returncode == 0 and want in p.stdout, f"colour bar with {extra}: {p.stdout!r} {p.stderr[-300:]!r}")
    # a one-axis sweep: one line, named by its preset
    r = subprocess.run([qattn, "sweep", "--method", "index@paper", "--grid", "b=3:6"], capture_output=True, text=True)
    open(csv, "w").write(r.stdout)
    rows = qattn_plot.read_csv(csv)
    labels = qattn_plot.series_labels(rows, [x["method"] for x in rows], "method", "b")
    check(len(set(labels)) == 1 and "index@paper" in labels[0], f"one line per configuration: {set(labels)}")
    r = subprocess.run([qattn, "plot", "lines", csv, "-o", os.path.join(tmp, "l.png"), "--x", "b"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and os.path.exists(os.path.join(tmp, "l.png")), f"qattn plot lines: {r.stderr}")

print(f"plot_test: {'FAILED' if failures else 'passed'} ({failures} failures)")
sys.exit(1 if failures else 0)
