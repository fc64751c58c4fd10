"""LSP-level benchmarks behind `draftline bench scenarios|context|lsp` (never imported by the server)."""
