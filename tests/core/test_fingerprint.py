"""``opsnn_quant.core.fingerprint``: the same data gives the same digest in another process and at
another address; any changed value changes it."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import torch
from PIL import Image

from opsnn_quant.core.fingerprint import data_fingerprint


def _records(red: int = 200) -> list[dict]:
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    pixels[..., 0] = red
    return [{"prompt": "a red square", "image": Image.fromarray(pixels),
             "audio": torch.arange(6, dtype=torch.float32), "tags": ["a", 1]}]  # fmt: skip


def test_images_and_tensors_count_by_content_not_by_address():
    a, b = _records(), _records()
    assert a[0]["image"] is not b[0]["image"]
    assert data_fingerprint(a) == data_fingerprint(b)
    assert data_fingerprint(_records(red=201)) != data_fingerprint(a)  # one pixel channel
    changed = _records()
    changed[0]["audio"][5] = 5.5
    assert data_fingerprint(changed) != data_fingerprint(a)
    changed = _records()
    changed[0]["tags"] = ["a", 2]
    assert data_fingerprint(changed) != data_fingerprint(a)


def test_a_text_record_digest_is_the_hand_computed_one():
    # key, NUL, repr of the value, NUL, then the record separator \\1 (module docstring)
    expected = hashlib.sha256(b"prompt\0'a cat'\0\1").hexdigest()
    assert data_fingerprint([{"prompt": "a cat"}]) == expected


def test_the_digest_is_the_same_in_another_process():
    code = (
        "from tests.core.test_fingerprint import _records;"
        "from opsnn_quant.core.fingerprint import data_fingerprint;"
        "print(data_fingerprint(_records()))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip()  # fmt: skip
    assert other == data_fingerprint(_records())
