"""Cost and fidelity of the end-to-end attribution estimators, and the memory of probing.

For each model (the zoo's shapes pipeline: text encoder, UNet, VAE decoder; Whisper tiny.en encoder
and decoder) three probes run on the same calibration batch and recorded root calls:

* the *diagonal* estimator (one forward + one backward; each module's measured per-channel noise
  power against its output gradient's per-channel energy; every scheme at no extra cost). This is
  the fast attribution estimator of the goal: >= 0.8 rank correlation at <= 3 forward-equivalents.
* the *structured* estimator scoring each module's locally best scheme (same forward + backward,
  plus each candidate's real output at gradient time), with the exhaustive one-module-at-a-time
  reference switched on: its ranks are the ground truth for both estimators.
* the structured estimator scoring every scheme (what ``calibrate`` runs; its cost is printed).

Forward-equivalents = estimator wall time / wall time of a plain float replay of the same calls.

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


def _probe_costs(name: str, limit: int, **config: object):
    from opsnn_quant.models import load_adapter
    from opsnn_quant.models.data import load_records
    from opsnn_quant.probe.api import ProbeConfig, probe

    family, source, data, settings = MODELS[name]
    adapter = load_adapter(family, source, **settings)
    records = load_records(data, limit)
    cfg = ProbeConfig(max_root_calls=4, fp16=False, estimator_batch=ESTIMATOR_BATCH[name], **config)  # type: ignore[arg-type]
    return probe(adapter, adapter.forward_loop(records), cfg)


def _fwd_eq(costs: dict[str, float], modality: str, unit: float) -> str:
    """A run's estimator seconds in float replays of ``unit`` seconds."""
    return f"{costs[f'{modality}_estimator_seconds'] / unit:.2f}"


def fidelity(name: str, limit: int) -> list[tuple[str, ...]]:
    """Rows of the estimators-vs-exhaustive table for one model."""
    structured = _probe_costs(name, limit, exhaustive=True, e2e_schemes="best")
    diagonal = _probe_costs(name, limit, estimator="diagonal", e2e_schemes="all")
    every = _probe_costs(name, limit, e2e_schemes="all").costs
    rows = []
    for modality in structured.modalities:
        mods = [
            m
            for m in structured.by_modality(modality)
            if m.e2e is not None and m.e2e.exhaustive is not None
        ]
        if len(mods) < 3:
            continue
        exh = {m.name: m.e2e.exhaustive for m in mods}
        diag = {m.name: m.e2e.contribution for m in diagonal.by_modality(modality) if m.e2e}
        names = sorted(exh)
        rho_s = spearman([m.e2e.contribution for m in mods], [m.e2e.exhaustive for m in mods])
        rho_d = spearman([diag[n] for n in names], [exh[n] for n in names])
        c, d = structured.costs, diagonal.costs
        # One unit for the three runs: the float replay the exhaustive run times (the others
        # take the output energy from the estimator's own forward and time no replay).
        unit = c[f"{modality}_forward_seconds"]
        total = sum(exh.values())
        rows.append(
            (
                name,
                modality,
                str(len(mods)),
                _fwd_eq(d, modality, unit),
                f"{d[f'{modality}_estimator_seconds']:.1f}",
                f"{rho_d:.3f}",
                f"{sum(diag[n] for n in names) / total:.2f}",
                _fwd_eq(c, modality, unit),
                f"{rho_s:.3f}",
                f"{sum(m.e2e.contribution for m in mods) / total:.2f}",
                _fwd_eq(every, modality, unit),
                f"{c[f'{modality}_exhaustive_forward_equivalents']:.1f}",
                f"{c[f'{modality}_exhaustive_seconds']:.1f}",
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
        "diag fwd-eq",
        "diag s",
        "diag rho",
        "diag sum/exh",
        "struct fwd-eq",
        "struct rho",
        "struct sum/exh",
        "struct-all fwd-eq",
        "exh fwd-eq",
        "exh s",
    )
    rows = [r for n in names for r in fidelity(n, args.limit)]
    widths = (
        [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        if rows
        else [len(h) for h in header]
    )
    print(
        "End-to-end attribution: estimators vs the exhaustive one-module-at-a-time reference "
        "(backend: cpu; fwd-eq = wall time / a float forward replay of the same calls; rho = "
        "Spearman rank correlation; sum/exh = summed contributions / summed exhaustive)"
    )
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
