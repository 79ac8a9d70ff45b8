#!/usr/bin/env bash
# Gate a model in CI: make FP16 and INT8 versions of an exported classifier and fail the job (exit 1) when either
# disagrees with the FP32 model beyond the per-precision thresholds. Usage:
#     examples/ci_gate.sh MODEL.onnx CALIB_VIDEO_OR_FOLDER CHECK_DATA [DEVICE]
# Writes MODEL.fp16.onnx, MODEL.int8.onnx, validate.json and validate.html beside MODEL.
set -euo pipefail
model=$1 calib=$2 check=$3 device=${4:-cpu}
dir=$(dirname "$model") stem=$(basename "$model" .onnx)
trtc quantize "$model" --precision fp16 --check "$check" --device "$device" --force
trtc quantize "$model" --precision int8 --calib "$calib" --target-agreement 0.97 --device "$device" --force
trtc validate --reference "$model" --candidate "$dir/$stem.fp16.onnx" --candidate "$dir/$stem.int8.onnx" \
    --data "$check" --device "$device" --json "$dir/validate.json" --html "$dir/validate.html"
