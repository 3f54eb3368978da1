"""Makes the ONNX files in this folder with the real converters that wrote them; the tests read the files
(tensorflow and paddlepaddle do not share a virtual environment with torch). Each runs in a venv of its own:

    python3.11 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu==2.21.0 tf2onnx==1.17.0
    /tmp/tfenv/bin/python tests/files/make_converted.py tf2onnx
    python3.11 -m venv /tmp/pdenv && /tmp/pdenv/bin/pip install paddlepaddle==3.3.1 paddle2onnx==2.1.0 packaging onnx
    /tmp/pdenv/bin/python tests/files/make_converted.py paddle2onnx

* ``tf2onnx_shared_conv.onnx``: a ``tf.function`` applying one Conv2D kernel and bias nine times (tf2onnx
  shares the kernel and the bias between the nine ``Conv`` nodes it writes); the fifth reads its input scaled
  by 3000, beyond float16's range, and its output is scaled back.
* ``paddle2onnx_bn.onnx``: Conv2D -> BatchNorm2D -> ReLU -> pool; channel 2 of the Conv weight x2000 and of the
  BatchNorm's running variance 9.8e7 (beyond float16's range).
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def tf2onnx_shared_conv() -> None:
    import tensorflow as tf
    import tf2onnx

    rng = np.random.default_rng(0)
    w = tf.Variable((rng.standard_normal((3, 3, 4, 4)) * 0.3).astype(np.float32), name="conv/kernel")
    b = tf.Variable((rng.standard_normal(4) * 0.1).astype(np.float32), name="conv/bias")

    def conv(h):
        return tf.nn.bias_add(tf.nn.conv2d(h, w, 1, "SAME"), b)

    @tf.function(input_signature=[tf.TensorSpec((1, 8, 8, 4), tf.float32, name="x")])
    def model(x):
        h = x
        for k in range(8):
            h = tf.nn.relu(conv(h))
            if k == 3:
                h = conv(h * 3000.0) / 3000.0
        return tf.reduce_mean(h, axis=[1, 2])

    tf2onnx.convert.from_function(model, input_signature=model.input_signature, opset=13,
                                  output_path=str(HERE / "tf2onnx_shared_conv.onnx"))


def paddle2onnx_bn() -> None:
    import paddle

    paddle.seed(0)

    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
            self.bn = paddle.nn.BatchNorm2D(8)
            self.pool = paddle.nn.AdaptiveAvgPool2D(1)

        def forward(self, x):
            return paddle.flatten(self.pool(paddle.nn.functional.relu(self.bn(self.conv(x)))), 1)

    net = Net()
    net.eval()
    w = net.conv.weight.numpy()
    w[2] *= 2000
    net.conv.weight.set_value(w)
    var = np.full(8, 4.0, np.float32)
    var[2] = 9.8e7
    net.bn._variance.set_value(var)
    net.bn._mean.set_value((np.random.default_rng(0).standard_normal(8) * 100).astype(np.float32))
    paddle.onnx.export(net, str(HERE / "paddle2onnx_bn"), opset_version=13,
                       input_spec=[paddle.static.InputSpec([1, 3, 16, 16], "float32", "x")])


if __name__ == "__main__":
    {"tf2onnx": tf2onnx_shared_conv, "paddle2onnx": paddle2onnx_bn}[sys.argv[1]]()
