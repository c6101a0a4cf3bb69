"""Packing: sample lengths -> ``PackPlan``; no file I/O.

``planner.make_plan`` applies the long-sample policy and runs a strategy (``bfd``, ``sequential``,
``custom``); ``plan`` is the ``PackPlan``; ``options`` the stage's ``PackingOptions``. This file imports
nothing, so that reading the stage's options (``packtool pack --help``) does not import numpy.
"""
