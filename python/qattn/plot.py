#!/usr/bin/python3
"""Figures from qattn's sweeps and tables (matplotlib): `qattn plot` runs this file, Python imports it as qattn.plot.

  heatmap CSV -o FIG   a sweep over two parameters (qattn sweep): colour = log10 of the error (1 - CosSim; --linear:
                       the value), the degradation threshold drawn as a dashed contour where a cell reaches it, the
                       plateau (within --plateau-tol of the best point) outlined along the cells' edges, the best cell
                       per row (the ridge) marked; the title names the method's preset
  lines   CSV -o FIG   one line per --series value: --y against --x (e.g. error vs L, or vs bits)
  pareto  CSV -o FIG   --y (error) against --x (bits per element), one labelled point per row, the Pareto front joined

Error metrics are drawn on a log scale: a CosSim as 1 - CosSim, an error (one_minus_cossim, rel_l1, rmse, kl, a
column named *error) as itself; --linear draws the column's own values on a linear axis. Axes are named in words
(known columns and, through `qattn methods`, a method's parameters; --xlabel/--ylabel override). Point labels are
placed where their rendered boxes meet no other text, marker or legend (a leader line joins a label set apart from
its point); when one cannot be placed, every point is numbered instead and the numbers are listed beside the axes
(points too crowded for their numbers are refused, exit 3).

FIG's extension picks the format: .png (200 dpi), .pdf or .svg. The file is written whole or not at all. Exit
status 3 with a message naming the file and column on bad input; 2 on a usage error. With QATTN_PLOT_ARTISTS set,
the script also writes there a JSON of what it drew: every text's window extent, each axes' labels and scales.

From Python, heatmap(), lines() and pareto() take a CSV path or the rows qattn.sweep returns and return the
matplotlib Figure (Agg canvas; nothing is shown); write_csv() writes a sweep as `qattn sweep --out` does. This file
imports only the standard library at import time; numpy and matplotlib are imported when a figure is drawn.
"""
import argparse
import csv
import math
import os
import sys
import tempfile

try:
    from ._plot_labels import overlap, place_labels, text_extent
except ImportError:  # not the package's module: qattn_plot.py (share/qattn/plots) or this file run or loaded by path
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_plot_labels", os.path.join(os.path.dirname(os.path.realpath(__file__)), "_plot_labels.py"))
    _labels = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_labels)
    overlap, place_labels, text_extent = _labels.overlap, _labels.place_labels, _labels.text_extent

# Column ids of qattn's CSVs and their names on an axis.
_COLUMN_NAMES = {
    "kv_bits": "K/V bits per element (nominal: scales excluded)",
    "bits": "K/V bits per element (scales and zero points included)",
    "L": "sequence length L (tokens)",
    "threads": "threads",
}
_METRIC_NAMES = {"cossim": "CosSim", "one_minus_cossim": "1 − CosSim", "rel_l1": "relative L1 error",
                 "rmse": "RMSE", "kl": "KL divergence (nats, mean over rows)"}
_ERROR_METRICS = ("one_minus_cossim", "rel_l1", "rmse", "kl")
_SWEEP_COLUMNS = ("target", "metric", "mean", "worst", "heads", "method")


class _InputError(ValueError):
    """Bad input: the message names the file (or argument) and column; the CLI prints it and exits 3."""


