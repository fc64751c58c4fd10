"""draftline's engine: models, KV caches, drafters, the speculative loop and prompt templates."""
