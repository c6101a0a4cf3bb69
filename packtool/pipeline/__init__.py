"""``packtool pack``: read -> encode -> plan -> write (``run_pack``; see ``pipeline.run``).

Modules, in the order a run uses them: ``identity`` (run_id, resume stamps), ``output`` (the atomic,
locked output directory), ``encode`` (chunks of records -> encoded chunks, by the engine), ``chunks``
(the scratch store of encoded samples), ``write`` (plan slices -> shards, by the engine), ``summary`` (the
manifest), ``engines`` (who runs the tasks: local processes or Ray).
"""

from packtool.pipeline.run import run_pack

__all__ = ["run_pack"]
