"""The composition root: builds every app (embedded, embedded over Slurm, Google Cloud, the
twin) from one builder (``builder.build_deps``) and hands the routes to the buses."""
