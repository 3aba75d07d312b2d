"""Synthetic images, drawn locally and stored as PNG files named by their content digest."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from PIL import Image


class ImagePool:
    """Draws new images or repeats earlier ones, all from the caller's RNG."""

    def __init__(self, directory: Path, width: int, height: int, rng: np.random.Generator):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.width, self.height, self.rng = width, height, rng
        self.drawn: list[str] = []

    def draw(self, duplicate_rate: float) -> str:
        """A path: a repeat of an earlier image with probability ``duplicate_rate``, else a new one."""
        if self.drawn and self.rng.random() < duplicate_rate:
            return self.drawn[int(self.rng.integers(0, len(self.drawn)))]
        path = self._save(self._render())
        self.drawn.append(path)
        return path

    def _render(self) -> Image.Image:
        """A smooth colour gradient plus a few rectangles: cheap, and distinct per draw."""
        h, w = self.height, self.width
        y, x = np.mgrid[0:h, 0:w]
        base = self.rng.integers(0, 256, size=3)
        slope = self.rng.uniform(-1.0, 1.0, size=(3, 2))
        pixels = np.stack([base[c] + slope[c, 0] * x + slope[c, 1] * y for c in range(3)], axis=-1)
        for _ in range(3):
            x0, y0 = int(self.rng.integers(0, w)), int(self.rng.integers(0, h))
            pixels[y0: y0 + h // 4, x0: x0 + w // 4] = self.rng.integers(0, 256, size=3)
        return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")

    def _save(self, image: Image.Image) -> str:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data = buffer.getvalue()
        path = self.directory / f"{hashlib.sha256(data).hexdigest()}.png"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return str(path)
