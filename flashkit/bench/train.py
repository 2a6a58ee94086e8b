"""Issue 12's training run: a small random Llama trained on a fixed synthetic token stream with
attn_implementation="flashkit" and with "sdpa", from the same weights on the same batches.

Reports the two losses and their relative difference at every 50th step, the tokens/s of the whole training
step (forward + backward + AdamW step, CUDA-synchronized, warm-up steps excluded) and a verdict against the
issue's targets: losses within 1% at every 50th step, flashkit's tokens/s at least sdpa's.
    python3 -m flashkit.bench.train [--steps 300] [--batch 8] [--seqlen 2048] [--device cuda] [--json PATH]
On the CPU (--device cpu, float32) only the sdpa run happens: flashkit needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any, Sequence

from .llama import SMALL_LLAMA, TINY_LLAMA, MarkovStream, same_weight_models

FLASHKIT, SDPA = "flashkit", "sdpa"
EVERY = 50            # checkpoint spacing (steps)
LOSS_TOLERANCE = 0.01  # the bound on |loss_flashkit - loss_sdpa| / loss_sdpa at every checkpoint


@dataclass
class TrainSettings:
    """One run's knobs: both implementations get the same ones."""
    steps: int = 300
    batch: int = 8
    seqlen: int = 2048
    lr: float = 3e-4
    warmup: int = 5          # first steps left out of the timing (they still train)
    seed: int = 0
    period: int = 256        # the stream repeats every row's first `period` tokens (0: no repeat)
    device: str = "cuda"
    model: dict = field(default_factory=lambda: dict(SMALL_LLAMA))


@dataclass
class RunResult:
    """One implementation's run: losses[s] is the loss on batch s after s optimizer steps (0..steps)."""
    implementation: str
    losses: list[float]
    step_ms: list[float]     # every step's wall time, warm-up included
    warmup: int
    tokens_per_step: int

    @property
    def tokens_per_s(self) -> float | None:
        timed = self.step_ms[self.warmup:]
        return self.tokens_per_step * len(timed) / (sum(timed) / 1e3) if timed and sum(timed) > 0 else None


def train_run(model: Any, stream: MarkovStream, settings: TrainSettings, implementation: str) -> RunResult:
    """settings.steps AdamW steps of `model` on stream[0..steps-1], then the loss on stream[steps]."""
    import torch
    device = torch.device(settings.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    model.train()
    losses, step_ms = [], []
    for step in range(settings.steps):
        ids = stream[step].to(device)
        sync()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss.detach()))
    with torch.no_grad():
        ids = stream[settings.steps].to(device)
        losses.append(float(model(input_ids=ids, labels=ids).loss))
    return RunResult(implementation, losses, step_ms, min(settings.warmup, settings.steps),
                     settings.batch * settings.seqlen)


def checkpoints(steps: int, every: int = EVERY) -> list[int]:
    """0, every, 2 every, ..., and `steps` itself."""
    return sorted(set(range(0, steps + 1, every)) | {steps})


def relative_difference(got: float, want: float) -> float:
    """|got - want| / |want| (inf where want is 0 and got is not, or either is not finite)."""
    if not (math.isfinite(got) and math.isfinite(want)):
        return math.inf
    if want == 0:
        return 0.0 if got == 0 else math.inf
    return abs(got - want) / abs(want)


def compare(flashkit_losses: Sequence[float], sdpa_losses: Sequence[float], every: int = EVERY) -> list[dict]:
    """One row per checkpoint: the step, both losses, and their relative difference (against sdpa's)."""
    steps = min(len(flashkit_losses), len(sdpa_losses)) - 1
    return [{"step": s, FLASHKIT: flashkit_losses[s], SDPA: sdpa_losses[s],
             "rel_diff": relative_difference(flashkit_losses[s], sdpa_losses[s])} for s in checkpoints(steps, every)]


def verdict(rows: Sequence[dict], flashkit_tps: float | None, sdpa_tps: float | None,
            tolerance: float = LOSS_TOLERANCE) -> dict:
    """The issue's two targets: every checkpoint's rel_diff <= tolerance; flashkit tokens/s >= sdpa's."""
    worst = max((r["rel_diff"] for r in rows), default=math.inf)
    loss_ok = bool(rows) and worst <= tolerance
    speed = flashkit_tps / sdpa_tps if flashkit_tps and sdpa_tps else None
    speed_ok = speed is not None and speed >= 1.0
    return {"loss_ok": loss_ok, "worst_rel_diff": worst, "tolerance": tolerance, "speed_ok": speed_ok,
            "speedup": speed, "passed": loss_ok and speed_ok}


