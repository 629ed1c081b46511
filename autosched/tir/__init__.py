"""The loop IR (tir): what lowering produces and every backend consumes.

``ir`` holds the statement nodes (expressions are te's), ``visit`` the one toolbox of walkers and
mappers over statements, ``printer`` the text form, ``arith`` the integer simplifier and prover.
Nothing here knows about schedules or targets.
"""