def read_csv(path):
    """Rows of a qattn CSV as dicts of strings; a malformed file (not UTF-8 text, not CSV, ragged rows) raises
    ValueError naming the file."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            body = list(reader)
    except OSError as e:
        raise _InputError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise _InputError(f"{path}: not UTF-8 text (byte {e.start}); expected a CSV written by qattn") from None
    except csv.Error as e:
        raise _InputError(f"{path}: not a CSV file ({e})") from None
    if not header:
        raise _InputError(f"{path}: empty, expected a header line")
    if len(set(header)) != len(header):
        raise _InputError(f"{path}: the header names a column twice")
    rows = []
    for i, r in enumerate(body):
        if not r:
            continue
        if len(r) != len(header):
            raise _InputError(f"{path}: row {i + 2} has {len(r)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, r)))
    if not rows:
        raise _InputError(f"{path}: no data rows")
    return rows


def _rows(source, metric=None, target=None):
    """(rows, name): a CSV path read, or qattn.sweep's rows (dicts) taken as they are, with target, metric and heads
    added where the rows lack them (from the arguments, else the rows' attributes, else sweep's defaults O and
    cossim; heads only where known)."""
    if isinstance(source, (str, bytes, os.PathLike)):
        return read_csv(source), os.fsdecode(source)
    if isinstance(source, dict) or not hasattr(source, "__iter__"):
        raise TypeError("qattn.plot: expected a CSV path or a list of rows (dicts, as qattn.sweep returns), got "
                        + type(source).__name__)
    rows = list(source)
    if not rows:
        raise _InputError("rows: no data rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise TypeError(f"rows: row {i} is a {type(r).__name__}, expected a dict")
        if set(r) != set(rows[0]):
            raise _InputError(f"rows: row {i} has the columns {sorted(r)}, row 0 {sorted(rows[0])}")
    extra = {"target": target or getattr(source, "target", "O"),
             "metric": metric or getattr(source, "metric", "cossim")}
    if getattr(source, "heads", None) is not None:
        extra["heads"] = source.heads
    if "mean" in rows[0]:
        rows = [dict(r, **{k: v for k, v in extra.items() if k not in r}) for r in rows]
    return rows, "rows"


def column(rows, path, name, numeric=True):
    """The values of column `name`: floats (numeric) or strings; a missing column or a non-number raises ValueError
    naming the file, row and column."""
    if name not in rows[0]:
        raise _InputError(f"{path}: no column '{name}' (columns: {', '.join(rows[0].keys())})")
    out = []
    for i, r in enumerate(rows):
        v = r[name]
        if numeric:
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise _InputError(f"{path}: row {i + 2}, column '{name}': '{v}' is not a number") from None
        else:
            v = str(v)
        out.append(v)
    return out


def _methods_json():
    """`qattn methods --format json` by name, through QATTN_CLI (set by `qattn plot`); {} without the program."""
    cli = os.environ.get("QATTN_CLI")
    if not cli:
        return {}
    if cli not in _METHODS_CACHE:  # one run per program and process
        import json
        import subprocess
        try:
            r = subprocess.run([cli, "methods", "--format", "json"], capture_output=True, text=True, timeout=60)
            _METHODS_CACHE[cli] = {e["name"]: e for e in json.loads(r.stdout)}
        except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError):
            _METHODS_CACHE[cli] = {}
    return _METHODS_CACHE[cli]


_METHODS_CACHE = {}


def configuration(rows, grid_keys):
    """The method a sweep ran, named as a user would write it: the registry's presets whose parameters equal the
    sweep's fixed ones (`index = index@paper`), found through `qattn methods --format json` when QATTN_CLI names the
    program (`qattn plot` sets it); otherwise the method with its fixed parameters."""
    spec = str(rows[0].get("method", ""))
    name, _, rest = spec.partition(":")
    fixed = {}
    for item in rest.split(",") if rest else []:
        k, _, v = item.partition("=")
        if k not in grid_keys:
            fixed[k] = v
    plain = name + (" (" + ", ".join(f"{k}={v}" for k, v in fixed.items()) + ")" if fixed else "")
    e = _methods_json().get(name) if name else None
    if e is None:
        return plain
    defaults = {p["key"]: p["default"] for p in e["params"]}
    candidates = [(name, defaults)] + [(f"{name}@{n}", {**defaults, **p["values"]}) for n, p in e["presets"].items()
                                       if "alias_of" not in p]  # an old spelling names its preset's values
    names = [n for n, values in candidates if all(values.get(k) == v for k, v in fixed.items())]
    return " = ".join(names) if names else plain


def _is_error(rows, name):
    """Whether column `name` holds an error (smaller is better, drawn on a log axis) or a CosSim (drawn as
    1 - CosSim): (is_metric, is_cossim)."""
    if name in ("mean", "worst") and "metric" in rows[0]:
        m = str(rows[0]["metric"])
        return m == "cossim" or m in _ERROR_METRICS, m == "cossim"
    low = name.lower()
    if low.endswith("cossim") and not low.endswith("one_minus_cossim"):
        return True, True
    return low.endswith("error") or low.endswith(_ERROR_METRICS), False


def axis_name(rows, name, log_error=False):
    """A column's name on an axis, in words: a metric with its target and head count, a known column, a method's
    parameter (its `qattn methods` doc when QATTN_CLI is set), or the column id."""
    metric_col = name in ("mean", "worst") and "metric" in rows[0]
    if metric_col or name in ("O_error", "P_error"):
        target = str(rows[0].get("target", "O")) if metric_col else name[0]
        metric = str(rows[0]["metric"]) if metric_col else "one_minus_cossim"
        words = _METRIC_NAMES.get(metric, metric)
        if metric == "cossim" and log_error:
            text = f"1 − {target} CosSim"
        elif metric in ("cossim", "one_minus_cossim"):
            text = words.replace("CosSim", f"{target} CosSim")
        else:
            text = f"{target} {words}"
        notes = []
        if metric_col:
            heads = rows[0].get("heads")
            notes.append(f"{name} over {heads} heads" if heads not in (None, "") else name)
        if log_error:
            notes.append("log scale")
        return text + (" (" + ", ".join(notes) + ")" if notes else "")
    if name in _COLUMN_NAMES:
        return _COLUMN_NAMES[name]
    spec = str(rows[0].get("method", ""))
    if ":" in spec or name in [kv.partition("=")[0] for kv in spec.partition(":")[2].split(",")]:
        e = _methods_json().get(spec.partition(":")[0].partition("@")[0])
        docs = {p["key"]: p.get("doc", "") for p in e["params"]} if e else {}
        return f"{name}: {docs[name]}" if docs.get(name) else f"parameter {name}"
    return name


def _figure(size):
    """A figure detached from pyplot (nothing to close, nothing shown), on an Agg canvas of its own. pyplot is never
    imported and no backend is chosen: the caller's matplotlib session (a notebook's backend) is left as it is."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise _InputError("matplotlib is missing: apt-get install python3-matplotlib") from None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


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