def run(settings: TrainSettings, implementations: Sequence[str] = (FLASHKIT, SDPA), log=print) -> dict:
    """Train each implementation from the same initial weights on the same stream; the results as a dict."""
    import torch
    device = torch.device(settings.device)
    impls = list(implementations)
    notes = []
    if device.type != "cuda" and FLASHKIT in impls:
        impls.remove(FLASHKIT)
        notes.append("flashkit needs a CUDA device: on the CPU only the sdpa run happens, and nothing is judged")
        log("note: " + notes[-1])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    stream = MarkovStream(vocab=settings.model["vocab_size"], batch=settings.batch, seqlen=settings.seqlen,
                          seed=settings.seed, period=settings.period)
    models = same_weight_models(impls, device, dtype, settings.seed, **settings.model)   # one set of weights
    runs = {}
    for name in impls:
        model = models.pop(0)   # dropped after its run: one trained model on the device at a time
        log(f"training {name}: {settings.steps} steps of {settings.batch} x {settings.seqlen} tokens on {device}")
        runs[name] = train_run(model, stream, settings, name)
        del model
    result = {"meta": meta(settings, dtype, stream), "notes": notes,
              "runs": {n: dict(asdict(r), tokens_per_s=r.tokens_per_s) for n, r in runs.items()}}
    if FLASHKIT in runs and SDPA in runs:
        rows = compare(runs[FLASHKIT].losses, runs[SDPA].losses)
        result["checkpoints"] = rows
        result["verdict"] = verdict(rows, runs[FLASHKIT].tokens_per_s, runs[SDPA].tokens_per_s)
    return result


def meta(settings: TrainSettings, dtype: Any, stream: MarkovStream) -> dict:
    import torch
    import transformers
    out = {"date": date.today().isoformat(), "settings": asdict(settings), "dtype": str(dtype).replace("torch.", ""),
           "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "stream_entropy": stream.entropy()}
    if settings.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(torch.device(settings.device))
    return out


def render(result: dict) -> str:
    """The checkpoint table, tokens/s of each run and the verdict, as text."""
    lines = []
    runs = result["runs"]
    rows = result.get("checkpoints")
    if rows:
        lines.append(f"{'step':>5}  {'flashkit':>9}  {'sdpa':>9}  {'rel diff':>9}")
        lines += [f"{r['step']:>5}  {r[FLASHKIT]:>9.4f}  {r[SDPA]:>9.4f}  {r['rel_diff']:>9.2%}" for r in rows]
    else:
        for name, r in runs.items():
            losses = r["losses"]
            lines.append(f"{name} loss: " + "  ".join(f"{s}: {losses[s]:.4f}" for s in checkpoints(len(losses) - 1)))
    for name, r in runs.items():
        tps, timed = r["tokens_per_s"], r["step_ms"][r["warmup"]:]
        ms = sorted(timed)[len(timed) // 2] if timed else float("nan")
        lines.append(f"{name}: {tps or 0:,.0f} tokens/s, median step {ms:.2f} ms ({len(timed)} timed steps)")
    v = result.get("verdict")
    if v:
        speed = f"{v['speedup']:.3f}x sdpa" if v["speedup"] else "n/a"
        lines.append(f"loss within {v['tolerance']:.0%} at every checkpoint: {'PASS' if v['loss_ok'] else 'FAIL'} "
                     f"(worst {v['worst_rel_diff']:.2%}); tokens/s at least sdpa's: "
                     f"{'PASS' if v['speed_ok'] else 'FAIL'} ({speed}); overall: {'PASS' if v['passed'] else 'FAIL'}")
    else:
        lines.append("verdict: not judged (both the flashkit and the sdpa run are needed)")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = TrainSettings()
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--seqlen", type=int, default=d.seqlen)
    ap.add_argument("--device", default=d.device, help="cuda (bf16, both runs) or cpu (float32, sdpa only)")
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--warmup", type=int, default=d.warmup, help="steps left out of the timing")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--period", type=int, default=d.period, help="rows repeat every PERIOD tokens (0: never)")
    ap.add_argument("--tiny", action="store_true", help="the tests' tiny Llama (hidden 256, 2 layers, GQA 4/2)")
    ap.add_argument("--json", default=None, help="write the results (losses at every step, timings) here")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.seqlen < 2:
        ap.error("--steps and --batch must be at least 1, --seqlen at least 2")
    import torch
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device answers torch: run on a GPU, or with --device cpu (float32, the sdpa run only)")
    settings = TrainSettings(steps=args.steps, batch=args.batch, seqlen=args.seqlen, lr=args.lr, warmup=args.warmup,
                             seed=args.seed, period=args.period, device=args.device,
                             model=dict(TINY_LLAMA if args.tiny else SMALL_LLAMA))
    result = run(settings)
    m = result["meta"]
    print(f"# {m.get('gpu', settings.device)}  torch {m['torch']}  transformers {m['transformers']}  {m['dtype']}  "
          f"lr {settings.lr}  stream entropy {m['stream_entropy']:.3f} nats")
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
