"""Shared fixtures: a tiny random-config CLIP (same classes as the shapes CLIP) and images."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from opsnn_quant.zoo.tokenizer_shapes import _bytes_to_unicode


def write_char_tokenizer(directory: Path) -> Path:
    """A CLIP BPE vocabulary without merges: any text tokenizes character by character."""
    syms = list(_bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(syms)}
    for s in syms:
        vocab[s + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    return directory


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """(CLIPModel, CLIPProcessor): 32×32 images, mean/std 0.5 like the shapes CLIP."""
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTokenizer,
    )

    d = write_char_tokenizer(tmp_path_factory.mktemp("tok"))
    tok = CLIPTokenizer(str(d / "vocab.json"), str(d / "merges.txt"), model_max_length=32)
    bos = tok.convert_tokens_to_ids("<|startoftext|>")
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    text = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": eos,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    images = CLIPImageProcessor(
        do_resize=True,
        size={"shortest_edge": 32},
        do_center_crop=True,
        crop_size={"height": 32, "width": 32},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = CLIPProcessor(image_processor=images, tokenizer=tok)
    return model.eval(), processor


def random_images(n: int, size: int = 32, seed: int = 0) -> np.ndarray:
    """Smooth random uint8 NHWC images (blobs, not white noise, so SSIM is meaningful)."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (n, 4, 4, 3))
    img = np.kron(coarse, np.ones((1, size // 4, size // 4, 1)))
    img += rng.normal(0, 8, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def zoo_model(name: str) -> Any:
    """A zoo model; the in-tree zoo is part of the repository, so a broken one fails the test."""
    from opsnn_quant import zoo

    return zoo.load(name)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Run these tests single-threaded: the models here are tiny, and on a busy 2-core machine
    the intra-op thread pool's synchronisation costs ~50x the work (0.26 s vs 5 ms measured for
    one tiny CLIP image forward)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
