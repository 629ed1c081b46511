"""Cost model: features of lowered loop IR and an XGBoost ranking model.

Example::

    from autosched.cost_model import XGBModel, extract_features
    x = extract_features(task.lower(sch), task.target)   # (n_stores, N_FEATURES)
    model = XGBModel().fit([x, ...], throughputs, groups=[task.workload_key, ...])
"""

from autosched.cost_model.features import (
    FEATURE_NAMES,
    N_FEATURES,
    extract_features,
    extract_features_batch,
)
from autosched.cost_model.random_model import RandomModel
from autosched.cost_model.xgb_model import XGBModel, warm_start_from_records

__all__ = ["FEATURE_NAMES", "N_FEATURES", "RandomModel", "XGBModel", "extract_features",
           "extract_features_batch", "warm_start_from_records"]
