"""``packtool pack``: read -> encode -> plan -> write; ``packtool.run_pack(config)`` runs it (``run``).

Modules, in the order a run uses them: ``identity`` (run_id, resume stamps), ``output`` (the atomic,
locked output directory), ``encode`` (chunks of records -> encoded chunks, by the engine), ``chunks``
(the scratch store of encoded samples), ``memory`` (the same held in memory, for pretokenized Parquet),
``write`` (plan slices -> shards, by the engine or the driver's threads), ``summary`` (the
manifest), ``engines`` (who runs the tasks: local processes or Ray). This file imports none of them: the
CLI starts the workers' forkserver (``engines.local``) before the heavy imports of ``run``.
"""
