"""Samples read from where users keep them (numpy only): image folders, ``.npy``/``.npz`` folders,
Hugging Face ``datasets`` folders and Python iterables, with the image preprocessing they need.

``sources`` reads samples (and their labels), ``images`` preprocesses images. Both ``compare
--inputs`` and ``extract --data`` read through them.
"""
