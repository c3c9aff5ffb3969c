"""Named sources by plug-in (opsnn_quant/sources.py): the library names no provider; a
provider may say a model's family, else it is guessed from the model's directory."""

from __future__ import annotations

import json

from opsnn_quant import sources
from opsnn_quant.models import guess_family
from opsnn_quant.sources import resolve_source


class _Store:
    """A team's model store: one pipeline directory, no family method."""

    def __init__(self, root):
        self.root = root

    def model_names(self):
        return ["dit"]

    def model_dir(self, name):
        return self.root / name

    def records(self, name, limit):
        return []


def test_the_zoo_says_its_families_without_building_a_directory():
    assert [guess_family(resolve_source(f"zoo:{n}")) for n in ("shapes-t2i", "shapes-dit", "whisper-tiny-en")] == [
        "diffusers-sd", "diffusers-dit", "whisper"
    ]  # fmt: skip


def test_a_provider_that_does_not_say_is_guessed_from_its_directory(tmp_path, monkeypatch):
    (tmp_path / "dit").mkdir()
    index = {"_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers", "X"],
             "unet": [None, None]}  # fmt: skip
    (tmp_path / "dit" / "model_index.json").write_text(json.dumps(index))
    monkeypatch.setattr(sources, "providers", lambda: {"store": _Store(tmp_path)})
    assert sources.named_family(resolve_source("store:dit")) is None
    assert guess_family(resolve_source("store:dit")) == "diffusers-dit"
