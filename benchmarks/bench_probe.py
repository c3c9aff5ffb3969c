"""Cost and fidelity of the end-to-end attribution estimator, and the memory of probing.

For each model (the zoo's shapes UNet; Whisper tiny.en encoder and decoder) it runs the probe with
the exhaustive one-module-at-a-time reference switched on and prints, side by side from the same
run: the estimator's cost in forward-equivalents (wall time of the estimator pass over the wall
time of a plain float replay of the same recorded calls) and seconds, the same for the exhaustive
method, and the Spearman rank correlation of the two attributions. Goal: >= 0.8 at <= 3
forward-equivalents. That run scores each module's locally best scheme only
(``e2e_schemes="best"``); a second probe scores every candidate scheme (``"all"``, the default
that ``calibrate`` uses) and its cost is printed beside.

Memory: in child processes, peak RSS (VmHWM) of loading + an fp32 inference over the calibration
batch, against loading + probing the same batch; printed as the ratio and as the increments over
the RSS after loading. Goal: probing <= 1.5x the fp32 inference.

Run: ``python benchmarks/bench_probe.py [--limit N] [--models shapes-t2i,whisper-tiny.en]``.
Backend: cpu (PyTorch eager fp32 + the exact Ascend int8 reference).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import torch

MODELS = {
    "shapes-t2i": (
        "diffusers-sd",
        "zoo:shapes-t2i",
        "zoo:shapes/calibration",
        {"steps": 10, "batch_size": 4},
    ),
    "whisper-tiny.en": (
        "whisper",
        "zoo:whisper-tiny.en",
        "zoo:speech/calibration",
        {"batch_size": 4, "max_new_tokens": 32},
    ),
}
# ProbeConfig.estimator_batch as in the model's recipe (calibrate/*.yaml).
ESTIMATOR_BATCH = {"shapes-t2i": None, "whisper-tiny.en": {"audio_encoder": 1}}


def spearman(a: list[float], b: list[float]) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def child(mode: str, name: str, limit: int) -> None:
    """Load, then infer or probe; print JSON with RSS figures."""
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.probe.api import ProbeConfig, probe

    family, source, data, settings = MODELS[name]
    adapter = load_adapter(family, source, **settings)
    records = load_records(data, limit)
    loop = adapter.forward_loop(records)
    loaded = _rss_kb("VmRSS")
    t0 = time.perf_counter()
    if mode == "infer":
        with torch.no_grad():
            loop(adapter.model)
    else:
        probe(
            adapter,
            loop,
            ProbeConfig(max_root_calls=4, estimator_batch=ESTIMATOR_BATCH[name]),
        )
    print(
        json.dumps(
            {"loaded_kb": loaded, "peak_kb": _rss_kb("VmHWM"), "seconds": time.perf_counter() - t0}
        )
    )


def fidelity(name: str, limit: int) -> list[tuple[str, ...]]:
    """Rows of the estimator-vs-exhaustive table for one model."""
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.probe.api import ProbeConfig, probe

    family, source, data, settings = MODELS[name]
    adapter = load_adapter(family, source, **settings)
    records = load_records(data, limit)
    report = probe(
        adapter,
        adapter.forward_loop(records),
        ProbeConfig(
            exhaustive=True,
            max_root_calls=4,
            fp16=False,
            e2e_schemes="best",
            estimator_batch=ESTIMATOR_BATCH[name],
        ),
    )
    every = probe(
        adapter,
        adapter.forward_loop(records),
        ProbeConfig(
            max_root_calls=4, fp16=False, e2e_schemes="all", estimator_batch=ESTIMATOR_BATCH[name]
        ),
    ).costs
    rows = []
    for modality in report.modalities:
        mods = [
            m
            for m in report.by_modality(modality)
            if m.e2e is not None and m.e2e.exhaustive is not None
        ]
        if len(mods) < 3:
            continue
        rho = spearman([m.e2e.contribution for m in mods], [m.e2e.exhaustive for m in mods])
        c = report.costs
        rows.append(
            (
                name,
                modality,
                str(len(mods)),
                f"{c[f'{modality}_estimator_forward_equivalents']:.2f}",
                f"{c[f'{modality}_estimator_seconds']:.1f}",
                f"{every[f'{modality}_estimator_forward_equivalents']:.2f}",
                f"{c[f'{modality}_exhaustive_forward_equivalents']:.1f}",
                f"{c[f'{modality}_exhaustive_seconds']:.1f}",
                f"{rho:.3f}",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--child", nargs=2, metavar=("MODE", "MODEL"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.child[0], args.child[1], args.limit)
        return
    names = args.models.split(",")
    header = (
        "model",
        "modality",
        "modules",
        "est fwd-eq",
        "est s",
        "all-schemes fwd-eq",
        "exh fwd-eq",
        "exh s",
        "spearman",
    )
    rows = [r for n in names for r in fidelity(n, args.limit)]
    widths = (
        [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        if rows
        else [len(h) for h in header]
    )
    print("End-to-end attribution: estimator vs exhaustive (backend: cpu)")
    print(" | ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print(" | ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))
    print("\nPeak memory (VmHWM, child processes, same calibration batch)")
    print(
        f"{'model':>16} | {'infer peak MB':>13} | {'probe peak MB':>13} | {'ratio':>5} | {'infer +MB':>9} | {'probe +MB':>9}"
    )
    for n in names:
        res = {}
        for mode in ("infer", "probe"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    n,
                    "--limit",
                    str(args.limit),
                    "--threads",
                    str(args.threads),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        i, p = res["infer"], res["probe"]
        print(
            f"{n:>16} | {i['peak_kb'] / 1024:13.0f} | {p['peak_kb'] / 1024:13.0f} | {p['peak_kb'] / i['peak_kb']:5.2f} | "
            f"{(i['peak_kb'] - i['loaded_kb']) / 1024:9.0f} | {(p['peak_kb'] - p['loaded_kb']) / 1024:9.0f}"
        )


if __name__ == "__main__":
    main()
