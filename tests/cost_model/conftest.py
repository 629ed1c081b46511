"""Tests of the cost model (autosched/cost_model): features of lowered loop IR and the
XGBoost ranking model. No fixtures beyond the root conftest's."""
