"""Training behind `draftline train`: the corpus (stdlib and dependency sources, held-out split) and the trainer.

Never imported by the server."""
