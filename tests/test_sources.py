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


def test_a_source_is_split_once_and_its_directory_prepared_once(tmp_path, monkeypatch):
    # a command resolves its model source once; every check after it reads the same object
    from opsnn_quant.models import check_model_source, check_weights

    (tmp_path / "dit").mkdir()
    index = {"_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers", "X"]}
    (tmp_path / "dit" / "model_index.json").write_text(json.dumps(index))
    store, prepared = _Store(tmp_path), []
    real_dir = store.model_dir
    monkeypatch.setattr(store, "model_dir", lambda n: prepared.append(n) or real_dir(n))
    monkeypatch.setattr(sources, "providers", lambda: {"store": store})
    source = resolve_source("store:dit")
    assert (source.scheme, source.name, source.named, str(source)) == (
        "store",
        "dit",
        True,
        "store:dit",
    )
    check_model_source(source)
    check_weights(source)
    assert guess_family(source) == "diffusers-dit"
    assert sources.local_paths(source) == [tmp_path / "dit"] and source.path == tmp_path / "dit"
    assert prepared == ["dit"]  # once, on first use
    local = resolve_source(str(tmp_path / "dit"))
    assert not local.named and local.path == tmp_path / "dit" and local.scheme is None
