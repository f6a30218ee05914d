"""Training pipelines: the model upload when a pipeline's job ends, and the Model Registry."""
