"""Samples: read from where users keep them, drawn at random, saved (numpy + Pillow, never torch).

``for_reference`` is the one entry point: :func:`~.for_reference.samples_for` gives ``compare``, ``fix``,
``repro``, ``export --calib`` and ``extract --data`` their samples for a reference, in one form
(:class:`~.for_reference.Samples`). Beneath it, ``sources`` reads samples (image folders, ``.npy``/``.npz``
folders, Hugging Face ``datasets`` folders, Python iterables) and their labels, ``images`` preprocesses
images; ``loading`` reads ``--inputs`` and writes ``--save-inputs``; ``drawn`` turns ``args``/``samples``
into the samples given plus how many to draw, and draws them for a file's declared inputs; ``declared``
fits samples to a file's declared inputs.
"""
