"""The generated shapes dataset and its tokenizer: determinism, held-out splits, true captions."""

from __future__ import annotations

import numpy as np
import pytest

from opsnn_quant.errors import InputError
from opsnn_quant.zoo import shapes_data as sd


def test_same_seed_same_bytes_and_different_seed_differs():
    a, ca, _ = sd.generate("train", 40, seed=0)
    b, cb, _ = sd.generate("train", 40, seed=0)
    c, _, _ = sd.generate("train", 40, seed=1)
    assert a.tobytes() == b.tobytes() and ca == cb
    assert a.tobytes() != c.tobytes()
    assert (a != c).any(axis=(1, 2, 3)).all()  # every image differs, not just one


def test_samples_do_not_depend_on_how_many_are_drawn():
    full, caps, _ = sd.generate("eval", 12)
    tail, tail_caps, _ = sd.generate("eval", 4, start=8)
    assert np.array_equal(full[8:], tail) and caps[8:] == tail_caps


def test_splits_differ_from_each_other():
    train, _, _ = sd.generate("train", 16)
    calib, _, _ = sd.generate("calibration", 16)
    assert (train != calib).any(axis=(1, 2, 3)).all()


def test_unknown_split_is_an_input_error():
    with pytest.raises(InputError, match="unknown shapes split 'test'") as err:
        sd.load_split("test")
    assert "\n" not in str(err.value)


def test_held_out_triples_never_reach_training():
    assert len(sd.HELD_OUT) == 20
    for split in ("train", "calibration"):
        _, _, labels = sd.generate(split, 1500)
        triples = set(zip(labels["color"], labels["shape"], labels["position"], strict=True))
        two = [i for i, n in enumerate(labels["n_shapes"]) if n == 2]
        triples |= {(labels["color2"][i], labels["shape2"][i], labels["position2"][i]) for i in two}
        assert not triples & sd.HELD_OUT
        # ... while every colour, shape and position is still trained on.
        assert {t[0] for t in triples} == set(sd.COLORS)
        assert {t[1] for t in triples} == set(sd.SHAPES)
        assert {t[2] for t in triples} == set(sd.POSITIONS)
    _, eval_caps, labels = sd.generate("eval", 400)
    first = set(zip(labels["color"], labels["shape"], labels["position"], strict=True))
    assert first <= sd.HELD_OUT and len(first) == len(sd.HELD_OUT)
    _, train_caps, _ = sd.generate("train", 3000)
    assert not set(eval_caps) & set(train_caps)


def test_captions_parse_back_to_the_labels():
    for split in sd.SPLITS:
        _, captions, labels = sd.generate(split, 300)
        for i, caption in enumerate(captions):
            lab = {k: labels[k][i] for k in sd.LABEL_COLUMNS}
            assert sd.caption_fits(caption, lab), caption
            assert sd.parse_caption(caption)[0]["color"] == lab["color"]
            assert len(sd.parse_caption(caption)) == lab["n_shapes"]
    other = {"shape": "star", "color": "red", "size": "small", "position": "center", "n_shapes": 1}
    assert not sd.caption_fits("a red circle", other)
    with pytest.raises(InputError):
        sd.parse_caption("a red banana")


def _nearest_colour(rgb: np.ndarray) -> str:
    names = list(sd.COLORS)
    dist = [np.abs(rgb.astype(int) - np.array(sd.COLORS[n])).sum() for n in names]
    return names[int(np.argmin(dist))]


def test_pixels_agree_with_captions():
    images, _, labels = sd.generate("train", 400)
    areas: dict[tuple[str, str], list[int]] = {}
    for i, image in enumerate(images):
        background = np.median(image.reshape(-1, 3), axis=0)
        mask = np.abs(image.astype(int) - background).max(axis=2) > 60
        rows, cols = np.nonzero(mask)
        if labels["n_shapes"][i] == 2:
            # Corners only: each quadrant holds one shape; its median colour is its caption colour.
            for suffix in ("", "2"):
                r0, c0 = sd.POSITIONS[labels["position" + suffix][i]]
                quad = mask & _quadrant(r0, c0)
                assert (
                    _nearest_colour(np.median(image[quad], axis=0)) == labels["color" + suffix][i]
                )
            continue
        r, c = round(float(rows.mean())), round(float(cols.mean()))
        assert _nearest_colour(image[r, c]) == labels["color"][i]
        r0, c0 = sd.POSITIONS[labels["position"][i]]
        assert abs(r - r0) <= 2 and abs(c - c0) <= 2
        areas.setdefault((labels["shape"][i], labels["size"][i]), []).append(int(mask.sum()))
    for shape in sd.SHAPES:
        assert max(areas[(shape, "small")]) < min(areas[(shape, "large")]), shape


def _quadrant(r0: int, c0: int) -> np.ndarray:
    grid_r, grid_c = np.mgrid[0 : sd.IMAGE_SIZE, 0 : sd.IMAGE_SIZE]
    return ((grid_r < 16) == (r0 < 16)) & ((grid_c < 16) == (c0 < 16))


def test_load_split_columns_and_images(tmp_path):
    import datasets

    ds = sd.load_split("calibration", limit=6)
    assert len(ds) == 6
    assert set(ds.column_names) == {"image", "caption", *sd.LABEL_COLUMNS}
    assert isinstance(ds.features["image"], datasets.Image)
    images, captions, labels = sd.generate("calibration", 6)
    for i, row in enumerate(ds):
        assert row["image"].size == (32, 32) and row["image"].mode == "RGB"
        assert np.array_equal(np.asarray(row["image"]), images[i])  # PNG is lossless
        assert row["caption"] == captions[i] and row["shape"] == labels["shape"][i]
    saved = datasets.load_from_disk(str(sd.save_split("eval", tmp_path / "eval", limit=5)))
    assert saved["caption"] == sd.generate("eval", 5)[1]


def test_load_split_default_size_and_zoo_entry():
    from opsnn_quant import zoo

    assert sd.DEFAULT_SIZES["calibration"] == len(zoo.dataset("shapes", "calibration"))
    # a limit past the split is the whole split, not a generator run of that length (10**11
    # samples asked numpy for 279 TiB)
    assert len(zoo.dataset("shapes", "calibration", limit=10**11)) == 512
    with pytest.raises(InputError):
        sd.load_split("eval", limit=-1)


def test_every_caption_word_is_one_token_and_captions_fit():
    from transformers import CLIPTokenizer

    from opsnn_quant.zoo.tokenizer_shapes import (
        MODEL_MAX_LENGTH,
        check_single_tokens,
        write_tokenizer_files,
    )

    tok = CLIPTokenizer.from_pretrained(str(write_tokenizer_files(_tmp_dir())))
    check_single_tokens(tok)  # raises on failure
    assert tok.model_max_length == MODEL_MAX_LENGTH
    _, captions, _ = sd.generate("train", 500)
    longest = max(captions, key=lambda c: len(c.split()))
    ids = tok(longest)["input_ids"]
    assert len(ids) == len(longest.split()) + 2 <= MODEL_MAX_LENGTH
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == longest
    # Text outside the vocabulary still tokenizes (character by character), never to unk.
    assert tok.unk_token_id not in tok("zebra", add_special_tokens=False)["input_ids"]


def _tmp_dir():
    import tempfile

    return tempfile.mkdtemp(prefix="shapes-tok-")
