"""The auto-scheduler: tasks, sketches, annotation, evolutionary search, measurement, records."""
