"""Tests of the schedule layer (autosched/schedule): every primitive, overhanging splits and
TVM-tutorial schedules, through each backend of ``--targets`` that builds a schedule
(``CPU_TARGETS``), with the loop nests they make and their replay from JSON. No fixtures
beyond the root conftest's."""