def heatmap(source, x=None, y=None, value="mean", threshold=None, plateau_tol=1e-3, linear=False, title=None,
            xlabel=None, ylabel=None, metric=None, target=None):
    """A two-parameter sweep as a heatmap: colour = log10 of the error (1 - CosSim for a CosSim; ``linear``: the
    value), the plateau within ``plateau_tol`` of the best point outlined, the best cell of each row marked, and
    the ``threshold`` contour (dashed) where some cells are above and some below it. ``source``: a CSV path or
    qattn.sweep's rows (``metric``/``target``: the sweep's, when the rows do not say). Returns the Figure."""
    rows, path = _rows(source, metric, target)
    keys = [k for k in rows[0].keys() if k not in _SWEEP_COLUMNS]
    y_key = y or (keys[0] if keys else None)
    x_key = x or (keys[1] if len(keys) > 1 else None)
    if x_key is None or y_key is None:
        raise _InputError(f"{path}: a heatmap needs two grid columns, found {keys}")
    xs, ys, vs = column(rows, path, x_key), column(rows, path, y_key), column(rows, path, value)
    xu, yu = sorted(set(xs)), sorted(set(ys))
    if len(xu) < 2 or len(yu) < 2:
        raise _InputError(f"{path}: a heatmap needs at least two values on each axis; '{x_key}' has {len(xu)}, "
                          f"'{y_key}' has {len(yu)} (draw a one-axis sweep with `qattn plot lines`)")
    grid = [[math.nan] * len(xu) for _ in yu]
    for xv, yv, v in zip(xs, ys, vs):
        grid[yu.index(yv)][xu.index(xv)] = v
    metric_name = str(rows[0].get("metric", value))
    higher_better = metric_name == "cossim"
    finite = [v for v in vs if math.isfinite(v)]
    if not finite:
        raise _InputError(f"{path}: column '{value}' has no finite value")
    best = max(finite) if higher_better else min(finite)
    label_value = value
    shown_best, level, tol = best, threshold, plateau_tol
    if not linear:  # colour by log10 of the error (1 - CosSim for similarities); contours follow
        def tr(v):
            e = 1 - v if higher_better else v
            return math.log10(e) if e > 0 and math.isfinite(e) else math.nan
        grid = [[tr(v) for v in row] for row in grid]
        best = tr(best)
        if level is not None:
            level = tr(level)
        higher_better = False
        label_value = f"log10(1 - {value})" if metric_name == "cossim" else f"log10({value})"
        tol = math.log10(1 + plateau_tol / (10 ** best)) if plateau_tol > 0 else 0
    fig = _figure((8, 4.2))
    ax = fig.add_subplot()
    xe, ye = cell_edges(xu), cell_edges(yu)  # cells centred on the grid values, evenly spaced or not
    im = ax.pcolormesh(xe, ye, grid, shading="flat", cmap="viridis" if higher_better else "viridis_r")
    cb = fig.colorbar(im, ax=ax)
    cb.set_label(f"{rows[0].get('target', '')} {metric_name}: {label_value} over {rows[0].get('heads', '?')} heads")
    values = [v for row in grid for v in row if math.isfinite(v)]
    contour = level is not None and math.isfinite(level) and min(values) < level < max(values)
    if contour:
        ax.contour(xu, yu, grid, levels=[level], colors="white", linestyles="dashed", linewidths=1.2)
        cb.ax.axhline(level, color="white", linestyle="dashed")
    plateau_level = best - tol if higher_better else best + tol
    inside = (lambda v: v >= plateau_level) if higher_better else (lambda v: v <= plateau_level)
    for k, (sx, sy) in enumerate(plateau_edges(grid, inside, xe, ye)):  # along the cells' edges
        ax.plot(sx, sy, color="red", linewidth=1.8, solid_capstyle="projecting", label="plateau" if k == 0 else None)
    ridge_x, ridge_y = [], []
    for j, yv in enumerate(yu):
        cand = [(v, i) for i, v in enumerate(grid[j]) if math.isfinite(v)]
        if cand:
            v, i = max(cand) if higher_better else min(cand)
            ridge_x.append(xu[i])
            ridge_y.append(yv)
    # white with a black edge: visible on every colour of the map
    ax.plot(ridge_x, ridge_y, linestyle="none", marker="o", markersize=6, markerfacecolor="white",
            markeredgecolor="black", markeredgewidth=1.2, label="best per row (ridge)")
    ax.set_xlabel(xlabel or axis_name(rows, x_key))
    ax.set_ylabel(ylabel or axis_name(rows, y_key))
    head = title or (f"{configuration(rows, {x_key, y_key})}: {rows[0].get('target', '')} {metric_name} over "
                     f"({y_key}, {x_key})")
    # the caption names only what is drawn: the dashed threshold when its contour is
    ax.set_title(head + f"\nred: plateau within {plateau_tol:g} of the best ({shown_best:.6g})" +
                 (f"; dashed: threshold {threshold:g}" if contour else ""), fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(0, -0.16), ncol=2, fontsize=8, frameon=False)
    return fig


