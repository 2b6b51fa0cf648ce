#!/usr/bin/python3
"""Figures from qattn's CSV output (matplotlib). It reads only CSV, so a user can restyle any figure here.

  heatmap CSV -o FIG   a sweep over two parameters (qattn sweep): colour = log10 of the error (1 - CosSim; --linear:
                       the value), the degradation threshold drawn as a dashed contour, the plateau (within
                       --plateau-tol of the best point) outlined along the cells' edges, the best cell per row (the
                       ridge) marked; the title names the method's preset
  lines   CSV -o FIG   one line per --series value: --y against --x (e.g. error vs L, or vs bits)
  pareto  CSV -o FIG   --y (error) against --x (bits per element), one point per row, the Pareto front joined

FIG's extension picks the format: .png (200 dpi), .pdf or .svg. The file is written whole or not at all.
Exit status 2 with a message naming the file and column on bad input.
"""
import argparse
import csv
import math
import os
import sys
import tempfile


def die(msg):
    # exit 3, bad input, as the qattn program's; 2 stays argparse's, a usage error
    print(f"qattn plot: {msg}", file=sys.stderr)
    sys.exit(3)


def read_csv(path):
    """Rows of a qattn CSV as dicts; every malformed file (not UTF-8 text, not CSV, ragged rows) ends in die()."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            body = list(reader)
    except OSError as e:
        die(f"{path}: cannot read ({e.strerror})")
    except UnicodeDecodeError as e:
        die(f"{path}: not UTF-8 text (byte {e.start}); expected a CSV written by qattn")
    except csv.Error as e:
        die(f"{path}: not a CSV file ({e})")
    if not header:
        die(f"{path}: empty, expected a header line")
    if len(set(header)) != len(header):
        die(f"{path}: the header names a column twice")
    rows = []
    for i, r in enumerate(body):
        if not r:
            continue
        if len(r) != len(header):
            die(f"{path}: row {i + 2} has {len(r)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, r)))
    if not rows:
        die(f"{path}: no data rows")
    return rows


def column(rows, path, name, numeric=True):
    if name not in rows[0]:
        die(f"{path}: no column '{name}' (columns: {', '.join(rows[0].keys())})")
    out = []
    for i, r in enumerate(rows):
        v = r[name]
        if numeric:
            try:
                v = float(v)
            except ValueError:
                die(f"{path}: row {i + 2}, column '{name}': '{v}' is not a number")
        out.append(v)
    return out


def save(fig, out):
    ext = os.path.splitext(out)[1].lower()
    if ext not in (".png", ".pdf", ".svg"):
        die(f"{out}: the output must end in .png, .pdf or .svg")
    # A temporary of fixed-length, unguessable name beside the figure (O_EXCL), renamed over it when complete.
    try:
        fd, tmp = tempfile.mkstemp(prefix=".qattn-", suffix=ext, dir=os.path.dirname(os.path.abspath(out)))
        os.close(fd)
    except OSError as e:
        die(f"{out}: cannot write ({e.strerror})")
    try:
        fig.savefig(tmp, dpi=200, bbox_inches="tight")
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, out)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        die(f"{out}: cannot write ({e.strerror})")


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def configuration(rows, grid_keys):
    """The method a sweep ran, named as a user would write it: the registry's presets whose parameters equal the
    sweep's fixed ones (`index = index@paper`), found through `qattn methods --format json` when QATTN_CLI names the
    program (`qattn plot` sets it); otherwise the method with its fixed parameters."""
    spec = rows[0].get("method", "")
    name, _, rest = spec.partition(":")
    fixed = {}
    for item in rest.split(",") if rest else []:
        k, _, v = item.partition("=")
        if k not in grid_keys:
            fixed[k] = v
    plain = name + (" (" + ", ".join(f"{k}={v}" for k, v in fixed.items()) + ")" if fixed else "")
    cli = os.environ.get("QATTN_CLI")
    if not cli or not name:
        return plain
    import json
    import subprocess
    try:
        r = subprocess.run([cli, "methods", "--format", "json"], capture_output=True, text=True, timeout=60)
        entries = {e["name"]: e for e in json.loads(r.stdout)}
    except (OSError, ValueError, subprocess.SubprocessError):
        return plain
    e = entries.get(name)
    if e is None:
        return plain
    defaults = {p["key"]: p["default"] for p in e["params"]}
    candidates = [(name, defaults)] + [(f"{name}@{n}", {**defaults, **p["values"]}) for n, p in e["presets"].items()]
    names = [n for n, values in candidates if all(values.get(k) == v for k, v in fixed.items())]
    return " = ".join(names) if names else plain


def cell_edges(values):
    """The edges of cells centred on sorted values: midpoints between neighbours, half a gap beyond the ends."""
    if len(values) == 1:
        return [values[0] - 0.5, values[0] + 0.5]
    mids = [(a + b) / 2 for a, b in zip(values, values[1:])]
    return [values[0] - (mids[0] - values[0])] + mids + [values[-1] + (values[-1] - mids[-1])]


def plateau_edges(grid, inside, xe, ye):
    """The outline of the cells where inside(value) holds, along the cells' edges (xe, ye: cell_edges of the
    columns and rows): (xs, ys) segments."""
    segs = []
    ny, nx = len(grid), len(grid[0])
    def cell_in(j, i):
        return 0 <= j < ny and 0 <= i < nx and math.isfinite(grid[j][i]) and inside(grid[j][i])
    for j in range(ny):
        for i in range(nx):
            if not cell_in(j, i):
                continue
            x0, x1, y0, y1 = xe[i], xe[i + 1], ye[j], ye[j + 1]
            if not cell_in(j, i - 1):
                segs.append(([x0, x0], [y0, y1]))
            if not cell_in(j, i + 1):
                segs.append(([x1, x1], [y0, y1]))
            if not cell_in(j - 1, i):
                segs.append(([x0, x1], [y0, y0]))
            if not cell_in(j + 1, i):
                segs.append(([x0, x1], [y1, y1]))
    return segs


def heatmap(a, plt):
    rows = read_csv(a.csv)
    keys = [k for k in rows[0].keys() if k not in ("target", "metric", "mean", "worst", "heads", "method")]
    y_key = a.y or (keys[0] if keys else None)
    x_key = a.x or (keys[1] if len(keys) > 1 else None)
    if x_key is None or y_key is None:
        die(f"{a.csv}: a heatmap needs two grid columns, found {keys}")
    xs, ys, vs = column(rows, a.csv, x_key), column(rows, a.csv, y_key), column(rows, a.csv, a.value)
    xu, yu = sorted(set(xs)), sorted(set(ys))
    if len(xu) < 2 or len(yu) < 2:
        die(f"{a.csv}: a heatmap needs at least two values on each axis; '{x_key}' has {len(xu)}, '{y_key}' has "
            f"{len(yu)} (draw a one-axis sweep with `qattn plot lines`)")
    grid = [[math.nan] * len(xu) for _ in yu]
    for x, y, v in zip(xs, ys, vs):
        grid[yu.index(y)][xu.index(x)] = v
    metric = rows[0].get("metric", a.value)
    higher_better = metric == "cossim"
    finite = [v for v in vs if math.isfinite(v)]
    best = max(finite) if higher_better else min(finite)
    label_value = a.value
    shown_tol, shown_best, shown_threshold = a.plateau_tol, best, a.threshold
    if not a.linear:  # colour by log10 of the error (1 - CosSim for similarities); contours follow
        def tr(v):
            e = 1 - v if higher_better else v
            return math.log10(e) if e > 0 and math.isfinite(e) else math.nan
        grid = [[tr(v) for v in row] for row in grid]
        best = tr(best)
        if a.threshold is not None:
            a.threshold = tr(a.threshold)
        higher_better = False
        label_value = f"log10(1 - {a.value})" if metric == "cossim" else f"log10({a.value})"
        a.plateau_tol = math.log10(1 + a.plateau_tol / (10 ** best)) if a.plateau_tol > 0 else 0
    fig, ax = plt.subplots(figsize=(8, 4.2))
    xe, ye = cell_edges(xu), cell_edges(yu)  # cells centred on the grid values, evenly spaced or not
    im = ax.pcolormesh(xe, ye, grid, shading="flat", cmap="viridis" if higher_better else "viridis_r")
    cb = fig.colorbar(im, ax=ax)
    cb.set_label(f"{rows[0].get('target', '')} {metric}: {label_value} over {rows[0].get('heads', '?')} heads")
    values = [v for row in grid for v in row if math.isfinite(v)]
    if a.threshold is not None and min(values) < a.threshold < max(values):
        ax.contour(xu, yu, grid, levels=[a.threshold], colors="white", linestyles="dashed", linewidths=1.2)
        cb.ax.axhline(a.threshold, color="white", linestyle="dashed")
    tol = a.plateau_tol
    plateau_level = best - tol if higher_better else best + tol
    inside = (lambda v: v >= plateau_level) if higher_better else (lambda v: v <= plateau_level)
    for k, (sx, sy) in enumerate(plateau_edges(grid, inside, xe, ye)):  # along the cells' edges
        ax.plot(sx, sy, color="red", linewidth=1.8, solid_capstyle="projecting",
                label="plateau" if k == 0 else None)
    ridge_x, ridge_y = [], []
    for j, y in enumerate(yu):
        row = grid[j]
        cand = [(v, i) for i, v in enumerate(row) if math.isfinite(v)]
        if cand:
            v, i = max(cand) if higher_better else min(cand)
            ridge_x.append(xu[i])
            ridge_y.append(y)
    # white with a black edge: visible on every colour of the map
    ax.plot(ridge_x, ridge_y, linestyle="none", marker="o", markersize=6, markerfacecolor="white",
            markeredgecolor="black", markeredgewidth=1.2, label="best per row (ridge)")
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    title = a.title or f"{configuration(rows, {x_key, y_key})}: {rows[0].get('target', '')} {metric} over ({y_key}, {x_key})"
    ax.set_title(title + f"\nred: plateau within {shown_tol:g} of the best ({shown_best:.6g})" +
                 (f"; dashed: threshold {shown_threshold:g}" if shown_threshold is not None else ""), fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    save(fig, a.out)


def finish(a, fig, ax, ylabel=None, legend_title=None):
    """The common end of lines and pareto: log y if asked, axis labels from the column names, grid, legend,
    title, and the atomic save."""
    if a.logy:
        ax.set_yscale("log")
    ax.set_xlabel(a.x)
    ax.set_ylabel(ylabel or a.y)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, title=legend_title, title_fontsize=8)
    if a.title:
        ax.set_title(a.title)
    save(fig, a.out)


def series_labels(rows, series, series_key, x_key):
    """The line each row belongs to. A sweep's method column spells the swept value too: without it, the points of
    one configuration are one line, named as configuration() names it."""
    if series_key != "method" or x_key not in rows[0]:
        return series
    def without_x(spec):
        name, _, rest = spec.partition(":")
        kept = [item for item in rest.split(",") if item and item.partition("=")[0] != x_key]
        return name + (":" + ",".join(kept) if kept else "")
    stripped = [without_x(m) for m in series]
    names = {m: configuration([{"method": m}], {x_key}) for m in set(stripped)}
    return [names[m] for m in stripped]


def lines(a, plt):
    rows = read_csv(a.csv)
    xs, ys = column(rows, a.csv, a.x), column(rows, a.csv, a.y)
    series = series_labels(rows, column(rows, a.csv, a.series, numeric=False), a.series, a.x)
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in dict.fromkeys(series):
        pts = sorted((x, y) for x, y, t in zip(xs, ys, series) if t == s)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
    if a.logx:
        ax.set_xscale("log", base=2)
    # the y axis names the metric where the CSV has one (a sweep's target and metric columns)
    metric = " ".join(x for x in (rows[0].get("target", ""), rows[0].get("metric", "")) if x)
    heads = rows[0].get("heads")
    ylabel = f"{metric}: {a.y}" + (f" over {heads} heads" if heads and a.y in ("mean", "worst") else "") if metric else a.y
    finish(a, fig, ax, ylabel=ylabel, legend_title=a.series)


def pareto(a, plt):
    rows = read_csv(a.csv)
    xs, ys = column(rows, a.csv, a.x), column(rows, a.csv, a.y)
    labels = column(rows, a.csv, a.label, numeric=False)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(xs, ys, color="tab:blue")
    for x, y, t in zip(xs, ys, labels):
        ax.annotate(t, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front, best = [], math.inf
    for x, y in sorted(zip(xs, ys)):
        if y < best:
            front.append((x, y))
            best = y
    ax.plot([p[0] for p in front], [p[1] for p in front], color="tab:red", label="Pareto front")
    finish(a, fig, ax)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    h = sub.add_parser("heatmap")
    h.add_argument("--x", help="column on the x axis (default: the second grid column)")
    h.add_argument("--y", help="column on the y axis (default: the first grid column)")
    h.add_argument("--value", default="mean", help="colour column (mean or worst)")
    h.add_argument("--threshold", type=float, help="degradation threshold, drawn as a dashed contour")
    h.add_argument("--plateau-tol", type=float, default=1e-3, help="plateau: within this of the best value")
    h.add_argument("--linear", action="store_true",
                   help="colour by the value itself (default: log10 of the error, 1 - CosSim for CosSim)")
    h.add_argument("--log-error", action="store_true", help="the default; kept for scripts that pass it")
    l = sub.add_parser("lines")
    l.add_argument("--x", required=True)
    l.add_argument("--y", default="mean")
    l.add_argument("--series", default="method")
    l.add_argument("--logx", action="store_true")
    l.add_argument("--logy", action="store_true")
    p = sub.add_parser("pareto")
    p.add_argument("--x", default="bits")
    p.add_argument("--y", default="error")
    p.add_argument("--label", default="method")
    p.add_argument("--logy", action="store_true")
    for s in (h, l, p):
        s.add_argument("csv")
        s.add_argument("-o", "--out", required=True)
        s.add_argument("--title")
    a = ap.parse_args()
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        die("matplotlib is missing: apt-get install python3-matplotlib")
    try:
        {"heatmap": heatmap, "lines": lines, "pareto": pareto}[a.kind](a, plt)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        # a CSV this script's checks did not foresee: one line, never a traceback
        die(f"{a.csv}: cannot draw a {a.kind} from it ({type(e).__name__}: {e})")


if __name__ == "__main__":
    main()
