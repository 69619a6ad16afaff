"""The training kit: layers (:mod:`.nn`), optimizers (:mod:`.optim`) and data-parallel all-reduces
(:mod:`.distributed`). Public paths: ``arrayrnn.nn``, ``arrayrnn.optim``, ``arrayrnn.distributed``."""
