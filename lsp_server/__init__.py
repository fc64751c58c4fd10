"""draftline's LSP server: protocol handlers, scheduling, completion pipeline and the CLI."""
