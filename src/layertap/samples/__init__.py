"""Samples: read from where users keep them, drawn at random, saved (numpy + Pillow, never torch).

``sources`` reads samples (image folders, ``.npy``/``.npz`` folders, Hugging Face ``datasets``
folders, Python iterables) and their labels, ``images`` preprocesses images; ``loading`` reads
``--inputs`` and writes ``--save-inputs``; ``drawn`` turns ``args``/``samples`` into the samples
given plus how many to draw, and draws them for a file's declared inputs; ``declared`` fits samples
to a file's declared inputs. ``compare --inputs``, ``fix --inputs``/``--calib`` and ``extract
--data`` all read through them.
"""
