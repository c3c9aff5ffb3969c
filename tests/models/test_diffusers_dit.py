"""diffusers-dit adapter on tiny random-config SD3 / FLUX / PixArt / Wan pipelines loaded from disk."""

import json

import numpy as np
import pytest

from opsnn_quant.core.timesteps import current_step
from opsnn_quant.errors import ConfigError, ModelLoadError
from opsnn_quant.models import guess_family, load_adapter
from opsnn_quant.policy.targets import get_target
from opsnn_quant.sources import resolve_source
from opsnn_quant.types import Modality
from tests.tiny_pipelines import (
    save_tiny_flux,
    save_tiny_pixart,
    save_tiny_sd,
    save_tiny_sd3,
    save_tiny_wan,
)

pytest.importorskip("diffusers")

TE, DEN, IMG, OTHER = (
    Modality.TEXT_ENCODER,
    Modality.DENOISER,
    Modality.IMAGE_DECODER,
    Modality.OTHER,
)
BUILDERS = {
    "sd3": save_tiny_sd3,
    "flux": save_tiny_flux,
    "pixart": save_tiny_pixart,
    "pixart-sigma": lambda p: save_tiny_pixart(p, sigma=True),
    "wan": save_tiny_wan,
}
SIZE = {"height": 16, "width": 16, "max_sequence_length": 16}
# Per pipeline: its class, text encoders (each a root), one real dotted module name per
# modality (from the diffusers / transformers class definitions).
EXPECTED = {
    "sd3": (
        "StableDiffusion3Pipeline",
        ["text_encoder", "text_encoder_2", "text_encoder_3"],
        {
            "transformer.transformer_blocks.1.attn.add_q_proj": DEN,  # joint attention, text side
            "text_encoder_3.encoder.block.0.layer.1.DenseReluDense.wi_0": TE,  # T5 gated GELU
            "text_encoder_2.text_model.encoder.layers.0.mlp.fc1": TE,
            "vae.decoder.conv_out": IMG,
            "vae.encoder.conv_in": OTHER,
        },
    ),
    "flux": (
        "FluxPipeline",
        ["text_encoder", "text_encoder_2"],
        {
            "transformer.time_text_embed.guidance_embedder.linear_1": DEN,
            "transformer.single_transformer_blocks.0.proj_mlp": DEN,
            "text_encoder_2.encoder.block.1.layer.0.SelfAttention.q": TE,
            "vae.decoder.conv_out": IMG,
        },
    ),
    "pixart": (
        "PixArtAlphaPipeline",
        ["text_encoder"],
        {
            "transformer.transformer_blocks.1.attn2.to_k": DEN,
            "transformer.caption_projection.linear_1": DEN,
            "text_encoder.encoder.block.0.layer.0.SelfAttention.q": TE,
            "vae.post_quant_conv": IMG,
        },
    ),
    "pixart-sigma": (
        "PixArtSigmaPipeline",
        ["text_encoder"],
        {"transformer.adaln_single.linear": DEN, "vae.decoder.conv_in": IMG},
    ),
    "wan": (
        "WanPipeline",
        ["text_encoder"],
        {
            "transformer.blocks.1.attn2.to_k": DEN,
            "transformer.condition_embedder.text_embedder.linear_1": DEN,
            "text_encoder.encoder.block.0.layer.1.DenseReluDense.wo": TE,
            "vae.decoder.conv_out": IMG,
            "vae.post_quant_conv": IMG,
            # kept float: it reads its own parameters' dtype (see PipelineSpec.keep_float)
            "transformer.condition_embedder.time_embedder.linear_1": OTHER,
        },
    ),
}


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-dit")
    return {name: build(root / name) for name, build in BUILDERS.items()}


def _load(pipes, name, **settings):
    video = {"num_frames": 5} if name == "wan" else {}
    return load_adapter("diffusers-dit", str(pipes[name]), **{**SIZE, **video, **settings})


