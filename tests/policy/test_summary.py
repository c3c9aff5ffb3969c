"""The summary rows: module counts and int8 shares of the Linear/Conv2d MACs and of all MACs."""

import dataclasses

import pytest

from opsnn_quant.policy.baselines import naive_policy
from opsnn_quant.policy.summary import int8_mac_share, int8_share_of_all_macs, summarize
from opsnn_quant.policy.targets import get_target
from opsnn_quant.probe.report import ModalitySummary, ModuleSensitivity, SensitivityReport
from opsnn_quant.types import Modality


def _report(counted: bool) -> SensitivityReport:
    # an encoder whose Linears make 300 MACs per call (3 calls: 900 in pass 1) beside 600 MACs
    # of attention products and Conv1d; a decoder of 100 per call (2 calls) and nothing else
    mods = [
        ModuleSensitivity(name="enc.fc1", type="Linear", modality="audio_encoder", calls=3,
                          macs=200),
        ModuleSensitivity(name="enc.fc2", type="Linear", modality="audio_encoder", calls=3,
                          macs=100),
        ModuleSensitivity(name="enc.conv1", type="Conv1d", modality="audio_encoder", calls=3),
        ModuleSensitivity(name="dec.fc", type="Linear", modality="text_decoder", calls=2,
                          macs=100),
    ]  # fmt: skip
    summaries = {
        "audio_encoder": ModalitySummary(
            modality=Modality.AUDIO_ENCODER, modules=3, quantizable=2, overflowing=0,
            median_sqnr_db=None, predicted_sqnr_db_all_w8a8=None, macs=300,
            pass_macs=900 if counted else None, other_macs=600 if counted else None,
        ),
        "text_decoder": ModalitySummary(
            modality=Modality.TEXT_DECODER, modules=1, quantizable=1, overflowing=0,
            median_sqnr_db=None, predicted_sqnr_db_all_w8a8=None, macs=100,
            pass_macs=200 if counted else None, other_macs=0 if counted else None,
        ),
    }  # fmt: skip
    return SensitivityReport(model="m", modules=mods, modalities=summaries)


def test_the_int8_share_of_all_macs_counts_what_stays_float_outside_linear_and_conv2d():
    rep = _report(counted=True)
    assert rep.modalities["audio_encoder"].linear_share == 900 / 1500
    every = naive_policy(rep, get_target("ascend910b-eager"), "all-w8a8-dynamic").resolved(
        rep.inventory()
    )
    rows = {r.modality: r for r in summarize(every, rep)}
    enc, dec = rows[Modality.AUDIO_ENCODER], rows[Modality.TEXT_DECODER]
    assert enc.int8_mac_share == 1.0 and enc.int8_share_of_all_macs == 0.6
    assert dec.int8_mac_share == 1.0 and dec.int8_share_of_all_macs == 1.0
    listed = list(rows.values())
    assert int8_mac_share(rep, listed) == 1.0
    # over the run (pass 1): the encoder's 900 Linear MACs of its 1500, the decoder's 200 of 200
    assert int8_share_of_all_macs(rep, listed) == (900 + 200) / (1500 + 200)
    # the encoder float: the measured share counts one call per modality (the decoder's 100 of
    # 400), the share of all MACs the run (the decoder's 200 of 1700)
    half = [dataclasses.replace(enc, int8_mac_share=0.0), dec]
    assert int8_mac_share(rep, half) == pytest.approx(100 / 400)
    assert int8_share_of_all_macs(rep, half) == pytest.approx(200 / 1700)


def test_without_the_counts_the_share_of_all_macs_is_unknown_not_guessed():
    rep = _report(counted=False)  # a probe.json from before the counts
    every = naive_policy(rep, get_target("ascend910b-eager"), "all-w8a8-dynamic").resolved(
        rep.inventory()
    )
    rows = summarize(every, rep)
    assert all(r.int8_share_of_all_macs is None for r in rows)
    assert int8_share_of_all_macs(rep, rows) is None
    assert rep.modalities["audio_encoder"].linear_share is None