def _value_axis(ax, rows, y, linear, logy, vals):
    """The y values as drawn and the axis scale: a CosSim as 1 - CosSim and an error as itself on a log axis, unless
    linear; logy on any other column is a log of its values. Returns (values, log_error)."""
    is_metric, is_cossim = _is_error(rows, y)
    if linear:
        return vals, False
    if is_metric:
        ax.set_yscale("log")
        return ([1 - v for v in vals] if is_cossim else vals), True
    if logy:
        ax.set_yscale("log")
    return vals, False


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


def lines(source, x, y="mean", series="method", logx=False, logy=False, linear=False, title=None, xlabel=None,
          ylabel=None, metric=None, target=None):
    """One line per value of column ``series``: ``y`` against ``x``. An error metric is drawn on a log axis (a
    CosSim as 1 - CosSim); ``linear`` draws ``y`` itself on a linear axis; ``logy`` puts any other column on a log
    axis. ``logx``: a base-2 x axis. The legend sits beside the axes. Returns the Figure."""
    rows, path = _rows(source, metric, target)
    xs, ys = column(rows, path, x), column(rows, path, y)
    names = series_labels(rows, column(rows, path, series, numeric=False), series, x)
    fig = _figure((7, 4))
    ax = fig.add_subplot()
    ys, log_error = _value_axis(ax, rows, y, linear, logy, ys)
    for s in dict.fromkeys(names):
        pts = sorted((a, b) for a, b, t in zip(xs, ys, names) if t == s)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel or axis_name(rows, x))
    ax.set_ylabel(ylabel or axis_name(rows, y, log_error))
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, title=series if series != "method" else None, title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.02, 1), borderaxespad=0)
    if title:
        ax.set_title(title)
    return fig

