"""ONNX side: existing ONNX files (list tensors, map them to module paths, expose outputs, run). Never imports torch."""
