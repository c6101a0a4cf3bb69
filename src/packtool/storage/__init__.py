"""Storage: every open, list, stat, write, rename and remove of inputs, scratch and outputs, on local disk or
in an object store (``s3://``, ``gs://``, ``az://``, ... through fsspec), in one place.

* ``storage.urls``: what a URL is, the filesystem that serves it (``--storage-options``), and the one-line
  errors a store's failures become;
* ``storage.files``: a path or a URL, read: open, stat (a stamp that tells a changed file), list, glob;
* ``storage.folders``: a folder, local or remote, written: files put whole, listed, removed; the run lock;
* ``storage.scratch``: a run's scratch kept on local disk and mirrored to a store, so that a run resumes on
  any machine and workers on nodes that share no filesystem meet there;
* ``storage.outputs``: an output directory read through a bounded local cache when it is in a store.
"""
