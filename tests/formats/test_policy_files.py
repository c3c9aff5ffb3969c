"""Exports: byte-exact golden files per format, node naming checked against a real ONNX export.

The golden files under ``golden/`` were checked by hand against the policy in
``golden/policy.yaml`` and the formats in the AMCT/ATC manuals (URLs in
``opsnn_quant/formats/policy_files.py`` and ``export_atc.py``).
"""

import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from opsnn_quant.errors import ConfigError
from opsnn_quant.formats.atc.precision import load_node_map, torch_scope
from opsnn_quant.formats.policy_files import export_policy, modules_from_model
from opsnn_quant.formats.result import write_export
from opsnn_quant.policy.rule import QuantFields, Rule
from opsnn_quant.policy.schema import PrecisionPolicy
from opsnn_quant.types import Precision
from tests.policy._factory import linear, other, report

GOLDEN = Path(__file__).parent / "golden"


class TextEnc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(self.norm(x))))


class DownBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.to_q = nn.Linear(8, 8)
        self.to_k = nn.Linear(8, 8)
        self.softmax = nn.Softmax(-1)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.to_q(t) @ self.to_k(t).transpose(1, 2)) @ t


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.ModuleList([DownBlock()])
        self.attn = Attn()
        self.out = nn.Linear(8, 8)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        t = self.down[0](img).flatten(2).transpose(1, 2)
        return self.out(self.attn(t))


class GoldenNet(nn.Module):
    """The model of golden/policy.yaml: a text encoder and a small UNet-like denoiser."""

    def __init__(self) -> None:
        super().__init__()
        self.te = TextEnc()
        self.unet = UNet()

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.te(x), self.unet(img)


@pytest.fixture(scope="module")
def policy() -> PrecisionPolicy:
    return PrecisionPolicy.load(GOLDEN / "policy.yaml")


@pytest.fixture(scope="module")
def modules() -> dict[str, str]:
    return modules_from_model(GoldenNet())


# (format, golden file, export keyword arguments)
CASES = [
    ("amct-cfg", "amct.cfg", {"batch_num": 4}),
    ("amct-eager", "amct_eager.json", {"batch_num": 4}),
    ("atc-keep-dtype", "atc_keep_dtype.cfg", {}),
    ("atc-keep-dtype", "atc_keep_dtype_nodes.cfg", {"node_map": "nodes.json"}),
    ("atc-customize-dtypes", "atc_customize_dtypes.cfg", {}),
    ("atc-modify-mixlist", "atc_modify_mixlist.json", {"op_types": {"GroupNorm": "GroupNorm"}}),
]


@pytest.mark.parametrize(("fmt", "golden", "kwargs"), CASES, ids=[c[1] for c in CASES])
def test_golden(policy, modules, fmt, golden, kwargs, tmp_path):
    if "node_map" in kwargs:
        kwargs = {**kwargs, "node_map": load_node_map(GOLDEN / kwargs["node_map"])}
    result = export_policy(policy, fmt, modules, **kwargs)
    written = write_export(result, tmp_path / golden)
    assert written[0].read_bytes() == (GOLDEN / golden).read_bytes()


def test_notes_say_what_was_left_out(policy, modules):
    cfg = export_policy(policy, "amct-cfg", modules)
    assert "unet.attn.to_q: w8a8_dynamic has no AMCT PTQ (static) form; left float" in cfg.notes
    assert cfg.comments and all(f"# {n}" in cfg.text for n in cfg.notes)
    eager = export_policy(policy, "amct-eager", modules)
    assert "unet.down.0.conv (Conv2d): exported for Linear only; left float" in eager.notes
    assert any("unet.attn.to_k" in n and "another scheme" in n for n in eager.notes)
    keep = export_policy(policy, "atc-keep-dtype", modules)
    assert keep.notes[0].startswith("node names: derived for torch.onnx.export(dynamo=False")
    mapped = export_policy(
        policy, "atc-keep-dtype", modules, node_map=load_node_map(GOLDEN / "nodes.json")
    )
    assert mapped.notes[0].startswith("node names: from the node map")
    mix = export_policy(policy, "atc-modify-mixlist", modules)
    assert json.loads(mix.text) == {"black-list": {"to-add": []}}
    assert "no Ascend IR OpType is known for GroupNorm" in mix.notes[0]


def test_notes_sidecar_for_comment_less_formats(policy, modules, tmp_path):
    result = export_policy(policy, "atc-keep-dtype", modules)
    paths = write_export(result, tmp_path / "keep.cfg")
    assert [p.name for p in paths] == ["keep.cfg", "keep.cfg.notes.txt"]
    assert "#" not in paths[0].read_text()  # ATC reads every non-empty line as a node name


