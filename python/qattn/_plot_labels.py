"""Where the Pareto figure's labels go (qattn.plot.pareto): each label placed greedily beside its point, or further out
with a leader line, never over another label, line or marker. A module of its own beside plot.py, installed next to
the script share/qattn/plots/qattn_plot.py too; it imports only the standard library at import time (matplotlib when
a label is placed)."""

import math


def overlap(a, b, pad=0.0):
    return a.x0 < b.x1 + pad and b.x0 < a.x1 + pad and a.y0 < b.y1 + pad and b.y0 < a.y1 + pad


def _segment_hits(p, q, box):
    """Whether the segment p-q passes through box (Liang-Barsky clipping)."""
    t0, t1 = 0.0, 1.0
    dx, dy = q[0] - p[0], q[1] - p[1]
    for d, lo, hi, s in ((dx, box.x0, box.x1, p[0]), (dy, box.y0, box.y1, p[1])):
        if d == 0:
            if s < lo or s > hi:
                return False
            continue
        a, b = (lo - s) / d, (hi - s) / d
        t0, t1 = max(t0, min(a, b)), min(t1, max(a, b))
        if t0 > t1:
            return False
    return True


def _segments_cross(a, b, c, d):
    """Whether segments a-b and c-d cross (proper intersection; a shared end point does not count)."""
    def side(p, q, r):
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
    return side(a, b, c) * side(a, b, d) < 0 and side(c, d, a) * side(c, d, b) < 0


def text_extent(t, renderer):
    """The box of a text's own glyphs (an annotation's without its leader line)."""
    from matplotlib.text import Annotation, Text
    if isinstance(t, Annotation):
        t.update_positions(renderer)
    return Text.get_window_extent(t, renderer)


def _distance(box, point):
    dx = max(box.x0 - point[0], 0.0, point[0] - box.x1)
    dy = max(box.y0 - point[1], 0.0, point[1] - box.y1)
    return math.hypot(dx, dy)


_RINGS = (5, 14, 26, 40, 56, 74, 96, 122, 150)  # points from the marker's centre; ring k has 8 + 4k directions
_COLUMNS = (40, 70, 100, 135)  # points left or right of the marker, any height within 240 points (steps of 4)


def _label_offsets():
    """The offsets a label is tried at, (leader line?, dx, dy, ha, va) in points, nearest first within each kind:
    rings around the point (the first without a leader line), then columns of leader-lined labels beside it."""
    out = []
    for ring, radius in enumerate(_RINGS):
        steps = 8 + 4 * ring
        for k in range(steps):
            dx, dy = radius * math.cos(2 * math.pi * k / steps), radius * math.sin(2 * math.pi * k / steps)
            out.append((ring > 0, dx, dy, "left" if dx > 1e-9 else "right" if dx < -1e-9 else "center",
                        "bottom" if dy > 1e-9 else "top" if dy < -1e-9 else "center"))
    column = [(dx * side, dy) for dx in _COLUMNS for side in (1, -1) for dy in range(-240, 241, 4)]
    for dx, dy in sorted(column, key=lambda o: (math.hypot(*o), -o[0], -o[1])):
        out.append((True, dx, dy, "left" if dx > 0 else "right", "center"))
    return out


def place_labels(fig, ax, xy, texts, fontsize, obstacles):
    """Annotations of texts at points xy, each placed greedily (most crowded point first) at the first offset of
    _label_offsets() whose rendered box stays inside the axes and meets no placed label, leader line, marker or
    obstacle box; a label beside its point must be nearer to it than to any other point, a label further out gets a
    leader line that meets no label or marker and crosses no other leader. Returns the annotations, or None when
    some label finds no place (the caller numbers the points instead)."""
    from matplotlib.transforms import Bbox
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    px = fig.dpi / 72.0
    centres = [tuple(ax.transData.transform(p)) for p in xy]
    r = 4.5 * px  # a marker's radius (scatter's default size, 6 points across) in pixels
    markers = [Bbox.from_extents(cx - r, cy - r, cx + r, cy + r) for cx, cy in centres]
    boxes, leaders, placed = list(obstacles), [], []
    crowd = [sum(math.hypot(cx - ox, cy - oy) < 40 * px for ox, oy in centres) for cx, cy in centres]
    order = sorted(range(len(xy)), key=lambda i: (-crowd[i], -centres[i][1], i))
    offsets = _label_offsets()
    result = [None] * len(xy)
    for i in order:
        ann = ax.annotate(texts[i], xy[i], xytext=(0, 0), textcoords="offset points", fontsize=fontsize)
        found = False
        for leader, dx, dy, ha, va in offsets:
            ann.set_ha(ha)
            ann.set_va(va)
            ann.xyann = (dx, dy)
            box = text_extent(ann, renderer)
            if not (frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1):
                continue
            if any(overlap(box, b, 1.0) for b in boxes + placed):
                continue
            if any(overlap(box, m) for j, m in enumerate(markers) if j != i):
                continue
            if any(_segment_hits(p, q, box) for _, p, q in leaders):
                continue
            start = centres[i]
            if not leader:  # no leader line: the label must sit nearer its own point than any other
                own = _distance(box, start)
                if any(_distance(box, c) < own for j, c in enumerate(centres)
                       if j != i and not overlap(markers[j], markers[i])):
                    continue
            else:
                end = ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)  # matplotlib aims the line at the box's centre
                if any(_segment_hits(start, end, b) for b in placed):
                    continue
                # a marker on top of this point's own (coincident points) cannot be avoided by any line
                if any(_segment_hits(start, end, m) for j, m in enumerate(markers)
                       if j != i and not overlap(m, markers[i])):
                    continue
                # lines out of one blob of coincident markers fan out from it: only others' lines count
                if any(_segments_cross(start, end, p, q) for j, p, q in leaders if not overlap(markers[j], markers[i])):
                    continue
                leaders.append((i, start, end))
                ann.remove()
                ann = ax.annotate(texts[i], xy[i], xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                                  ha=ha, va=va, arrowprops=dict(arrowstyle="-", color="0.45", linewidth=0.6,
                                                                shrinkA=0, shrinkB=r / px))
            found = True
            break
        if not found:
            for a in result:
                if a is not None:
                    a.remove()
            ann.remove()
            return None
        ann.update_positions(renderer)
        placed.append(text_extent(ann, renderer))
        result[i] = ann
    return result
