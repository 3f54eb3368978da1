"""The bridge between PyTorch and ONNX: export with taps, layer-by-layer compare."""
