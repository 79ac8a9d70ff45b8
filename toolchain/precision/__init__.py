"""Precision passes on ONNX graphs: FP16 casting (fp16.py), INT8 Q/DQ (int8.py), calibration data and ranges
(calibration.py). :func:`toolchain.quantize.quantize_onnx` drives them."""
