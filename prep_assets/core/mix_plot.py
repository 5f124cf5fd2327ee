"""A mix's planned vs achieved tokens per phase and bucket as a small bar chart PNG (written with zlib, no image
library): the same plan gives the same bytes. Phases left to right; in each, per bucket a grey bar (planned) beside
a coloured one (achieved); the caption (`plot_caption`) names the colours."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np

PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75))
PLANNED = (170, 170, 170)
_BAR, _GAP, _PHASE_GAP, _HEIGHT, _MARGIN = 14, 3, 24, 160, 8


def png(pixels: np.ndarray) -> bytes:
    """An RGB image (H, W, 3 uint8) as PNG bytes (8-bit truecolour, no filter, zlib level 9)."""
    h, w, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def plot_mix(mix: dict[str, Any]) -> bytes:
    """The chart of `mix` (a plan from `plan_mix`): bar heights are tokens over the largest planned or achieved."""
    buckets = list(mix.get("bucket_order", mix["sources"]))
    phases = mix["phases"]
    group = len(buckets) * (2 * _BAR + _GAP) + _GAP
    width = 2 * _MARGIN + len(phases) * group + (len(phases) - 1) * _PHASE_GAP
    image = np.full((_HEIGHT + 2 * _MARGIN, width, 3), 255, dtype=np.uint8)
    figures = [(p["buckets"][b]["demanded_tokens"], p["buckets"][b]["row_tokens"]) for p in phases for b in buckets]
    top = max([v for pair in figures for v in pair] + [1])
    base = _MARGIN + _HEIGHT
    image[base, _MARGIN : width - _MARGIN] = 0  # the axis
    for pi, phase in enumerate(phases):
        x = _MARGIN + pi * (group + _PHASE_GAP) + _GAP
        for bi, b in enumerate(buckets):
            figures_b = phase["buckets"][b]
            for k, (value, colour) in enumerate(
                ((figures_b["demanded_tokens"], PLANNED), (figures_b["row_tokens"], PALETTE[bi % len(PALETTE)]))
            ):
                h = round(_HEIGHT * value / top)
                left = x + k * _BAR
                image[base - h : base, left : left + _BAR - 1] = colour
            x += 2 * _BAR + _GAP
    return png(image)


def plot_caption(mix: dict[str, Any]) -> str:
    buckets = list(mix.get("bucket_order", mix["sources"]))
    colours = ", ".join(
        f"{b} `#{''.join(f'{c:02x}' for c in PALETTE[i % len(PALETTE)])}`" for i, b in enumerate(buckets)
    )
    phases = ", ".join(p["name"] for p in mix["phases"])
    return (
        f"Planned (grey) vs achieved tokens (rows × max_seq_len) per bucket, phases left to right ({phases}); "
        f"achieved bars: {colours}."
    )
