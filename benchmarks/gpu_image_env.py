"""An interpreter with only the GPU image's packages, to rehearse ``gpu_first_contact.py`` on a CPU.

The device machine's image holds the packages in ``benchmarks/data/gpu_image_packages.txt`` (torch, transformers,
pandas..., not hydra-core, omegaconf or antlr4). This makes a venv (no pip of its own) whose site folder links
this environment's distributions of those names and of their required dependencies (the image installed its own
versions' dependencies), and nothing else: there, troughput's driver imports fail as they would on the GPU
machine until the carried wheels are installed. Versions are this environment's, not the image's.

    .venv/bin/python benchmarks/gpu_image_env.py /tmp/gpuimg     # prints the interpreter to run the script with
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

LIST = Path(__file__).resolve().parent / "data" / "gpu_image_packages.txt"


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_names(listing: Path = LIST) -> set[str]:
    return {normalise(line) for line in listing.read_text().split("\n") if line.strip() and not line.startswith("#")}


def with_dependencies(names: set[str], installed: dict[str, metadata.Distribution]) -> set[str]:
    """``names`` installed here, and every distribution they require (no extras), transitively."""
    from packaging.requirements import Requirement

    chosen, todo = set(), [n for n in names if n in installed]
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        chosen.add(name)
        for text in installed[name].requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo += [normalise(requirement.name)] if normalise(requirement.name) in installed else []
    return chosen


def make(folder: Path) -> Path:
    """The venv in ``folder``; returns its interpreter."""
    installed = {normalise(d.metadata["Name"]): d for d in metadata.distributions()}
    site = folder / "site"
    site.mkdir(parents=True, exist_ok=True)
    for name in sorted(with_dependencies(image_names(), installed)):
        dist = installed[name]
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source, link = Path(dist.locate_file(top)), site / top
            if source.exists() and top != "__pycache__" and not top.endswith(".pth") and not link.exists():
                link.symlink_to(source)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (folder / "venv" / "lib" / version / "site-packages" / "gpu_image.pth").write_text(f"{site}\n")
    return folder / "venv" / "bin" / "python"


if __name__ == "__main__":
    print(make(Path(sys.argv[1])))