@pytest.mark.parametrize("name", list(BUILDERS))
def test_loads_names_modalities_roots_and_stages(pipes, name):
    cls, encoders, modules = EXPECTED[name]
    assert json.loads((pipes[name] / "model_index.json").read_text())["_class_name"] == cls
    assert guess_family(resolve_source(str(pipes[name]))) == "diffusers-dit"
    adapter = _load(pipes, name, steps=1)
    names = {n for n, _ in adapter.model.named_modules()}
    for module, modality in modules.items():
        assert module in names, module
        assert adapter.modality_of(module) == modality, module
    assert adapter.roots() == {
        "transformer": DEN,
        "vae.decoder": IMG,
        **{e: TE for e in encoders},
    }
    assert adapter.roots_of(TE) == encoders
    assert adapter.task == ("t2v" if name == "wan" else "t2i")
    assert adapter.primary_modality() == DEN
    assert adapter.stages() == {
        **{e: e for e in encoders},
        "denoise_step": "transformer",
        "vae_decode": "vae.decoder",
    }
    assert adapter.evaluation_inputs([{"prompt": "a red circle"}]) == ["a red circle"]
    adapter.check_prefixes()


def _transformer_calls(adapter):
    calls = []

    def hook(module, args, kwargs):  # PixArt passes the latents by position
        latents = args[0] if args else kwargs["hidden_states"]
        calls.append((latents.shape[0], kwargs, current_step()))

    return calls, adapter.model.transformer.register_forward_pre_hook(hook, with_kwargs=True)


def _clock_outside_the_denoiser(adapter):
    """The step clock each text encoder and VAE decoder call ran under."""
    seen = []
    handles = [
        adapter.model.get_submodule(root).register_forward_pre_hook(
            lambda m, a: seen.append(current_step())
        )
        for root in adapter.roots()
        if root != "transformer"
    ]
    return seen, handles


@pytest.mark.parametrize(
    ("name", "guidance", "batches"),
    [
        # classifier-free guidance doubles the batch (SD3, PixArt) ...
        ("sd3", 4.0, [4, 4, 4, 2, 2, 2]),
        ("pixart", 4.0, [4, 4, 4, 2, 2, 2]),
        # ... FLUX.1-dev embeds its guidance instead: one pass per step ...
        ("flux", 3.5, [2, 2, 2, 1, 1, 1]),
        # ... Wan runs the conditional and unconditional passes one after the other.
        ("wan", 5.0, [2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1]),
    ],
)
def test_forward_loop_runs_every_step_of_the_pipeline_sampler(pipes, name, guidance, batches):
    adapter = _load(pipes, name, steps=3, batch_size=2, guidance_scale=guidance)
    calls, handle = _transformer_calls(adapter)
    outside, handles = _clock_outside_the_denoiser(adapter)
    adapter.forward_loop(["a red circle", "a blue square", "a green circle"])(adapter.model)
    for h in [handle, *handles]:
        h.remove()
    assert [b for b, _, _ in calls] == batches
    # The step clock (w8a8_timestep): step i for every transformer call of step i, the two
    # halves of Wan's guidance included; None for the text encoders and the VAE; None after.
    per_step = len(batches) // 6
    assert [s for _, _, s in calls] == [i for i in range(3) for _ in range(per_step)] * 2
    assert outside and set(outside) == {None} and current_step() is None
    timesteps = [float(kw["timestep"].flatten()[0]) for _, kw, _ in calls]
    per_batch = len(batches) // 2
    assert timesteps[:per_batch] == timesteps[per_batch:]  # every batch sees the same steps
    assert len(set(timesteps[:per_batch])) == 3  # three distinct timesteps
    if name == "flux":
        assert all(float(kw["guidance"].flatten()[0]) == 3.5 for _, kw, _ in calls)


