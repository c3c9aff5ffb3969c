"""CLIP score through torchmetrics on a local CLIP vs a hand computation."""

from __future__ import annotations

import pytest
import torch

from opsnn_quant.errors import InputError, ModelLoadError
from opsnn_quant.evaluation.clip_score import ClipScorer, TensorCLIP, load_local_clip
from tests.evaluation.conftest import random_images, zoo_model

PROMPTS = ["a red circle", "blue square", "two green triangles", "a big yellow star", "x"]


def _hand_cosines(model, processor, images, prompts) -> torch.Tensor:
    # Independent path: normalise pixels by hand ((x/255 - 0.5) / 0.5, already 32×32), tokenize
    # each prompt alone (no padding), cosine of the projected embeddings.
    pix = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    with torch.no_grad():
        img = model.get_image_features(pixel_values=(pix - 0.5) / 0.5).pooler_output
        txt = torch.cat([
            model.get_text_features(**processor.tokenizer(p, return_tensors="pt")).pooler_output
            for p in prompts
        ])  # fmt: skip
    return torch.nn.functional.cosine_similarity(img, txt)


def test_matches_hand_computation_with_clamp(tiny_clip):
    model, processor = tiny_clip
    images = random_images(len(PROMPTS), seed=11)
    cos = _hand_cosines(model, processor, images, PROMPTS)
    expected_each = (100 * cos.clamp(min=0)).tolist()
    result = ClipScorer(model, processor, "tiny").score(images, PROMPTS)
    assert result.n == len(PROMPTS) and result.model == "tiny"
    assert result.per_image == pytest.approx(expected_each, abs=1e-3)
    assert result.mean == pytest.approx(sum(expected_each) / len(expected_each), abs=1e-3)


def test_negative_cosine_is_clamped_per_image(tiny_clip):
    """An image/prompt pair with cos < 0 scores 0, not negative (torchmetrics' clamp).

    The negative case is built, not searched for: negating the text projection negates every
    text embedding and so every cosine; of a pair and its negated-model twin, one is negative.
    """
    import copy

    model, processor = tiny_clip
    images = random_images(2, seed=12)
    prompts = PROMPTS[:2]
    flipped = copy.deepcopy(model)
    with torch.no_grad():
        flipped.text_projection.weight.neg_()
    cos = _hand_cosines(model, processor, images, prompts)
    cos_flipped = _hand_cosines(flipped, processor, images, prompts)
    assert torch.allclose(cos_flipped, -cos, atol=1e-6) and bool((cos != 0).all())
    for m, c in ((model, cos), (flipped, cos_flipped)):
        result = ClipScorer(m, processor, "tiny").score(images, prompts)
        for got, want in zip(result.per_image, c.tolist(), strict=True):
            if want < 0:
                assert got == 0.0
            else:
                assert got == pytest.approx(100 * want, abs=1e-3)


def test_wrapper_returns_tensors(tiny_clip):
    model, processor = tiny_clip
    wrapped = TensorCLIP(model)
    ids = processor.tokenizer(["a b"], return_tensors="pt")
    out = wrapped.get_text_features(ids["input_ids"], ids["attention_mask"])
    assert isinstance(out, torch.Tensor) and out.shape == (1, 16)
    assert model.config.text_config.max_position_embeddings == 32
    assert wrapped.config is model.config


def test_errors(tiny_clip, tmp_path):
    model, processor = tiny_clip
    scorer = ClipScorer(model, processor, "tiny")
    with pytest.raises(InputError, match="2 images but 1 prompts"):
        scorer.score(random_images(2), ["a"])
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_local_clip(tmp_path)


def test_from_local_directory(tiny_clip, tmp_path):
    model, processor = tiny_clip
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    images = random_images(2, seed=13)
    a = ClipScorer(model, processor, "tiny").score(images, PROMPTS[:2])
    b = ClipScorer.from_dir(tmp_path).score(images, PROMPTS[:2])
    assert b.model == tmp_path.name
    assert b.per_image == pytest.approx(a.per_image, abs=1e-4)


def test_zoo_shapes_clip_prefers_true_caption():
    model = zoo_model("shapes-clip")
    from opsnn_quant.zoo.shapes_clip import load_shapes_clip_processor
    from opsnn_quant.zoo.shapes_data import generate

    images, captions, _ = generate("eval", 8, seed=0)
    scorer = ClipScorer(model, load_shapes_clip_processor(), "shapes-clip")
    right = scorer.score(images, list(captions)).mean
    wrong = scorer.score(images, [*captions[1:], captions[0]]).mean
    assert right > wrong
