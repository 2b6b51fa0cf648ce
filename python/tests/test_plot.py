"""Tests of qattn.plot: figures rendered and read back through their artists (every drawn text's box, the axes'
names and scales), the leaderboard's Pareto figure from its expected CSV, a sweep drawn straight from Python, and
write_csv against `qattn sweep --out`. Run by CTest (python_package) with PYTHONPATH set to the build tree's
package, QATTN_CLI to the qattn program and QATTN_SOURCE to the repository."""
import math
import os
import subprocess
import sys

import pytest

matplotlib = pytest.importorskip("matplotlib")

import qattn  # noqa: E402
import qattn.plot  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Annotation, Text  # noqa: E402

CLI = os.environ.get("QATTN_CLI", "qattn")
SOURCE = os.environ.get("QATTN_SOURCE", ".")
SAMPLE = os.path.join(SOURCE, "experiments", "data", "use-lite")
LEADERBOARD = os.path.join(SOURCE, "experiments", "leaderboard", "leaderboard-pareto.csv")
KV_QUANTIZERS = os.path.join(SOURCE, "experiments", "kv-quantizers", "kv-quantizers-pareto.csv")


def drawn_texts(fig):
    """(string, box) of every text the figure draws, measured here and not by qattn.plot: after a full draw, each
    visible non-empty Text's window extent (an annotation's glyphs without its leader line), tick labels only for
    ticks inside the axis's view."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                loc = tick.get_loc()
                if axis.get_scale() == "log":
                    inside = loc > 0 and lo * (1 - 1e-9) <= loc <= hi * (1 + 1e-9)
                else:
                    inside = lo - 1e-9 * abs(hi - lo) <= loc <= hi + 1e-9 * abs(hi - lo)
                if not inside:
                    hidden.update((id(tick.label1), id(tick.label2)))
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or id(t) in hidden:
            continue
        if isinstance(t, Annotation):
            t.update_positions(renderer)
        out.append((t.get_text(), Text.get_window_extent(t, renderer)))
    return out


def overlaps(fig):
    boxes = drawn_texts(fig)
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if ba.x0 < bb.x1 and bb.x0 < ba.x1 and ba.y0 < bb.y1 and bb.y0 < ba.y1]


def test_the_module_imports_without_the_extension_or_matplotlib():
    # what `qattn plot` runs: the file alone, outside the package
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('p', sys.argv[1]);"
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m);"
            "print(sorted(n for n in ('matplotlib', 'numpy', 'qattn', 'qattn._qattn') if n in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code, qattn.plot.__file__], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_leaderboard_pareto_is_readable():
    fig = qattn.plot.pareto(LEADERBOARD, x="kv_bits", y="O_error", logy=True)
    assert isinstance(fig, Figure)
    assert overlaps(fig) == []
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel().startswith("K/V bits per element") and "1 − O CosSim" in ax.get_ylabel()
    # every method is named: beside its point or in the list of numbered points
    names = [r["method"] for r in qattn.plot.read_csv(LEADERBOARD)]
    texts = " | ".join(t for t, _ in drawn_texts(fig))
    assert all(n in texts for n in names), texts


def test_kv_quantizers_pareto_is_readable():
    fig = qattn.plot.pareto(KV_QUANTIZERS, x="bits", y="O_error", label="quantizer")
    assert overlaps(fig) == []
    assert fig.axes[0].get_yscale() == "log"
    assert "scales and zero points included" in fig.axes[0].get_xlabel()


def test_pareto_draws_a_cossim_column_as_one_minus_cossim(tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text("method,bits,O_cossim\na,4,0.99\nb,8,0.999\nc,16,0.9999\n")
    ax = qattn.plot.pareto(str(csv), y="O_cossim").axes[0]
    assert ax.get_yscale() == "log"
    assert sorted(ax.collections[0].get_offsets()[:, 1]) == pytest.approx([1e-4, 1e-3, 1e-2])
    ax = qattn.plot.pareto(str(csv), y="O_cossim", linear=True).axes[0]
    assert ax.get_yscale() == "linear"
    assert sorted(ax.collections[0].get_offsets()[:, 1]) == pytest.approx([0.99, 0.999, 0.9999])


@pytest.fixture(scope="module")
def b_sweep():
    return qattn.sweep(SAMPLE, "index@paper", {"b": range(3, 9)})


def test_lines_from_sweep_rows_draw_one_minus_cossim_on_a_log_axis(b_sweep):
    fig = qattn.plot.lines(b_sweep, x="b")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert list(ax.lines[0].get_ydata()) == pytest.approx([1 - r["mean"] for r in b_sweep])
    assert ax.get_ylabel().startswith("1 − O CosSim") and "log scale" in ax.get_ylabel()
    assert ax.get_xlabel() != "b" and "b" in ax.get_xlabel()
    assert overlaps(fig) == []
    ax = qattn.plot.lines(b_sweep, x="b", linear=True).axes[0]
    assert ax.get_yscale() == "linear"
    assert list(ax.lines[0].get_ydata()) == pytest.approx([r["mean"] for r in b_sweep])


def test_lines_logy_never_takes_the_log_of_cossim(b_sweep, tmp_path):
    path = tmp_path / "s.csv"
    qattn.plot.write_csv(path, b_sweep, heads=8)
    ax = qattn.plot.lines(str(path), x="b", logy=True).axes[0]
    assert ax.get_yscale() == "log"
    assert max(ax.lines[0].get_ydata()) < 0.1  # 1 - CosSim, not CosSim (0.99...)


def test_lines_of_an_error_metric_are_on_a_log_axis():
    rows = qattn.sweep(SAMPLE, "index@paper", {"b": [4, 6]}, metric="rel_l1", target="P")
    ax = qattn.plot.lines(rows, x="b", metric="rel_l1", target="P").axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylabel().startswith("P relative L1 error")
    assert list(ax.lines[0].get_ydata()) == pytest.approx([r["mean"] for r in rows])


def test_heatmap_caption_names_the_threshold_only_where_drawn():
    rows = qattn.sweep(SAMPLE, "index@paper", {"b": [4, 5, 6], "c": [5, 6.6]})
    means = sorted(r["mean"] for r in rows)
    unreached = qattn.plot.heatmap(rows, threshold=0.9999999)
    assert "dashed" not in unreached.axes[0].get_title()
    assert unreached.axes[0].get_xlabel() != "c" and unreached.axes[0].get_ylabel() != "b"
    drawn = qattn.plot.heatmap(rows, threshold=(means[1] + means[2]) / 2)
    assert "dashed: threshold" in drawn.axes[0].get_title()
    assert len(drawn.axes[0].collections) > len(unreached.axes[0].collections)  # the contour's lines
    for fig in (unreached, drawn):
        assert overlaps(fig) == []


def test_figures_are_not_shown_or_kept_by_pyplot(b_sweep):
    import matplotlib.pyplot as plt
    before = plt.get_fignums()
    qattn.plot.lines(b_sweep, x="b")
    qattn.plot.pareto(LEADERBOARD, x="kv_bits", y="O_error")
    assert plt.get_fignums() == before


def test_drawing_leaves_the_callers_backend_and_environment_alone(b_sweep):
    script = f"""