def test_sd3_steps_are_the_flow_matching_schedulers(pipes):
    from diffusers import FlowMatchEulerDiscreteScheduler

    adapter = _load(pipes, "sd3", steps=4, batch_size=1, guidance_scale=1.0)  # no CFG
    calls, handle = _transformer_calls(adapter)
    adapter.forward_loop(["a red circle"])(adapter.model)
    handle.remove()
    expected = FlowMatchEulerDiscreteScheduler.from_pretrained(str(pipes["sd3"] / "scheduler"))
    expected.set_timesteps(4)
    seen = [float(kw["timestep"][0]) for _, kw, _ in calls]
    assert seen == pytest.approx([float(t) for t in expected.timesteps])
    assert [b for b, _, _ in calls] == [1, 1, 1, 1]


@pytest.mark.parametrize("name", ["sd3", "flux", "pixart", "wan"])
def test_generate_is_uint8_seeded_and_deterministic(pipes, name):
    adapter = _load(pipes, name, steps=2, batch_size=2)
    a = adapter.generate(["a red circle", "a blue square"], seed=5)
    b = adapter.generate(["a red circle", "a blue square"], seed=5)
    shape = (5, 16, 16, 3) if name == "wan" else (16, 16, 3)  # Wan: frames per prompt
    assert len(a) == 2 and all(x.dtype == np.uint8 and x.shape == shape for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    c = adapter.generate(["a red circle"], seed=6)
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("name", ["sd3", "flux", "pixart", "wan"])
def test_probe_estimates_every_root_and_the_policy_quantizes_the_transformer(pipes, name):
    import opsnn_quant as oq
    from opsnn_quant.probe.api import ProbeConfig, probe

    adapter = _load(pipes, name, steps=2, batch_size=2)
    loop = adapter.forward_loop(["a red circle", "a blue square"])
    cfg = ProbeConfig(max_root_calls=2, bf16=False, smoothquant_alphas=(0.5,))
    report = probe(adapter, loop, cfg)
    for root, modality in adapter.roots().items():
        under = [
            m
            for m in report.modules
            if m.name.startswith(root + ".") and m.quantizable and m.modality == modality
        ]
        assert under and all(m.e2e is not None for m in under), root
    assert report.modalities["denoiser"].predicted_sqnr_db_all_w8a8 is not None
    prediction = "noise" if name == "pixart" else "velocity"
    assert report.modalities["denoiser"].output == f"transformer {prediction} prediction"
    # The transformer blocks are watched for range (probe/hooks.py RESIDUAL_BLOCKS) ...
    block = {"sd3": "transformer_blocks.1", "flux": "single_transformer_blocks.0"}.get(name)
    if block is not None:
        assert report.module(f"transformer.{block}").fp16 is not None
    # ... and the softmax check reads attentions whose scores the projections give (SD3's
    # joint attention, PixArt's), not those that normalise q/k first (FLUX, Wan).
    softmax = {f.where for f in report.findings if f.kind == "softmax_input"}
    attn = {
        "sd3": "transformer.transformer_blocks.0.attn",
        "flux": "transformer.transformer_blocks.0.attn",
        "pixart": "transformer.transformer_blocks.0.attn2",
        "wan": "transformer.blocks.0.attn1",
    }[name]
    assert (attn in softmax) == (name in ("sd3", "pixart"))
    # The engine holds on each: the policy makes transformer Linears int8, and the quantized
    # pipeline still samples (Wan's time embedding included).
    policy = oq.build_policy(report, oq.Budget(), get_target("ascend910b-atc"))
    oq.quantize(adapter.model, policy, loop)
    int8 = [
        n
        for n, m in adapter.model.named_modules()
        if n.startswith("transformer.") and type(m).__name__ == "QuantLinear"
    ]
    assert int8, "no transformer Linear is int8"
    out = adapter.generate(["a red circle"], seed=0)
    assert out[0].dtype == np.uint8 and out[0].shape[-3:] == (16, 16, 3)


def test_unsupported_class_and_family_mismatch_are_one_clear_line(pipes, tmp_path):
    index = json.loads((pipes["sd3"] / "model_index.json").read_text())
    index["_class_name"] = "HunyuanDiTPipeline"
    (tmp_path / "hy").mkdir()
    (tmp_path / "hy" / "model_index.json").write_text(json.dumps(index))
    supported = (
        "FluxPipeline, PixArtAlphaPipeline, PixArtSigmaPipeline, StableDiffusion3Pipeline, "
        "WanPipeline"
    )
    with pytest.raises(ModelLoadError) as err:
        load_adapter("diffusers-dit", str(tmp_path / "hy"))
    assert "HunyuanDiTPipeline" in str(err.value) and f"supported: {supported}" in str(err.value)
    save_tiny_sd(tmp_path / "sd")
    with pytest.raises(ModelLoadError, match=r"UNet, not a transformer: use family diffusers-sd$"):
        load_adapter("diffusers-dit", str(tmp_path / "sd"))
    with pytest.raises(ModelLoadError, match=r"not a UNet: use family diffusers-dit$"):
        load_adapter("diffusers-sd", str(pipes["sd3"]))
    with pytest.raises(ConfigError, match="num_frames applies to video pipelines only"):
        load_adapter("diffusers-dit", str(pipes["flux"]), num_frames=5)
    with pytest.raises(ConfigError, match=r"height: Input should be a multiple of 16"):
        load_adapter("diffusers-dit", str(pipes["sd3"]), height=24)


def test_unsupported_class_exits_2_from_the_cli(pipes, tmp_path, capsys):
    from opsnn_quant.cli import main

    index = json.loads((pipes["sd3"] / "model_index.json").read_text())
    index["_class_name"] = "SanaPipeline"
    (tmp_path / "sana").mkdir()
    (tmp_path / "sana" / "model_index.json").write_text(json.dumps(index))
    (tmp_path / "p.txt").write_text("a red circle\n")
    args = ["probe", str(tmp_path / "sana"), "--data", str(tmp_path / "p.txt")]
    assert main([*args, "-o", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SanaPipeline" in err[0] and "StableDiffusion3Pipeline" in err[0]
    assert not (tmp_path / "o").exists()


def test_guess_family_of_zoo_names():
    assert guess_family(resolve_source("zoo:shapes-dit")) == "diffusers-dit"
    assert guess_family(resolve_source("zoo:shapes-t2i")) == "diffusers-sd"
    assert guess_family(resolve_source("zoo:whisper-tiny.en")) == "whisper"


def test_pixart_encodes_raw_captions_and_bins_only_where_the_checkpoint_has_bins(pipes):
    # The real checkpoints' latent sizes: 128 (1024 px) has bins for alpha and sigma, 256
    # (2048 px) for sigma only; the tiny pipeline's 8 has none (the pipeline would refuse).
    for name, sizes in (
        ("pixart", {8: False, 128: True, 256: False}),
        ("pixart-sigma", {256: True}),
    ):
        adapter = _load(pipes, name, steps=1)
        for sample_size, binned in sizes.items():
            adapter.pipe.transformer.register_to_config(sample_size=sample_size)
            kwargs = adapter.extra_call_kwargs()
            assert kwargs["use_resolution_binning"] is binned, (name, sample_size)
            assert kwargs["clean_caption"] is False and kwargs["max_sequence_length"] == 16
    assert "clean_caption" not in _load(pipes, "sd3", steps=1).extra_call_kwargs()


def test_the_zoo_dit_loads_without_its_absent_t5():
    # shapes-dit's model_index.json saves text_encoder_3/tokenizer_3 as [null, null]; diffusers
    # refuses the directory unless they are passed as None.
    adapter = load_adapter("diffusers-dit", "zoo:shapes-dit", steps=2)
    assert adapter.pipe.text_encoder_3 is None
    assert adapter.roots() == {"transformer": DEN, "vae.decoder": IMG,
                               "text_encoder": TE, "text_encoder_2": TE}  # fmt: skip
