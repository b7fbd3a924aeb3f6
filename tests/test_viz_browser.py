"""The HTML picture in a real browser (headless Chromium): it loads without errors, a click
on a fused group shows the group's IR, the pattern that claimed it and its generated C kernel
source; the search box finds a node. Needs Debian's ``chromium`` (skips locally without it,
fails under CI)."""

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
