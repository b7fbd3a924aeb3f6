"""One self-contained HTML file (inline SVG, CSS and JS; nothing fetched): the entry function
before and after ``dpl.apply`` side by side, groups coloured by what claimed them. Clicking a
node shows its IR text, the pattern that claimed it, the runtime decision and the generated
kernel source; a search box finds nodes by name or op; identical groups are listed once. Each
panel zooms (the -/+ buttons, or Ctrl+wheel over it: a trackpad's pinch) and fits its picture
to the panel ("fit"); "100%" goes back to the drawn size."""

from __future__ import annotations

import html
import json

from dpl.viz.graph import View, collapse_repeats
from dpl.viz.layout import LINE_H, PAD, layout

FILL = {"automatic": "#d5ecd1", "alone": "#f8d3d3", "fallback": "#fde3c8", "rewritten": "#eeeeee",
        "input": "#ffffff", "output": "#ffffff", "repeat": "#f4f4f4"}
STROKE = {"automatic": "#59a14f", "alone": "#e15759", "fallback": "#f28e2b", "rewritten": "#9a9a9a",
          "input": "#888888", "output": "#888888", "composite": "#4e79a7", "repeat": "#555555"}
COMPOSITE_FILLS = ["#cfe0f3", "#e1d5f0", "#d3eef0", "#f3e1ef", "#dfe5f7", "#e8e3d3"]
LEGEND = [("composite", "claimed by a composite pattern"), ("automatic", "automatic fusion (FuseOps)"),
          ("alone", "alone: no group claimed it"), ("fallback", "fallen back: runs op by op at run time"),
          ("rewritten", "not in the result (dashed: replaced by a rewrite)")]


def legend_entries(fills: dict[str, str]) -> list[tuple[str, str, str]]:
    """(fill, stroke, words) per colour of the picture: each claim, then each composite's own fill."""
    entries = []
    for claim, words in LEGEND:
        entries.append((FILL.get(claim) or next(iter(fills.values()), COMPOSITE_FILLS[0]), STROKE[claim], words))
    for name, fill in fills.items():
        entries.append((fill, STROKE["composite"], name))
    return entries


def composite_fills(views) -> dict[str, str]:
    names = []
    for v in views:
        for n in v.nodes:
            if n.claim == "composite" and n.group and n.group not in names:
                names.append(n.group)
    return {name: COMPOSITE_FILLS[i % len(COMPOSITE_FILLS)] for i, name in enumerate(names)}


def fill_of(node, fills: dict[str, str]) -> str:
    if node.claim == "composite":
        return fills.get(node.group, COMPOSITE_FILLS[0])
    return FILL.get(node.claim, "#ffffff")


