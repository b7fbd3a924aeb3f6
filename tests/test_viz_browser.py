"""The HTML picture in a real browser (headless Chromium): it loads without errors, a click
on a fused group shows the group's IR, the pattern that claimed it and its generated C kernel
source; the search box finds a node. Needs Debian's ``chromium`` (skips locally without it,
fails under CI)."""

import pytest

import needs
from cdp import Browser, find_chromium

import dpl
from dpl.viz.demo import decoder_block


def test_clicking_a_group_shows_its_kernel_source(tmp_path):
    chromium = find_chromium()
    if chromium is None:
        needs.missing("no chromium on this machine (apt-get install -y chromium)")
    page = tmp_path / "demo.html"
    dpl.draw(decoder_block(), ["rewrites", "llm"]).save(page)
    browser = Browser(chromium)
    try:
        browser.open(page.as_uri())
        assert browser.evaluate("document.querySelectorAll('g.node').length") > 40
        # the attention composite's box, scrolled into view, clicked where it is on the screen
        box = browser.evaluate("""(() => {
            const g = Array.from(document.querySelectorAll('#after g.node.claim-composite'))
                .find(n => n.dataset.search.includes('kernel.attention') && n.getBoundingClientRect().width > 0);
            g.scrollIntoView({block: 'center', inline: 'center'});
            const r = g.querySelector('rect').getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2];
        })()""")
        browser.click(*box)
        title = browser.evaluate("document.getElementById('detail-title').textContent")
        assert "kernel.attention" in title
        source = browser.evaluate("document.getElementById('kernel-source').textContent")
        assert "void dpl_kernel" in source and "matrix product, computed by BLAS" in source
        shown = browser.evaluate("document.getElementById('detail').innerText")
        assert "llm.dpl:" in shown and "scores = matmul" in shown
        visible = browser.evaluate("(() => { const r = document.getElementById('kernel-source').getBoundingClientRect();"
                                   " return r.width > 100 && r.height > 50; })()")
        assert visible
        browser.screenshot(str(tmp_path / "clicked.png"))
        assert (tmp_path / "clicked.png").stat().st_size > 10_000
        # search: typing a composite's name highlights its box and the ops it claimed before apply
        hits = browser.evaluate("""(() => {
            const s = document.getElementById('search');
            s.value = 'kernel.attention'; s.dispatchEvent(new Event('input'));
            return [document.querySelectorAll('#after g.node.hit').length, document.querySelectorAll('#before g.node.hit').length];
        })()""")
        assert hits == [1, 9]  # scores, scaled, masked, the five ops of the spelled-out softmax, ctx
    finally:
        browser.close()


def test_zoom_buttons_wheel_and_fit(tmp_path):
    """A big model's picture zooms (the buttons, Ctrl+wheel over a panel) and fits its panel."""
    chromium = find_chromium()
    if chromium is None:
        needs.missing("no chromium on this machine (apt-get install -y chromium)")
    from test_viz import layered

    page = tmp_path / "big.html"
    dpl.draw(dpl.parse(layered(12)), ["llm"], sources=False).save(page)
    browser = Browser(chromium)
    try:
        browser.open(page.as_uri())
        size = """(() => {
            const p = document.getElementById('after');
            const s = Array.from(p.querySelectorAll('svg.graph')).find(s => s.getBoundingClientRect().width > 0);
            const r = s.getBoundingClientRect();
            return [r.width, r.height, p.clientWidth, p.clientHeight, Number(s.dataset.w), Number(s.dataset.h)];
        })()"""
        width, height, _, _, w, h = browser.evaluate(size)
        assert (width, height) == (w, h)
        assert browser.evaluate("document.getElementById('zoom-level').textContent") == "100%"
        browser.evaluate("document.getElementById('zoom-in').click()")
        assert browser.evaluate(size)[0] == pytest.approx(w * 1.25, abs=1)
        assert browser.evaluate("document.getElementById('zoom-level').textContent") == "125%"
        browser.evaluate("document.getElementById('zoom-out').click()")
        assert browser.evaluate(size)[0] == pytest.approx(w, abs=1)
        # fit: the whole picture inside its panel, no scrolling needed
        browser.evaluate("document.getElementById('zoom-fit').click()")
        width, height, panel_w, panel_h, _, _ = browser.evaluate(size)
        assert width <= panel_w and height <= panel_h and (width >= panel_w - 20 or height >= panel_h - 60)
        fitted = width
        # Ctrl+wheel over the panel zooms it in; a plain wheel does not zoom
        wheel = """(ctrl => {
            const p = document.getElementById('after'), r = p.getBoundingClientRect();
            p.dispatchEvent(new WheelEvent('wheel', {deltaY: -200, ctrlKey: ctrl, clientX: r.left + 50, clientY: r.top + 50,
                                                     bubbles: true, cancelable: true}));
        })"""
        browser.evaluate(wheel + "(false)")
        assert browser.evaluate(size)[0] == pytest.approx(fitted, abs=1)
        browser.evaluate(wheel + "(true)")
        assert browser.evaluate(size)[0] > fitted * 1.2
        browser.evaluate("document.getElementById('zoom-reset').click()")
        assert browser.evaluate(size)[0] == pytest.approx(w, abs=1)
    finally:
        browser.close()
