"""Makes the ONNX files in this folder with the real converters that wrote them; the tests read the files
(tensorflow and paddlepaddle do not share a virtual environment with torch). Each runs in a venv of its own:

    python3.11 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu==2.21.0 tf2onnx==1.17.0
    /tmp/tfenv/bin/python tests/files/make_converted.py tf2onnx
    python3.11 -m venv /tmp/pdenv && /tmp/pdenv/bin/pip install paddlepaddle==3.3.1 paddle2onnx==2.1.0 packaging onnx
    /tmp/pdenv/bin/python tests/files/make_converted.py paddle2onnx
    python3.11 -m venv /tmp/pdenv1 && /tmp/pdenv1/bin/pip install paddlepaddle==2.6.2 paddle2onnx==1.0.8 six
    /tmp/pdenv1/bin/python tests/files/make_converted.py paddle2onnx_db_head

* ``tf2onnx_shared_conv.onnx``: a ``tf.function`` applying one Conv2D kernel and bias nine times (tf2onnx
  shares the kernel and the bias between the nine ``Conv`` nodes it writes); the fifth reads its input scaled
  by 3000, beyond float16's range, and its output is scaled back.
* ``paddle2onnx_bn.onnx``: Conv2D -> BatchNorm2D -> ReLU -> pool; channel 2 of the Conv weight x2000 and of the
  BatchNorm's running variance 9.8e7 (beyond float16's range).
* ``paddle2onnx_db_head.onnx``: a DB text-detection head as paddle2onnx 1.0 writes it (every parameter an unnamed
  ``Constant`` node, as in RapidOCR's ``ch_PP-OCRv4_det_infer.onnx``); the head's BatchNormalization has a running
  variance of 9.8e7 on one channel, and the plain float16 file's probability map saturates.
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


def paddle2onnx_db_head() -> None:
    """PaddleOCR's DB head (Conv -> BatchNorm+ReLU -> Conv2DTranspose -> BatchNorm+ReLU -> Conv2DTranspose -> Sigmoid)
    over a two-Conv backbone, input ``x: ?x3x?x?`` (run at 1x3x32x32), written by paddle2onnx 1.0.8 at opset 12.

    paddle2onnx 1.x (1.0.8 to 1.3.1 alike) writes every parameter, BatchNormalization's four statistics included,
    as a ``Constant`` node with an empty name and no initializers, as RapidOCR's ``ch_PP-OCRv4_det_infer.onnx`` has
    them (that file's IR version 8, graph name "Model from PaddlePaddle." and ``p2o.DynamicDimension.N`` dims are
    1.0.8 to 1.2.2's; 2.x writes initializers). paddle2onnx 1.x reads the ``.pdmodel`` that paddlepaddle 2.6
    saves; paddlepaddle 3 saves a PIR ``.json`` it cannot read (it writes an empty file and exits 0). Its own venv::

        python3.11 -m venv /tmp/pdenv1 && /tmp/pdenv1/bin/pip install paddlepaddle==2.6.2 paddle2onnx==1.0.8 six
        /tmp/pdenv1/bin/python tests/files/make_converted.py paddle2onnx_db_head

    Running statistics are the per-channel mean and variance of the layer's input over 16 standard-normal
    images, except the head BatchNorm's channel 2: its Conv channel is scaled by 4000 (values up to ~1e4, as the
    detector's reach ~5e3 on such inputs) and its variance set to 9.8e7, the detector's (float16 ends at 65504;
    onnxconverter-common clamps it to 1e4). The last bias is -6: on 1x3x32x32 standard-normal inputs the float32
    map stays below 0.1, while the plain float16 file's saturates at 1.0 on ~5% of its pixels.
    """
    import shutil
    import tempfile

    import paddle

    paddle.seed(0)
    rng = np.random.default_rng(0)
    nn = paddle.nn

    class Head(nn.Layer):  # PaddleOCR's DBHead (ppocr/modeling/heads/det_db_head.py)
        def __init__(self, c_in, c):
            super().__init__()
            self.conv1 = nn.Conv2D(c_in, c, 3, padding=1, bias_attr=False)
            self.conv_bn1 = nn.BatchNorm(c, act="relu")
            self.conv2 = nn.Conv2DTranspose(c, c, 2, stride=2)
            self.conv_bn2 = nn.BatchNorm(c, act="relu")
            self.conv3 = nn.Conv2DTranspose(c, 1, 2, stride=2)

        def forward(self, x):
            return paddle.nn.functional.sigmoid(self.conv3(self.conv_bn2(self.conv2(self.conv_bn1(self.conv1(x))))))

    class Net(nn.Layer):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2D(3, 8, 3, stride=2, padding=1)
            self.stem_bn = nn.BatchNorm2D(8)
            self.body = nn.Conv2D(8, 16, 3, stride=2, padding=1)
            self.head = Head(16, 8)

        def backbone(self, x):
            relu = paddle.nn.functional.relu  # forward's code is rewritten by paddle: no `nn` from the closure
            return relu(self.body(relu(self.stem_bn(self.stem(x)))))

        def forward(self, x):
            return self.head(self.backbone(x))

    def fit(bn, x):  # running statistics as training leaves them
        v = x.numpy()
        bn._mean.set_value(v.mean(axis=(0, 2, 3)).astype(np.float32))
        bn._variance.set_value(v.var(axis=(0, 2, 3)).astype(np.float32))

    net = Net()
    net.eval()
    head = net.head
    calib = paddle.to_tensor(rng.standard_normal((16, 3, 32, 32)).astype(np.float32))
    fit(net.stem_bn, net.stem(calib))
    h = net.backbone(calib)
    w = head.conv1.weight.numpy()
    w[2] *= 4000
    head.conv1.weight.set_value(w)
    fit(head.conv_bn1, head.conv1(h))
    var = head.conv_bn1._variance.numpy()
    var[2] = 9.8e7
    head.conv_bn1._variance.set_value(var)
    fit(head.conv_bn2, head.conv2(head.conv_bn1(head.conv1(h))))
    head.conv3.bias.set_value(np.array([-6.0], np.float32))
    with tempfile.TemporaryDirectory() as tmp:  # paddle leaves its static model in the output's folder
        paddle.onnx.export(net, str(Path(tmp) / "paddle2onnx_db_head"), opset_version=12,
                           input_spec=[paddle.static.InputSpec([None, 3, None, None], "float32", "x")])
        shutil.copyfile(Path(tmp) / "paddle2onnx_db_head.onnx", HERE / "paddle2onnx_db_head.onnx")


if __name__ == "__main__":
    {"tf2onnx": tf2onnx_shared_conv, "paddle2onnx": paddle2onnx_bn,
     "paddle2onnx_db_head": paddle2onnx_db_head}[sys.argv[1]]()
