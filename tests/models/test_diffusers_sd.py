"""diffusers-sd adapter on a tiny random-config StableDiffusionPipeline loaded from disk."""

import numpy as np
import pytest

from opsnn_quant.errors import CalibrationError, ModelLoadError
from opsnn_quant.models import guess_family, load_adapter
from opsnn_quant.sources import resolve_source
from opsnn_quant.types import Modality
from tests.tiny_pipelines import save_tiny_sd

pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def tiny_sd(tmp_path_factory):
    return save_tiny_sd(tmp_path_factory.mktemp("tiny-sd") / "pipe")


def test_loads_names_and_modalities(tiny_sd):
    assert guess_family(resolve_source(str(tiny_sd))) == "diffusers-sd"
    adapter = load_adapter("diffusers-sd", str(tiny_sd), steps=2, batch_size=2)
    names = {n for n, _ in adapter.model.named_modules()}
    assert "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q" in names
    assert adapter.modality_of("unet.down_blocks.0.resnets.0.conv1") == Modality.DENOISER
    assert (
        adapter.modality_of("text_encoder.text_model.encoder.layers.0.mlp.fc1")
        == Modality.TEXT_ENCODER
    )
    assert adapter.modality_of("vae.decoder.conv_out") == Modality.IMAGE_DECODER
    assert adapter.modality_of("vae.post_quant_conv") == Modality.IMAGE_DECODER
    assert adapter.modality_of("vae.encoder.conv_in") == Modality.OTHER
    assert adapter.roots()["unet"] == Modality.DENOISER


def test_forward_loop_runs_every_timestep_and_generate_is_seeded(tiny_sd):
    adapter = load_adapter("diffusers-sd", str(tiny_sd), steps=3, batch_size=2, guidance_scale=4.0)
    calls = []
    h = adapter.model.unet.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[0]))
    adapter.forward_loop(["a red circle", "a blue square", "a green circle"])(adapter.model)
    h.remove()
    # 2 batches (2 + 1 prompts) x 3 steps, classifier-free guidance doubles the batch
    assert calls == [4, 4, 4, 2, 2, 2]
    a = adapter.generate(["a red circle", "a blue square"], seed=5)
    b = adapter.generate(["a red circle", "a blue square"], seed=5)
    assert a[0].dtype == np.uint8 and a[0].shape == (16, 16, 3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    c = adapter.generate(["a red circle"], seed=6)
    assert not np.array_equal(a[0], c[0])


def test_bad_input(tiny_sd, tmp_path):
    with pytest.raises(ModelLoadError, match=r"no model_index\.json"):
        load_adapter("diffusers-sd", str(tmp_path))
    with pytest.raises(ModelLoadError, match="unknown model family"):
        load_adapter("llama", str(tiny_sd))
    adapter = load_adapter("diffusers-sd", str(tiny_sd), steps=1)
    with pytest.raises(CalibrationError, match="sample 1 has an empty prompt"):
        adapter.forward_loop(["a red circle", "  "])


def test_the_pipeline_is_loaded_in_the_dtype_and_placed_on_the_device(tmp_path, monkeypatch):
    # bfloat16 on the CPU here; the device goes through resolve_device -> adapter.place (a
    # recording stand-in checks the pipeline is moved as a whole, its execution device too).
    import torch

    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.diffusers_sd import DiffusersSDAdapter
    from tests.tiny_pipelines import save_tiny_sd

    save_tiny_sd(tmp_path / "pipe")
    moved = []
    real_place = DiffusersSDAdapter.place

    def place(self, device):
        moved.append(device)
        real_place(self, device)

    monkeypatch.setattr(DiffusersSDAdapter, "place", place)
    adapter = load_adapter("diffusers-sd", str(tmp_path / "pipe"), dtype="bfloat16", steps=1)
    assert moved == [torch.device("cpu")]
    dtypes = {p.dtype for p in adapter.model.parameters()}
    assert dtypes == {torch.bfloat16}
    assert adapter.device == torch.device("cpu")


def test_a_forward_loop_runs_the_pipeline_of_the_model_it_is_given(tiny_sd):
    # ModelOpt's contract: forward_loop(model) runs *model*. One adapter's loop given another
    # adapter's model (a second copy) runs that copy's pipeline, not its own.
    import torch

    from opsnn_quant.errors import ConfigError

    ad1 = load_adapter("diffusers-sd", str(tiny_sd), steps=2, batch_size=2)
    ad2 = load_adapter("diffusers-sd", str(tiny_sd), steps=2, batch_size=2)
    calls = {1: 0, 2: 0}
    hooks = [
        ad.model.unet.register_forward_pre_hook(
            lambda m, a, k=k: calls.__setitem__(k, calls[k] + 1)
        )
        for k, ad in ((1, ad1), (2, ad2))
    ]
    ad1.forward_loop(["a red circle"])(ad2.model)
    for h in hooks:
        h.remove()
    assert calls[1] == 0 and calls[2] == 2  # one UNet call per step (guidance batched), 2 steps
    with pytest.raises(ConfigError, match=r"pass an adapter's \.model"):
        ad1.forward_loop(["a red circle"])(torch.nn.Linear(2, 2))
