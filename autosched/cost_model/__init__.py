"""Cost model: features of lowered loop IR and an XGBoost ranking model."""