import os, sys, matplotlib
matplotlib.use("svg")  # a session's own backend, as a notebook's inline one
import qattn.plot
qattn.plot.lines({list(b_sweep)!r}, x="b", metric="cossim", target="O")
print(matplotlib.get_backend(), os.environ.get("MPLBACKEND"), "matplotlib.pyplot" in sys.modules)
"""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env).stdout
    assert out.split() == ["svg", "None", "False"]


@pytest.mark.parametrize("grid, options, cli_grid", [
    ({"b": [4, 5], "c": [5, 6.6]}, {}, ["--grid", "b=4,5", "--grid", "c=5,6.6"]),
    ({"b": range(3, 6)}, {"metric": "rel_l1", "target": "P"},
     ["--grid", "b=3:5", "--metric", "rel_l1", "--target", "P"]),
])
def test_write_csv_is_qattn_sweep_out_byte_for_byte(tmp_path, grid, options, cli_grid):
    rows = qattn.sweep(SAMPLE, "index@paper", grid, **options)
    qattn.plot.write_csv(tmp_path / "py.csv", rows, heads=8, **options)
    subprocess.run([CLI, "sweep", "--method", "index@paper", "--tensors", SAMPLE, "--out", str(tmp_path / "cli.csv"),
                    *cli_grid], check=True, capture_output=True)
    assert (tmp_path / "py.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()


def test_bad_input_names_file_and_column(tmp_path, b_sweep):
    with pytest.raises(ValueError, match="nowhere.csv: cannot read"):
        qattn.plot.pareto(str(tmp_path / "nowhere.csv"))
    with pytest.raises(ValueError, match="no column 'L'"):
        qattn.plot.lines(b_sweep, x="L")
    bad = tmp_path / "bad.csv"
    bad.write_text("method,bits,error\na,4,x\n")
    with pytest.raises(ValueError, match="bad.csv: row 2, column 'error': 'x' is not a number"):
        qattn.plot.pareto(str(bad))
    crowd = tmp_path / "crowd.csv"
    crowd.write_text("method,bits,error\n" + "".join(f"m{i},8,1e-3\n" for i in range(150)))
    with pytest.raises(ValueError, match="crowd.csv: 150 points too crowded to number apart"):
        qattn.plot.pareto(str(crowd))
    with pytest.raises(TypeError, match="CSV path or a list of rows"):
        qattn.plot.lines(5, x="b")
    out = tmp_path / "never.csv"
    with pytest.raises(ValueError, match="never.csv: heads: unknown"):
        qattn.plot.write_csv(out, [{k: v for k, v in r.items()} for r in b_sweep])
    assert not out.exists()
    assert math.isfinite(b_sweep[0]["mean"])


def test_write_csv_reads_the_sweeps_own_heads(tmp_path):
    rows = qattn.sweep(SAMPLE, "index@paper", {"b": [4, 5]}, metric="rmse")
    qattn.write_csv(tmp_path / "py.csv", rows)
    subprocess.run([CLI, "sweep", "--method", "index@paper", "--grid", "b=4,5", "--metric", "rmse", "--tensors",
                    SAMPLE, "--out", str(tmp_path / "cli.csv")], check=True)
    assert (tmp_path / "py.csv").read_bytes() == (tmp_path / "cli.csv").read_bytes()