def pareto(source, x="bits", y="error", label="method", logy=False, linear=False, title=None, xlabel=None,
           ylabel=None):
    """``y`` (an error, smaller is better) against ``x`` (bits per element), one point per row named by column
    ``label``, the Pareto front (each point with a lower ``y`` than every point at fewer or as many bits) joined. The
    error is drawn on a log axis (a CosSim as 1 - CosSim) unless ``linear``; ``logy`` is that default, kept for
    scripts. Labels never overlap: placed beside their points (with a leader line when set apart) or, where they do
    not fit, numbered and listed beside the axes (ValueError where even the numbers do not fit). Returns the
    Figure."""
    from matplotlib.lines import Line2D
    rows, path = _rows(source)
    xs, ys = column(rows, path, x), column(rows, path, y)
    labels = column(rows, path, label, numeric=False)
    fig = _figure((8, 5))
    ax = fig.add_subplot()
    ys, log_error = _value_axis(ax, rows, y, linear, logy, ys)
    ax.scatter(xs, ys, color="tab:blue", zorder=3, s=36)
    front, best = [], math.inf
    for a, b in sorted(zip(xs, ys)):
        if b < best:
            front.append((a, b))
            best = b
    ax.plot([p[0] for p in front], [p[1] for p in front], color="tab:red", label="Pareto front", zorder=2)
    ax.set_xlabel(xlabel or axis_name(rows, x))
    ax.set_ylabel(ylabel or axis_name(rows, y, log_error))
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title)
    ax.margins(x=0.08, y=0.08)
    legend = ax.legend(fontsize=8, loc="lower left")
    fig.canvas.draw()  # fixes the limits and the layout the placement measures against
    renderer = fig.canvas.get_renderer()
    placed = place_labels(fig, ax, list(zip(xs, ys)), labels, 7, [legend.get_window_extent(renderer)])
    if placed is None:  # numbered points, the numbers listed beside the axes
        legend.remove()
        numbers = [str(i + 1) for i in range(len(labels))]
        if place_labels(fig, ax, list(zip(xs, ys)), numbers, 7, []) is None:
            raise _InputError(f"{path}: {len(labels)} points too crowded to number apart; draw fewer rows")
        handles = [Line2D([], [], color="tab:red")] + [Line2D([], [], linestyle="none")] * len(labels)
        ax.legend(handles, ["Pareto front"] + [f"{n}  {t}" for n, t in zip(numbers, labels)], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, handlelength=1.5)
    return fig