def test_derived_names_exist_in_a_torchscript_onnx_export(tmp_path, policy, modules):
    onnx = pytest.importorskip("onnx")
    model = GoldenNet().eval()
    path = tmp_path / "golden.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.randn(2, 5, 16), torch.randn(1, 4, 4, 4)), str(path),
            dynamo=False, opset_version=17,
        )  # fmt: skip
    graph = {n.name: n for n in onnx.load(str(path)).graph.node}
    keep = export_policy(policy, "atc-keep-dtype", modules).text.split()
    custom = [
        line.split("::")[0]
        for line in export_policy(policy, "atc-customize-dtypes", modules).text.split()
    ]
    assert keep and custom
    for name in keep + custom:
        assert name in graph, name
    # the dtype counts of the table match the exported nodes
    for line in export_policy(policy, "atc-customize-dtypes", modules).text.split():
        node, spec = line.split("::")
        ins = spec.split("OutputDtype:")[0].removeprefix("InputDtype:").strip(",").split(",")
        assert len(ins) == sum(1 for i in graph[node].input if i)


def test_torch_scope_rules():
    kinds = {"enc": "Mid", "enc.layers": "ModuleList", "enc.layers.0": "Inner", "enc.seq": "Sequential",
             "enc.d": "ModuleDict"}  # fmt: skip
    assert torch_scope("enc.layers.0.fc", kinds) == "/enc/layers.0/fc"
    assert torch_scope("enc.seq.0", kinds) == "/enc/seq/seq.0"
    assert torch_scope("enc.d.a", kinds) == "/enc/a"
    assert torch_scope("blocks.3.attn", {}) == "/blocks.3/attn"  # unknown types: list assumed


def test_eager_skip_substring_clash_leaves_the_module_float():
    # AMCT skips a layer when a skip entry is a substring of its name: "up" would also skip
    # "up2", so up2 cannot stay int8 next to a float "up".
    rep = report(linear("up", 1e-5), linear("up2", 1e-5), linear("down", 1e-5))
    p = PrecisionPolicy(model="m", target="cpu-reference",
                        rules=[Rule(match="up", precision=Precision.FP16), Rule(match="*", precision=Precision.W8A8)])  # fmt: skip
    result = export_policy(p, "amct-eager", rep.inventory())
    cfg = json.loads(result.text)
    assert cfg["skip_layers"] == ["up", "up2"]
    assert "up2: a skip_layers entry is a substring of its name; left float" in result.notes


def test_bad_exports(policy, modules):
    with pytest.raises(ConfigError, match="unknown export format 'om'; choose one of amct-cfg"):
        export_policy(policy, "om", modules)
    with pytest.raises(ConfigError, match="module inventory is empty"):
        export_policy(policy, "amct-cfg", {})
    with pytest.raises(
        ConfigError, match=r"rule 0 \(fp32 on 'unet.down.0.norm'\) matches no module"
    ):
        export_policy(policy, "amct-cfg", {"te.fc1": "Linear"})


def test_cli_export(tmp_path, policy):
    import typer

    from opsnn_quant.cli.policy import register

    rep = report(
        other("te.norm", "LayerNorm", modality="text_encoder"),
        linear("te.fc1", 1e-5, modality="text_encoder"),
        other("unet.down.0.norm", "GroupNorm"),
        linear("unet.attn.to_q", 1e-5), linear("unet.attn.to_k", 1e-5),
        linear("unet.down.0.conv", 1e-5, type_="Conv2d"), linear("unet.out", 1e-5),
    )  # fmt: skip
    policy.save(tmp_path / "policy.yaml")
    rep.save(tmp_path / "probe.json")
    app = typer.Typer()
    register(app)
    out = tmp_path / "export" / "keep.cfg"
    res = CliRunner().invoke(
        app,
        ["policy", "export", str(tmp_path / "policy.yaml"), "-f", "atc-keep-dtype", "-o", str(out)],
    )
    assert res.exit_code == 0, res.output
    assert (
        out.read_text() == (GOLDEN / "atc_keep_dtype.cfg").read_text()
    )  # same names from probe.json
    res = CliRunner().invoke(app, ["policy", "show", str(tmp_path / "policy.yaml")])
    assert res.exit_code == 0 and "denoiser" in res.output
    res = CliRunner().invoke(
        app, ["policy", "export", str(tmp_path / "policy.yaml"), "-f", "x", "-o", str(out)]
    )
    assert isinstance(res.exception, ConfigError)


def test_eager_groups_ignore_the_observer_but_say_so():
    rep = report(linear("a", 1e-5), linear("b", 1e-5))
    p = PrecisionPolicy(
        model="m",
        target="cpu-reference",
        rules=[
            Rule(match="a", precision=Precision.W8A8, quant=QuantFields(observer="mse")),
            Rule(match="b", precision=Precision.W8A8),
        ],
    )
    result = export_policy(p, "amct-eager", rep.inventory())
    assert json.loads(result.text)["skip_layers"] == []
    assert result.notes == (
        "observer other than minmax on a: AMCT calibrates them with its algorithm",
    )
