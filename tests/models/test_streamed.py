"""Streamed loading under ``--max-memory`` (issue 43 §5): the denoiser of a pipeline and a Whisper
model are built on the meta device and their blocks written to the offload files straight from
the model's safetensors; the model then equals the one loaded whole, tensor for tensor."""

from __future__ import annotations

import torch

from opsnn_quant.models import load_adapter
from opsnn_quant.models.offload import offload_of, resident
from tests.tiny_pipelines import save_tiny_sd3, save_tiny_whisper


def _same_model(whole: torch.nn.Module, streamed: torch.nn.Module) -> None:
    with resident(streamed):
        a, b = whole.state_dict(), streamed.state_dict()
        assert a.keys() == b.keys()
        assert [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])] == []
        ba, bb = dict(whole.named_buffers()), dict(streamed.named_buffers())
        assert ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
        grads = {n: p.requires_grad for n, p in whole.named_parameters()}
        assert grads == {n: p.requires_grad for n, p in streamed.named_parameters()}


def _config(module: torch.nn.Module) -> dict:
    config = module.config  # diffusers: a FrozenDict; transformers: a PretrainedConfig
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def test_a_streamed_pipeline_equals_the_whole_load(tmp_path, monkeypatch):
    from opsnn_quant.models import streamed

    save_tiny_sd3(tmp_path / "pipe")
    built: list[str] = []
    for kind in ("diffusers_skeleton", "transformers_skeleton"):
        make = getattr(streamed, kind)

        def record(cls, *a, _make=make, **k):
            source = _make(cls, *a, **k)
            built.append(cls.__name__ if source is not None else f"not {cls.__name__}")
            return source

        monkeypatch.setattr(streamed, kind, record)
    settings = {"steps": 2, "height": 16, "width": 16}
    whole = load_adapter("diffusers-dit", str(tmp_path / "pipe"), **settings)
    assert built == []
    capped = load_adapter("diffusers-dit", str(tmp_path / "pipe"), max_memory=128 << 10, **settings)
    # every model of the pipeline built on the meta device, its tensors streamed
    assert sorted(built) == [
        "AutoencoderKL", "CLIPTextModelWithProjection", "CLIPTextModelWithProjection",
        "SD3Transformer2DModel", "T5EncoderModel",
    ]  # fmt: skip
    off = offload_of(capped.model)
    assert off is not None and "transformer.transformer_blocks.1" in off.offloaded
    assert "text_encoder_3.encoder.block.1" in off.offloaded
    blocks = capped.pipe.transformer.transformer_blocks
    assert all(t.device.type == "meta" for t in blocks.parameters())
    for name, component in whole.model.named_children():
        mine = getattr(capped.pipe, name)
        assert _config(mine) == _config(component), name
        assert mine.training is component.training is False
    _same_model(whole.model, capped.model)
    off.release()


def test_a_streamed_whisper_equals_the_whole_load(tmp_path):
    save_tiny_whisper(tmp_path / "w")
    whole = load_adapter("whisper", str(tmp_path / "w"), max_new_tokens=8)
    capped = load_adapter("whisper", str(tmp_path / "w"), max_new_tokens=8, max_memory=1)
    off = offload_of(capped.model)
    assert off is not None and off.offloaded == ["model.encoder.layers.0", "model.decoder.layers.0"]
    m = capped.model
    assert m.proj_out.weight is m.model.decoder.embed_tokens.weight  # tied, as from_pretrained
    assert m.config.to_dict() == whole.model.config.to_dict()
    assert m.generation_config.to_dict() == whole.model.generation_config.to_dict()
    _same_model(whole.model, m)
    off.release()


def test_a_view_of_an_offloaded_block_is_read_again_from_its_file(tmp_path):
    from opsnn_quant.models.offload import BlockOffload, window
    from tests.models.test_offload import Net

    torch.manual_seed(0)
    net = Net()
    want = net.blocks[1].fc.weight.detach().clone()
    off = BlockOffload(net, budget=1, directory=tmp_path)
    with window(net):
        off.touch("blocks.1.fc")
        view = net.blocks[1].fc.weight.t()[2:5]  # a strided view of the live weight
        make = off.deferred(view)
        assert make is not None and off.deferred(torch.ones(3)) is None
        expected = view.contiguous()
        del view
    assert net.blocks[1].fc.weight.device.type == "meta"  # closed: read from the file
    assert torch.equal(make(), expected) and torch.equal(expected, want.t()[2:5])
    assert torch.equal(off.stored("blocks.1.fc.weight"), want)
    with off.opened("blocks.2.fc"):
        assert net.blocks[2].fc.weight.device.type == "cpu"
    assert net.blocks[2].fc.weight.device.type == "meta"
    off.release()


def test_a_model_that_cannot_be_built_on_meta_loads_whole_and_is_offloaded(tmp_path, monkeypatch):
    from opsnn_quant.models import streamed

    save_tiny_whisper(tmp_path / "w")
    whole = load_adapter("whisper", str(tmp_path / "w"), max_new_tokens=8)

    def fails() -> None:
        raise RuntimeError("an __init__ that reads its weights")

    real = streamed._built
    calls: list[object] = []

    def built(make, *args):
        calls.append(make)
        return real(fails, *args)  # logged, None: the whole load

    monkeypatch.setattr(streamed, "_built", built)
    capped = load_adapter("whisper", str(tmp_path / "w"), max_new_tokens=8, max_memory=1)
    off = offload_of(capped.model)
    assert off is not None and off.offloaded == ["model.encoder.layers.0", "model.decoder.layers.0"]
    _same_model(whole.model, capped.model)
    assert len(calls) >= 1
    off.release()
