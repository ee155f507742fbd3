"""The plots are small palette PNGs that keep matplotlib's colours (the quantizer may move a channel by one level)."""

from __future__ import annotations

from PIL import Image

from bench.report.plots import COLORS, DPI, pyplot, save


def test_plots_are_written_as_palette_pngs_keeping_their_colours(tmp_path):
    _, plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar([0, 1], [1.0, 2.0], color=["C0", "C1"])
    ax.plot([0, 1], [2.0, 1.0], color="C2")
    path = save(fig, tmp_path / "p.png")
    image = Image.open(path)
    assert image.format == "PNG" and image.mode == "P" and image.size == (4 * DPI, 3 * DPI)
    assert not plt.get_fignums()  # closed
    assert "Software" not in image.info  # no matplotlib metadata
    colors = [rgb for _, rgb in image.convert("RGB").getcolors(COLORS)]
    for want in ((31, 119, 180), (255, 127, 14), (255, 255, 255)):  # C0, C1 and the background: kept to 1 level
        assert any(max(abs(a - b) for a, b in zip(want, rgb)) <= 1 for rgb in colors), want