def _tick_label_drawn(axis, tick):
    lo, hi = sorted(axis.get_view_interval())
    loc = tick.get_loc()
    if axis.get_scale() == "log":
        if loc <= 0 or lo <= 0:
            return False
        loc, lo, hi = math.log10(loc), math.log10(lo), math.log10(hi)
    eps = 1e-9 * max(1.0, abs(hi - lo))
    return lo - eps <= loc <= hi + eps


def text_boxes(fig):
    """Every text the figure draws (titles, axis labels, tick labels inside the view, annotations, legend entries,
    colour-bar labels) as (text, Bbox in display pixels), after a full draw."""
    from matplotlib.text import Text
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ticks = {}
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                for t in (tick.label1, tick.label2):
                    ticks[id(t)] = _tick_label_drawn(axis, tick)
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or not ticks.get(id(t), True):
            continue
        if t.axes is not None and id(t) not in ticks and t.get_clip_on() and t.get_clip_box() is not None:
            if not overlap(text_extent(t, renderer), t.get_clip_box()):
                continue  # clipped away: not drawn
        out.append((t, text_extent(t, renderer)))
    return out


def overlapping_texts(fig):
    """The pairs of texts (their strings) whose drawn boxes intersect; [] for a readable figure."""
    boxes = text_boxes(fig)
    return [(a.get_text(), b.get_text()) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if overlap(ba, bb)]