def svg(view: View, fills: dict[str, str]) -> str:
    """The view as an SVG element (its nodes are ``<g class="node" data-id=...>``)."""
    boxes, width, height = layout(view)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width:.0f}" height="{height:.0f}" '
           f'data-w="{width:.0f}" data-h="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" '
           'font-size="12">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#777"/></marker></defs>']
    for e in view.edges:
        a, b = boxes.get(e.src), boxes.get(e.dst)
        if a is None or b is None:
            continue
        x1, y1, x2, y2 = a.x + a.w / 2, a.y + a.h, b.x + b.w / 2, b.y
        # the type near the reader's end: the edges of a value read by several spread out there
        lx, ly = x1 + (x2 - x1) * 0.75, y1 + (y2 - y1) * 0.75
        label = html.escape(e.label)
        out.append(f'<g class="edge"><title>{label}</title><path d="M {x1:.1f} {y1:.1f} C {x1:.1f} {y1 + 25:.1f}, '
                   f'{x2:.1f} {y2 - 25:.1f}, {x2:.1f} {y2:.1f}" fill="none" stroke="#999" marker-end="url(#arrow)"/>'
                   f'<text x="{lx + 4:.1f}" y="{ly:.1f}" font-size="10" fill="#666">{label}</text></g>')
    for n in view.nodes:
        box = boxes[n.id]
        stroke = STROKE.get(n.claim, "#888")
        dash = ' stroke-dasharray="5 3"' if n.rewritten or n.claim == "repeat" else ""
        search = html.escape(" ".join([n.name, n.title, n.group, *n.lines]).lower(), quote=True)
        out.append(f'<g class="node claim-{n.claim}" data-id="{html.escape(n.id, quote=True)}" data-search="{search}">'
                   f'<title>{html.escape(n.name)}</title>'
                   f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" rx="5" '
                   f'fill="{fill_of(n, fills)}" stroke="{stroke}" stroke-width="1.5"{dash}/>')
        tx, ty = box.x + PAD, box.y + PAD + LINE_H - 3
        out.append(f'<text x="{tx:.1f}" y="{ty:.1f}" font-weight="bold">{html.escape(n.title)}</text>')
        for i, line in enumerate(n.lines, 1):
            out.append(f'<text x="{tx:.1f}" y="{ty + i * LINE_H:.1f}">{html.escape(line)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


STYLE = """
body { font-family: sans-serif; margin: 0; color: #222; }
header { padding: 8px 14px; background: #f4f4f4; border-bottom: 1px solid #ccc; }
header h1 { font-size: 18px; margin: 0 0 6px 0; }
.legend span { display: inline-block; margin-right: 14px; font-size: 13px; }
.legend i { display: inline-block; width: 14px; height: 14px; border: 1.5px solid; vertical-align: middle; margin-right: 4px; }
#tools { margin-top: 6px; font-size: 13px; }
#search { width: 260px; }
main { display: flex; height: calc(100vh - 110px); }
.panel { flex: 1; overflow: auto; border-right: 1px solid #ddd; }
.panel h2 { font-size: 14px; margin: 6px 10px; position: sticky; left: 0; }
#side { width: 36%; overflow: auto; padding: 8px 12px; font-size: 13px; }
#side pre { background: #f7f7f7; border: 1px solid #ddd; padding: 6px; overflow: auto; font-size: 12px; max-height: 40vh; }
g.node { cursor: pointer; }
g.node:hover rect { stroke-width: 3; }
g.node.selected rect { stroke: #000 !important; stroke-width: 3.5; }
g.node.hit rect { stroke: #d4a000 !important; stroke-width: 4; }
body.hide-before #before { display: none; }
body.collapsed .full.has-collapsed { display: none; }
body:not(.collapsed) .collapsed-view { display: none; }
body.hide-types g.edge text { display: none; }
#groups li { cursor: pointer; margin: 2px 0; }
#zoom button { min-width: 2.2em; }
#zoom-level { display: inline-block; min-width: 3.5em; text-align: right; }
#groups li:hover { text-decoration: underline; }
"""

SCRIPT = """
const data = JSON.parse(document.getElementById('dpl-data').textContent);
const nodes = Array.from(document.querySelectorAll('g.node'));
function field(name, value, pre) {
  if (!value) return '';
  const body = pre ? '<pre class="f-' + name.replace(/ /g, '-') + '"></pre>' : '<div class="f-' + name.replace(/ /g, '-') + '"></div>';
  return '<h3>' + name + '</h3>' + body;
}
function show(id) {
  const d = data.nodes[id];
  if (!d) return;
  nodes.forEach(g => g.classList.toggle('selected', g.dataset.id === id));
  const side = document.getElementById('detail');
  const keys = Object.keys(d.detail);
  side.innerHTML = '<h2 id="detail-title"></h2><div id="detail-claim"></div>' +
    keys.map(k => field(k, d.detail[k], k === 'ir' || k === 'kernel source')).join('');
  document.getElementById('detail-title').textContent = d.title + ' (' + d.name + ')';
  document.getElementById('detail-claim').textContent = 'claimed: ' + d.claim;
  keys.forEach(k => { const el = side.querySelector('.f-' + k.replace(/ /g, '-')); if (el) el.textContent = d.detail[k]; });
  const src = side.querySelector('.f-kernel-source');
  if (src) src.id = 'kernel-source';
}
nodes.forEach(g => g.addEventListener('click', () => show(g.dataset.id)));
function shown(g) { const r = g.getBoundingClientRect(); return r.width > 0 || r.height > 0; }
function reveal(id) {
  const g = nodes.find(n => n.dataset.id === id && shown(n)) || nodes.find(n => n.dataset.id === id);
  if (g) { g.scrollIntoView({block: 'center', inline: 'center'}); show(id); }
}
document.getElementById('search').addEventListener('input', ev => {
  const q = ev.target.value.trim().toLowerCase();
  let first = null;
  nodes.forEach(g => {
    const hit = q !== '' && g.dataset.search.includes(q);
    g.classList.toggle('hit', hit);
    if (hit && !first && shown(g)) first = g;
  });
  document.getElementById('hits').textContent = q ? nodes.filter(g => g.classList.contains('hit') && shown(g)).length + ' found' : '';
  if (first) first.scrollIntoView({block: 'center', inline: 'center'});
});
document.getElementById('hide-before').addEventListener('change', ev => document.body.classList.toggle('hide-before', ev.target.checked));
document.getElementById('collapse').addEventListener('change', ev => document.body.classList.toggle('collapsed', ev.target.checked));
document.getElementById('hide-types').addEventListener('change', ev => document.body.classList.toggle('hide-types', ev.target.checked));
// zoom: each panel has its scale; the buttons act on every panel, Ctrl+wheel on the one under the pointer
const panels = Array.from(document.querySelectorAll('section.panel'));
function scaleOf(panel) { return parseFloat(panel.dataset.scale || '1'); }
function zoom(panel, scale, cx, cy) {
  scale = Math.min(8, Math.max(0.02, scale));
  const old = scaleOf(panel);
  if (cx === undefined) { cx = panel.clientWidth / 2; cy = panel.clientHeight / 2; }
  const x = (panel.scrollLeft + cx) / old, y = (panel.scrollTop + cy) / old;  // the point kept in place
  panel.dataset.scale = scale;
  panel.querySelectorAll('svg.graph').forEach(s => {
    s.setAttribute('width', (s.dataset.w * scale).toFixed(1));
    s.setAttribute('height', (s.dataset.h * scale).toFixed(1));
  });
  panel.scrollLeft = x * scale - cx;
  panel.scrollTop = y * scale - cy;
  showScale();
}
function visibleGraph(panel) {
  return Array.from(panel.querySelectorAll('svg.graph')).find(s => shown(s));
}
function fit(panel) {
  const s = visibleGraph(panel);
  if (!s) return;
  const top = s.getBoundingClientRect().top - panel.getBoundingClientRect().top + panel.scrollTop;
  const w = panel.clientWidth - 8, h = panel.clientHeight - top - 8;
  zoom(panel, Math.min(w / s.dataset.w, h / s.dataset.h));
  panel.scrollLeft = 0;
  panel.scrollTop = 0;
}
function showPanels() { return panels.filter(p => shown(p)); }
function showScale() {
  const p = showPanels().pop();
  document.getElementById('zoom-level').textContent = p ? Math.round(scaleOf(p) * 100) + '%' : '';
}
document.getElementById('zoom-in').addEventListener('click', () => showPanels().forEach(p => zoom(p, scaleOf(p) * 1.25)));
document.getElementById('zoom-out').addEventListener('click', () => showPanels().forEach(p => zoom(p, scaleOf(p) / 1.25)));
document.getElementById('zoom-fit').addEventListener('click', () => showPanels().forEach(fit));
document.getElementById('zoom-reset').addEventListener('click', () => showPanels().forEach(p => zoom(p, 1)));
panels.forEach(p => p.addEventListener('wheel', ev => {
  if (!ev.ctrlKey && !ev.metaKey) return;  // a plain wheel scrolls the panel
  ev.preventDefault();
  const r = p.getBoundingClientRect();
  zoom(p, scaleOf(p) * Math.exp(-ev.deltaY * 0.002), ev.clientX - r.left, ev.clientY - r.top);
}, {passive: false}));
showScale();
const cursor = {};
document.querySelectorAll('#groups li').forEach(li => li.addEventListener('click', () => {
  const ids = JSON.parse(li.dataset.ids);
  const i = (cursor[li.dataset.key] || 0) % ids.length;
  cursor[li.dataset.key] = i + 1;
  reveal(ids[i]);
}));
"""


def page(title: str, before: View | None, after: View, table: str) -> str:
    views = [v for v in (before, after) if v is not None]
    fills = composite_fills(views)
    legend = [f'<span><i style="background:{fill};border-color:{stroke}"></i>{html.escape(words)}</span>'
              for fill, stroke, words in legend_entries(fills)]
    data = {"nodes": {n.id: {"title": n.title, "name": n.name, "claim": n.claim, "detail": dict(n.detail)}
                      for v in views for n in v.nodes}}
    # identical groups (one shared function, or the same composite over the same ops) listed once
    kinds: dict[str, list[str]] = {}
    for n in after.nodes:
        if n.claim in ("composite", "automatic", "fallback"):
            kinds.setdefault(n.name, []).append(n.id)
    items = []
    for key, ids in kinds.items():
        count = f" &times;{len(ids)}" if len(ids) > 1 else ""
        items.append(f'<li data-key="{html.escape(key, quote=True)}" data-ids="{html.escape(json.dumps(ids), quote=True)}">'
                     f'{html.escape(key)}{count}</li>')
    panels = []
    any_collapsed = False
    for view, key in ((before, "before"), (after, "after")):
        if view is None:
            continue
        short = collapse_repeats(view)
        inner = f'<div class="full{" has-collapsed" if short else ""}"><h2>{html.escape(view.title)}</h2>{svg(view, fills)}</div>'
        if short is not None:
            any_collapsed = True
            inner += f'<div class="collapsed-view"><h2>{html.escape(short.title)}</h2>{svg(short, fills)}</div>'
            for n in short.nodes:
                data["nodes"].setdefault(n.id, {"title": n.title, "name": n.name, "claim": n.claim, "detail": dict(n.detail)})
        panels.append(f'<section class="panel" id="{key}">{inner}</section>')
    payload = json.dumps(data).replace("</", "<\\/")
    collapse = (' &nbsp; <label><input type="checkbox" id="collapse" checked> collapse repeated layers</label>' if any_collapsed
                else '<input type="checkbox" id="collapse" hidden>')
    body_class = "collapsed" if any_collapsed else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style></head>
<body class="{body_class}">
<header><h1>{html.escape(title)}</h1>
<div class="legend">{''.join(legend)}</div>
<div id="tools"><input id="search" type="search" placeholder="find a binding or op (e.g. softmax)"> <span id="hits"></span>
 &nbsp; <label><input type="checkbox" id="hide-before"> only after</label>
 &nbsp; <label><input type="checkbox" id="hide-types"> hide edge types</label>{collapse}
 &nbsp; <span id="zoom" title="zoom the pictures (or Ctrl+wheel over one)"><button id="zoom-out" title="zoom out">&minus;</button>
<span id="zoom-level"></span> <button id="zoom-in" title="zoom in">+</button>
<button id="zoom-fit" title="fit each picture to its panel">fit</button>
<button id="zoom-reset" title="the drawn size">100%</button></span></div>
</header>
<main>{''.join(panels)}
<aside id="side"><div id="detail"><p>Click a box to see its IR, the pattern that claimed it, the runtime decision and its
generated kernel source.</p></div>
<h3>groups</h3><ul id="groups">{''.join(items)}</ul>
<h3>coverage</h3><pre id="coverage">{html.escape(table)}</pre></aside>
</main>
<script type="application/json" id="dpl-data">{payload}</script>
<script>{SCRIPT}</script>
</body></html>
"""
