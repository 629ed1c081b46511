"""The loop IR (tir): what lowering produces and every backend consumes.

``ir`` holds the statement nodes (expressions are te's, their ops ``te.opcodes.Op``), ``visit``
the one toolbox of walkers, mappers and queries over statements, ``evaluate`` integer
evaluation of index expressions, ``printer`` the text form, ``arith`` the integer simplifier
and prover. Nothing here knows about schedules or targets.
"""
