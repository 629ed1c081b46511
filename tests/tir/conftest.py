"""Tests of the loop IR toolbox (autosched/tir): the integer arithmetic analyzer, exact
simplified forms and randomized soundness against Python integers. No fixtures beyond the
root conftest's."""
