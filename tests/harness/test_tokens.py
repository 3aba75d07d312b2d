"""``TextTokenizer``: the class ``AutoTokenizer`` picked, recorded, then loaded directly (no torch import)."""

import json
import shutil
import subprocess
import sys

from harness.core.models import resolve_model
from harness.core.tokens import BACKEND, TextTokenizer
from tests.conftest import ROOT, compose

MESSAGES = [{"role": "user", "content": "Say hello in French. ünïcødé ✓"}]


def test_the_recorded_class_loads_the_same_tokenizer_as_auto_tokenizer_without_torch(tmp_path):
    tiny = resolve_model(dict(compose().model), sys.executable)["local_dir"]
    model = shutil.copytree(tiny, tmp_path / "tiny")   # a folder of its own: its own record
    classes = tmp_path / "classes"
    first = TextTokenizer(model, classes)   # through AutoTokenizer, which records its choice
    [record] = classes.glob("*.json")
    assert json.loads(record.read_text())["class"] == BACKEND
    probe = ("import sys; from pathlib import Path; from harness.core.tokens import TextTokenizer; "
             f"t = TextTokenizer(Path({str(model)!r}), Path({str(classes)!r})); "
             f"print(t.encode('Once upon a time ✓'), t.encode_chat({MESSAGES!r}), type(t._tok).__name__, "
             "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout.strip()
    assert out == (f"{first.encode('Once upon a time ✓')} {first.encode_chat(MESSAGES)} TokenizersBackend False"), \
        "the same ids as AutoTokenizer's, and torch never imported"
    ids = first.encode("Once upon a time")
    assert TextTokenizer(model, classes).decode(ids) == first.decode(ids)

    config = model / "tokenizer_config.json"
    config.write_text(config.read_text().replace("TokenizersBackend", "PreTrainedTokenizerFast"))
    TextTokenizer(model, classes)
    assert len(list(classes.glob("*.json"))) == 2, "a changed tokenizer config is a new key: AutoTokenizer again"