def artists_json(fig):
    """What a test of a rendered figure reads: every drawn text with its box, and each axes' labels and scales."""
    return {"texts": [{"text": t.get_text(), "box": [b.x0, b.y0, b.x1, b.y1]} for t, b in text_boxes(fig)],
            "axes": [{"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                      "xscale": ax.get_xscale(), "yscale": ax.get_yscale()} for ax in fig.axes]}


def _current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save(fig, out):
    """fig written to out (.png at 200 dpi, .pdf, .svg) whole or not at all: a temporary of fixed-length,
    unguessable name beside it (O_EXCL), renamed over it when complete."""
    ext = os.path.splitext(out)[1].lower()
    if ext not in (".png", ".pdf", ".svg"):
        raise _InputError(f"{out}: the output must end in .png, .pdf or .svg")
    _replace_atomically(out, ext, lambda fd, tmp: (os.close(fd), fig.savefig(tmp, dpi=200, bbox_inches="tight")))


def _replace_atomically(out, suffix, write):
    """write(fd, tmp) fills a temporary beside `out` (mkstemp: O_EXCL, unguessable name), which then takes `out`'s
    place with the umask's permissions; on an OSError the temporary is removed and _InputError names `out`."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".qattn-", suffix=suffix, dir=os.path.dirname(os.path.abspath(out)))
    except OSError as e:
        raise _InputError(f"{out}: cannot write ({e.strerror})") from None
    try:
        write(fd, tmp)
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, out)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise _InputError(f"{out}: cannot write ({e.strerror})") from None


def write_csv(path, rows, target=None, metric=None, heads=None):
    """A sweep (qattn.sweep's rows) written as `qattn sweep --out` writes it, byte for byte: the grid keys, target,
    metric, mean and worst (a CosSim with 8 decimals, an error in %.3e; nan, inf, -inf as such), heads, and the
    point's canonical spec (qattn.canonical; a label of your own Method as it is). ``target``, ``metric`` and
    ``heads`` default to the rows' attributes of those names (set by qattn.sweep), then to O and cossim; heads must
    be known. The file is written whole or not at all."""
    rows_list = list(rows)
    target = target or getattr(rows, "target", None) or "O"
    metric = metric or getattr(rows, "metric", None) or "cossim"
    heads = heads if heads is not None else getattr(rows, "heads", None)
    if heads is None:
        raise ValueError(f"{os.fsdecode(path)}: heads: unknown (pass heads=, the dump's head count)")
    if not rows_list:
        raise ValueError(f"{os.fsdecode(path)}: rows: no data rows")
    keys = [k for k in rows_list[0] if k not in ("method", "mean", "worst")]
    for i, r in enumerate(rows_list):
        missing = [k for k in keys + ["method", "mean", "worst"] if k not in r]
        if missing:
            raise ValueError(f"{os.fsdecode(path)}: row {i}: no {', '.join(missing)}")

    def number(v):
        v = float(v)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return "%.8f" % v if metric == "cossim" else "%.3e" % v

    def canonical(spec):
        try:
            from . import canonical as resolve
        except ImportError:
            return spec
        try:
            return resolve(spec)
        except (ValueError, TypeError):
            return spec  # a Method's label: the CLI cannot sweep it, the row keeps its name

    def cell(v):
        s = str(v)
        return '"' + s.replace('"', '""') + '"' if any(c in s for c in ',"\n') else s
    lines_out = [",".join(cell(c) for c in keys + list(_SWEEP_COLUMNS))]
    for r in rows_list:
        lines_out.append(",".join(cell(c) for c in [r[k] for k in keys] + [
            target, metric, number(r["mean"]), number(r["worst"]), str(int(heads)), canonical(str(r["method"]))]))
    text = "\n".join(lines_out) + "\n"
    def write(fd, _tmp):
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)

    _replace_atomically(os.fsdecode(path), ".csv", write)


def main(argv=None):
    """`qattn plot KIND CSV -o FIG [options]`: exit 0, 2 on a usage error, 3 on bad input."""
    ap = argparse.ArgumentParser(prog="qattn plot", description=__doc__.splitlines()[0])
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
    l.add_argument("--logx", action="store_true", help="base-2 x axis")
    l.add_argument("--logy", action="store_true", help="log y axis (an error metric's default; a CosSim as 1 - CosSim)")
    p = sub.add_parser("pareto")
    p.add_argument("--x", default="bits")
    p.add_argument("--y", default="error")
    p.add_argument("--label", default="method")
    p.add_argument("--logy", action="store_true", help="the default for an error column; kept for scripts")
    for s in (l, p):
        s.add_argument("--linear", action="store_true", help="the y column's own values on a linear axis")
    for s in (h, l, p):
        s.add_argument("csv")
        s.add_argument("-o", "--out", required=True)
        s.add_argument("--title")
        s.add_argument("--xlabel", help="the x axis's name (default: the column's name in words)")
        s.add_argument("--ylabel", help="the y axis's name (default: the column's name in words)")
    a = ap.parse_args(argv)
    common = dict(title=a.title, xlabel=a.xlabel, ylabel=a.ylabel)
    try:
        if a.kind == "heatmap":
            fig = heatmap(a.csv, a.x, a.y, a.value, a.threshold, a.plateau_tol, a.linear, **common)
        elif a.kind == "lines":
            fig = lines(a.csv, a.x, a.y, a.series, a.logx, a.logy, a.linear, **common)
        else:
            fig = pareto(a.csv, a.x, a.y, a.label, a.logy, a.linear, **common)
        save(fig, a.out)
        artists = os.environ.get("QATTN_PLOT_ARTISTS")
        if artists:
            import json
            with open(artists, "w", encoding="utf-8") as f:
                json.dump(artists_json(fig), f)
    except _InputError as e:  # exit 3, bad input, as the qattn program's; 2 stays argparse's, a usage error
        print(f"qattn plot: {e}", file=sys.stderr)
        return 3
    except (ValueError, TypeError, KeyError, IndexError) as e:
        # a CSV this script's checks did not foresee: one line, never a traceback
        print(f"qattn plot: {a.csv}: cannot draw a {a.kind} from it ({type(e).__name__}: {e})", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    # Run as a script (`qattn plot`, possibly through the share/qattn/plots link): the package's own directory is not
    # a place to import from (its torch.py would shadow torch).
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [d for d in sys.path if os.path.realpath(d or ".") != here]
    sys.exit(main())
