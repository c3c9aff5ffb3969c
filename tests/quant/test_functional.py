import numpy as np
import torch

from opsnn_quant.quant.functional import quantize_weight_per_channel


def test_weight_per_channel_against_numpy_across_row_blocks():
    # 2100 x 1024: row blocks of 1024 rows -> 3 blocks, the last one short; row 5 all zero.
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2100, 1024, generator=g) * torch.rand(2100, 1, generator=g)
    w[5] = 0.0
    q, s = quantize_weight_per_channel(w)
    wn = w.numpy().astype(np.float64)
    s_np = np.abs(wn).max(axis=1) / 127.0
    s_np[s_np == 0] = 1.0
    np.testing.assert_allclose(s.numpy(), s_np, rtol=1e-6)
    q_np = np.clip(np.rint(w.numpy() / s.numpy()[:, None]), -128, 127).astype(np.int8)
    assert q.dtype == torch.int8 and np.array_equal(q.numpy(), q_np)
    assert not q[5].any() and float(s[5]) == 1.0
